"""`mtp-cli serve`: the OpenAI-compatible server (the optional `serve` extra: fastapi + uvicorn)."""

from __future__ import annotations

import logging
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from mtp_cli.cli import gen_options as go
from mtp_cli.cli import options as opt
from mtp_cli.cli import render
from mtp_cli.cli.app import UserError, main
from mtp_cli.cli.llama_flags import chat_template, kv_and_sampling, llama_compat, load_of, placement
from mtp_cli.config import MAX_PARALLEL, LoadConfig
from mtp_cli.serve.reasoning import FORMATS as REASONING_FORMATS


@main.command()
@opt.model(
    required=False,
    help="Target GGUF [default: the demo model, with --temp 0 and --repeat-penalty 1.1 unless given].",
)
@opt.draft_model(help="MTP sidecar (--spec-type mtp) or draft model (--spec-type draft).")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    envvar="LLAMA_ARG_HOST",
    show_envvar=True,
    help="Address to listen on; several, comma-separated (127.0.0.1,::1), share the port.",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, envvar="LLAMA_ARG_PORT")
@click.option(
    "--api-key",
    "api_key",
    envvar="LLAMA_API_KEY",
    show_envvar=True,
    help="Require the key (`Authorization: Bearer KEY` or `x-api-key: KEY`) on every endpoint but /health.",
)
@click.option(
    "-a",
    "--alias",
    envvar="LLAMA_ARG_ALIAS",
    show_envvar=True,
    help="The model's name in the API [default: the file's name]; several, comma-separated, are all "
    "accepted and the first in sorted order is answered with.",
)
@click.option("--tags", default="", envvar="LLAMA_ARG_TAGS", help="Tags /v1/models lists, comma-separated.")
@click.option(
    "--cors-origins",
    "cors_origins",
    default="*",
    show_default=True,
    envvar="LLAMA_ARG_CORS_ORIGINS",
    help="Origins a browser may call from: *, localhost (a localhost origin only) or a comma-separated list.",
)
@click.option(
    "-n",
    "--n-predict",
    "n_predict",
    default=opt.DEFAULTS.n_predict,
    show_default=True,
    help="Tokens per request without max_tokens (-1: until end of text or a full context).",
)
@click.option(
    "-np",
    "--parallel",
    "n_parallel",
    type=click.IntRange(1, MAX_PARALLEL),
    default=LoadConfig.n_parallel,
    show_default=True,
    help="Slots: requests run at once, in one batched decode per step; the context (-c) is split among them.",
)
@click.option(
    "--embeddings",
    "--embedding",
    "embeddings",
    is_flag=True,
    envvar="LLAMA_ARG_EMBEDDINGS",
    help="Serve /v1/embeddings: the model's pooled embeddings, from a context of their own beside the generation's.",
)
@click.option(
    "--pooling",
    type=click.Choice(["mean", "cls", "last"]),
    default="mean",
    show_default=True,
    envvar="LLAMA_ARG_POOLING",
    help="How /v1/embeddings pools a text's rows into one vector.",
)
@click.option(
    "--metrics", is_flag=True, envvar="LLAMA_ARG_ENDPOINT_METRICS", help="Serve Prometheus metrics at /metrics."
)
@click.option(
    "--slots/--no-slots", default=True, show_default=True, envvar="LLAMA_ARG_ENDPOINT_SLOTS", help="Serve /slots."
)
@click.option("--props", "set_props", is_flag=True, envvar="LLAMA_ARG_ENDPOINT_PROPS", help="Take POST /props.")
@click.option(
    "--webui/--no-webui",
    "--ui/--no-ui",
    default=True,
    show_default=True,
    envvar="LLAMA_ARG_WEBUI",
    help="The chat page at /.",
)
@click.option(
    "--reasoning-format",
    "reasoning_format",
    type=click.Choice(REASONING_FORMATS),
    default="auto",
    show_default=True,
    envvar="LLAMA_ARG_THINK",
    help="A thinking model's <think>...</think> in chat answers: none (left in content), auto or deepseek "
    "(in reasoning_content), deepseek-legacy (in both). A request's reasoning_format overrides it.",
)
@opt.seed
@go.context
@opt.threads
@opt.gpu_layers
@go.sampling
@go.drafting
@kv_and_sampling
@placement
@chat_template
@llama_compat
def serve(
    model: Path | None,
    host: str,
    port: int,
    api_key: str | None,
    alias: str | None,
    cors_origins: str,
    embeddings: bool,
    pooling: str,
    metrics: bool,
    slots: bool,
    set_props: bool,
    webui: bool,
    reasoning_format: str,
    tags: str,
    **opts: Any,
) -> None:
    """Serve MODEL over the OpenAI API (/v1/chat/completions, /v1/completions, /v1/responses, /v1/models,
    /v1/embeddings with --embeddings), Anthropic's (/v1/messages) and /health, drafting with its MTP head;
    each response carries `usage` and `mtp` (drafted, accepted, by position, per pass, the N used).
    Needs: pip install 'mtp-cli[serve]'."""
    from mtp_cli.serve import require_serve

    _, uvicorn = require_serve()
    from mtp_cli.serve.api import Surface, create_app
    from mtp_cli.serve.engine import Engine

    socks = _listen_all(host, port)  # (before the model loads: a busy port fails at once)
    if model is None:
        from mtp_cli.cli.demo_model import demo_file

        model = demo_file()
        opts = go.demo_settings(opts)
    base = go.gen_config(opts, model)
    base = replace(base, seed=-1) if opts["seed"] < 0 else base  # (then each sampled request draws its own)
    load = load_of(opts, base.spec_type)[0]
    engine = Engine.load(model, base, alias, load=load, embeddings=pooling if embeddings else None)
    engine.reasoning_format, engine.tags = reasoning_format, sorted({t.strip() for t in tags.split(",") if t.strip()})
    engine.start()
    _request_log()
    _say_serving(engine, socks[0].getsockname(), webui)
    config = uvicorn.Config(
        create_app(engine, api_key, cors_origins, Surface(slots, metrics, set_props, webui)),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
        http="h11",  # (whatever else is installed: httptools would lower the header names again)
    )

    class Server(uvicorn.Server):  # type: ignore[name-defined]
        def handle_exit(self, sig: int, frame: Any) -> None:
            engine.cancel_all()  # (a generation would otherwise hold the shutdown until it ends)
            super().handle_exit(sig, frame)

    try:
        Server(config).run(sockets=socks)
    finally:
        engine.close()
        for sock in socks:
            sock.close()


def _say_serving(engine: Any, address: tuple[Any, ...], webui: bool) -> None:
    """The one line that says the server is up: the model, its drafting, its context, where (the
    first address listened on)."""
    from mtp_cli import drafters

    host, port = address[0], address[1]
    where = f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"
    res = engine.startup
    n = f"N={res.config.draft_n_max}" if res.mode == "fixed" else f"N {res.mode}"
    drafting = f"{res.config.spec_type} {n}" if drafters.drafting(res.config.spec_type) else "no drafting"
    if res.note:
        render.note(f"note: {res.note}")
    page = f", chat page at {where.removesuffix('/v1')}/" if webui else ""
    slots = engine.rt.config.n_parallel
    if slots > 1:  # (flash attention for several slots is measured on the CPU: say what it chose)
        fa = {True: "on", False: "off", None: "llama.cpp's auto"}[engine.flash_attn]
        drafting += f", {slots} slots, flash attention {fa}"
    render.err.print(f"serving {engine.alias} ({drafting}, context {engine.n_ctx}) at {where}{page}", highlight=False)


def _request_log() -> None:
    """One plain line per request on stderr (a log, not a terminal display: no wrapping)."""
    log = logging.getLogger("mtp_cli.serve")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _listen_all(hosts: str, port: int) -> list[socket.socket]:
    """A listening socket on each of the comma-separated addresses, all on one port (the first's,
    when port 0 lets the system choose), or one line saying which failed."""
    socks: list[socket.socket] = []
    try:
        for host in [h.strip() for h in hosts.split(",") if h.strip()] or ["127.0.0.1"]:
            socks.append(_listen(host, socks[0].getsockname()[1] if socks else port))
    except UserError:
        for s in socks:
            s.close()
        raise
    return socks


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or one line saying why not."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        return sock
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


__all__ = ["serve"]
