"""`mtp-cli serve` (mtp_cli.serve): the server on 127.0.0.1 inside pytest with a tiny model, spoken to
with the official `openai` client and with raw HTTP: greedy output equal to `generate`'s, streaming
and not, a cached follow-up turn, a cancelled stream, every kind of refusal, the API key."""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from mtp_cli.cli import main  # noqa: E402
from mtp_cli.config import GenConfig, LoadConfig  # noqa: E402
from mtp_cli.serve.api import create_app  # noqa: E402
from mtp_cli.serve.engine import Engine  # noqa: E402
from mtp_cli.stats import Generation  # noqa: E402
from tests.factory import tiny_model_set  # noqa: E402

N_CTX = 256


class Served:
    """A uvicorn server on a free loopback port, in a thread."""

    def __init__(self, engine: Engine, api_key: str | None = None, surface=None):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        self.engine = engine
        app = create_app(engine, api_key) if surface is None else create_app(engine, api_key, "*", surface)
        config = uvicorn.Config(app, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            assert time.monotonic() - t0 < 20, "the server did not start"
            time.sleep(0.02)

    def client(self, key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=key, max_retries=0)

    def raw(self, method: str, path: str, body: bytes | str | None = None, headers: dict | None = None):
        """(status, parsed JSON body) of one raw request."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            c.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
            r = c.getresponse()
            return r.status, json.loads(r.read() or b"null")
        finally:
            c.close()

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_set(tmp_path_factory.mktemp("serve"), "glm4moe", "structured", "q8_0", head_noise=1.5)


@pytest.fixture(scope="module")
def served(tiny) -> Iterator[Served]:
    engine = Engine.load(tiny["full"], GenConfig(spec_type="mtp", draft_n_max=3, n_ctx=N_CTX, n_threads=1))
    s = Served(engine.start())
    yield s
    s.close()
    engine.close()


def _generate_doc(tiny, *args: str) -> dict:
    r = CliRunner().invoke(
        main,
        ["generate", "-m", str(tiny["full"]), "--temp", "0", "-t", "1", "--spec-type", "mtp", "-c", str(N_CTX)]
        + ["--spec-draft-n-max", "3", *args],  # (the served engine's N)
    )
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _generate(tiny, *args: str) -> str:
    return _generate_doc(tiny, *args)["text"]


def _streamed(stream) -> tuple[str, list]:
    chunks = list(stream)
    text = "".join((c.choices[0].delta.content or "") if c.choices else "" for c in chunks)
    return text, chunks


def test_models_and_health(served, tiny):
    assert [m.id for m in served.client().models.list().data] == [tiny["full"].name]
    slots = [{"id": 0, "is_processing": False, "id_task": None}]
    assert served.raw("GET", "/health") == (200, {"status": "ok", "queued": 0, "slots": slots})


def test_chat_greedy_equals_generate_streaming_or_not(served, tiny):
    want = _generate(tiny, "--chat", "-p", "hello world", "-n", "12", "--json")
    c = served.client()
    msgs = [{"role": "user", "content": "hello world"}]
    r = c.chat.completions.create(model=tiny["full"].name, messages=msgs, temperature=0, max_tokens=12)
    assert r.choices[0].message.content == want and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12 and r.usage.total_tokens == r.usage.prompt_tokens + 12
    mtp = r.model_extra["mtp"]
    assert mtp["spec_type"] == "mtp" and mtp["draft_n_max"] == 3 and mtp["mode"] == "fixed"
    assert mtp["drafted"] >= mtp["accepted"] > 0 and len(mtp["acceptance_by_pos"]) == 3 and mtp["verify_passes"] > 0
    text, chunks = _streamed(
        c.chat.completions.create(messages=msgs, model=tiny["full"].name, temperature=0, max_tokens=12, stream=True)
    )
    assert text == want and chunks[0].choices[0].delta.role == "assistant"
    last = chunks[-1]
    assert last.choices[0].finish_reason == "length" and last.usage.completion_tokens == 12
    assert last.model_extra["mtp"]["accepted"] > 0 and all(ch.choices[0].finish_reason is None for ch in chunks[:-1])


def test_completions_greedy_equal_generate_and_stop_strings_cut(served, tiny):
    want = _generate(tiny, "-p", "hello world", "-n", "16", "--json")
    c = served.client()
    r = c.completions.create(model=tiny["full"].stem, prompt="hello world", temperature=0, max_tokens=16)
    assert r.choices[0].text == want and r.object == "text_completion"
    streamed = "".join(
        ch.choices[0].text
        for ch in c.completions.create(
            model=tiny["full"].stem, prompt="hello world", temperature=0, max_tokens=16, stream=True
        )
    )
    assert streamed == want
    stop = want[5:8]
    assert stop.strip() and stop not in want[:7]
    cut = c.completions.create(model=tiny["full"].stem, prompt="hello world", temperature=0, max_tokens=16, stop=stop)
    assert cut.choices[0].text == want[: want.index(stop)] and cut.choices[0].finish_reason == "stop"
    pieces = c.completions.create(
        model=tiny["full"].stem, prompt="hello world", temperature=0, max_tokens=16, stop=[stop], stream=True
    )
    assert "".join(ch.choices[0].text for ch in pieces) == cut.choices[0].text


def test_a_follow_up_turn_decodes_only_its_new_tokens(served):
    c = served.client()
    first = [{"role": "user", "content": "the cat"}]
    a = c.chat.completions.create(messages=first, model=served.engine.alias, temperature=0, max_tokens=10)
    turn2 = [
        *first,
        {"role": "assistant", "content": a.choices[0].message.content},
        {"role": "user", "content": "a dog"},
    ]
    b = c.chat.completions.create(messages=turn2, model=served.engine.alias, temperature=0, max_tokens=10)
    cached = b.usage.prompt_tokens_details.cached_tokens
    # everything the first request left in the cache: its prompt and its answer (the last token of a
    # length-stopped answer was never decoded)
    assert cached >= a.usage.prompt_tokens + a.usage.completion_tokens - 1 and b.usage.prompt_tokens > cached
    c.completions.create(model=served.engine.alias, prompt="something else", temperature=0, max_tokens=2)
    fresh = c.chat.completions.create(messages=turn2, model=served.engine.alias, temperature=0, max_tokens=10)
    assert fresh.usage.prompt_tokens_details.cached_tokens < 4  # (what it shares with "something else")
    assert fresh.choices[0].message.content == b.choices[0].message.content  # the cache changes nothing


def test_a_closed_stream_cancels_its_generation(served, monkeypatch):
    """A client gone mid-stream stops the generation at its next token; the server goes on."""
    engine = served.engine
    real = engine.rt.generate
    _slow(engine, monkeypatch)  # 20 ms a token
    c = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 200, "ignore_eos": True, "stream": True}
    c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    seen = 0
    while seen < 3:
        seen += r.readline().startswith(b"data: ")
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    t0 = time.monotonic()
    while not engine.recent or engine.recent[-1].n_tokens >= 200 or engine.recent[-1].stop_reason != "interrupted":
        assert time.monotonic() - t0 < 10, list(engine.recent)[-1:]
        time.sleep(0.05)
    assert engine.recent[-1].n_tokens < 100
    monkeypatch.setattr(engine.rt, "generate", real)
    assert served.raw("GET", "/health")[0] == 200
    ok = served.client().completions.create(model=engine.alias, prompt="hello", temperature=0, max_tokens=3)
    assert ok.usage.completion_tokens == 3


@pytest.mark.parametrize(
    "body, status, says",
    [
        ("{not json", 400, "not valid JSON"),
        ("[1, 2]", 400, "must be a JSON object"),
        ({"messages": "hi"}, 400, "`messages`"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "`temperature`"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": 5}, 400, "`temperature`"),
        ({"messages": [{"role": "user", "content": "hi"}], "frobnicate": 1}, 400, "unsupported parameter `frobnicate`"),
        (
            {"messages": [{"role": "user", "content": "hi"}], "n": 99},
            400,
            "`n`: Input should be less than or equal to 16",
        ),
        ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, 400, "`tools.0`"),
        ({"messages": [{"role": "user", "content": "hi"}], "mirostat": 2}, 400, "`mirostat`"),
        ({"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 5}, 400, "`presence_penalty`"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            400,
            "image_url",
        ),
        ({"messages": [{"role": "user", "content": "hi " * 400}]}, 400, "the context holds 256"),
        ({"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]}, 400, "`stop`"),
        ({"messages": []}, 400, "`messages`"),
    ],
)
def test_bad_requests_get_openai_errors_and_kill_nothing(served, body, status, says):
    raw = body if isinstance(body, str) else json.dumps(body)
    got, doc = served.raw("POST", "/v1/chat/completions", raw)
    assert got == status and says in doc["error"]["message"], doc
    assert doc["error"]["type"] == "invalid_request_error"
    assert served.raw("GET", "/health")[0] == 200


def test_errors_reach_the_openai_client_as_its_own_exceptions(served):
    c = served.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=served.engine.alias, prompt=[10**9], max_tokens=2)  # a token outside the vocabulary
    assert "outside the vocabulary" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=served.engine.alias, messages=[{"role": "user", "content": "x " * 300}])
    assert e.value.code == "context_length_exceeded"
    assert served.raw("GET", "/v1/nowhere")[0] == 404


def test_an_internal_failure_is_a_500_and_the_next_request_is_served(served, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(served.engine.rt, "generate", boom)
    status, doc = served.raw("POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2}))
    assert status == 500 and "disk on fire" in doc["error"]["message"] and doc["error"]["type"] == "server_error"
    monkeypatch.undo()
    assert served.raw("POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2}))[0] == 200


def test_an_api_key_is_required_when_set(tiny):
    engine = Engine.load(tiny["full"], GenConfig(spec_type="none", n_ctx=N_CTX, n_threads=1)).start()
    s = Served(engine, api_key="sekrit")
    try:
        assert s.raw("GET", "/health")[0] == 200  # (open: for load balancers)
        assert s.raw("GET", "/v1/models")[0] == 401
        status, doc = s.raw("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
        assert status == 401 and doc["error"]["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        assert s.client("sekrit").models.list().data[0].id == engine.alias
        r = s.client("sekrit").chat.completions.create(
            model=engine.alias, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0
        )
        assert r.model_extra["mtp"]["spec_type"] == "none" and r.usage.completion_tokens == 3
        body = json.dumps({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        status, doc = s.raw("POST", "/v1/messages", body, headers={"x-api-key": "wrong"})
        assert status == 401 and doc["type"] == "error" and doc["error"]["type"] == "authentication_error"
        assert s.raw("POST", "/v1/messages", body, headers={"x-api-key": "sekrit"})[0] == 200  # (Anthropic's header)
    finally:
        s.close()
        engine.close()


def test_serve_refuses_a_busy_port_in_one_line_before_loading(tiny):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        port = str(busy.getsockname()[1])
        r = CliRunner().invoke(main, ["serve", "-m", str(tiny["full"].with_suffix(".missing")), "--port", port])
        assert r.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in r.output, r.output
    finally:
        busy.close()


def test_the_command_serves_logs_one_line_per_request_and_stops_on_ctrl_c(tiny):
    import re
    import signal
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "mtp_cli", "serve", "-m", str(tiny["full"]), "--port", "0", "-c", str(N_CTX)]
    proc = subprocess.Popen(
        [*cmd, "--spec-type", "mtp", "--spec-draft-n-max", "3", "-t", "1"], stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        m = re.search(r"serving (\S+) \(mtp N=3, context 256\) at http://127\.0\.0\.1:(\d+)/v1", line)
        assert m and m.group(1) == tiny["full"].name, line
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{m.group(2)}/v1", api_key="x", max_retries=0)
        r = client.completions.create(model=tiny["full"].name, prompt="hello world", max_tokens=5, temperature=0)
        assert r.usage.completion_tokens == 5
        logged = proc.stderr.readline()
        assert re.search(r"req-\w+: 3 prompt tokens \(0 cached\), 5 generated at [\d.]+ t/s, mtp N=3", logged), logged
        seeds = {
            client.completions.create(model="m", prompt="hi", max_tokens=1).model_extra["mtp"]["seed"] for _ in range(3)
        }
        assert len(seeds) == 3  # (found by llama.cpp's suite: every request without a seed drew the server's one)
        proc.send_signal(signal.SIGINT)  # (uvicorn shuts down, then the CLI says "interrupted", as everywhere)
        assert proc.wait(timeout=30) == 130 and "interrupted" in proc.stderr.read()
    finally:
        proc.kill()


def test_a_server_of_several_slots_says_so_with_its_flash_attention(tiny):
    """(What the probe chose, and that the line says it, tests/test_attention_probe.py.)"""
    import re
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "mtp_cli", "serve", "-m", str(tiny["full"]), "--port", "0", "-c", str(2 * N_CTX)]
    proc = subprocess.Popen([*cmd, "-np", "2", "--spec-draft-n-max", "3", "-t", "1"], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        fa = "(on|off|llama.cpp's auto)"
        assert re.search(rf"serving \S+ \(\S+ N=3, 2 slots, flash attention {fa}, context 256\) at http", line), line
    finally:
        proc.kill()


def _slow(engine, monkeypatch, per_token: float = 0.02):
    """Make the engine's model slow (per_token seconds a token), to leave while it generates."""
    real = engine.rt.generate

    def slow(*a, **k):
        inner = real(*a, **k)

        def events():
            try:
                for ev in inner:
                    time.sleep(per_token)
                    yield ev
            finally:
                inner.close()

        return Generation(events(), inner.stats)

    monkeypatch.setattr(engine.rt, "generate", slow)


def _send(port: int, body: dict) -> http.client.HTTPConnection:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    return c


def _wait_for(cond, what: str, seconds: float = 10.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < seconds, what
        time.sleep(0.05)


def test_an_abandoned_plain_request_and_a_queued_one_are_cancelled(served, monkeypatch):
    """A client that leaves without reading its answer (a timeout) stopped nothing: the job ran to its
    end, and a request queued behind it ran too."""
    engine = served.engine
    _slow(engine, monkeypatch)
    body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 200, "ignore_eos": True}
    before = len(engine.recent)
    running = _send(served.port, body)
    _wait_for(lambda: bool(engine._active), "the first request did not start")
    queued = _send(served.port, {**body, "messages": [{"role": "user", "content": "queued"}]})
    _wait_for(lambda: engine.queued == 1, "the second request was not queued")
    for c in (queued, running):  # (the queued one leaves first, then the running one)
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()
        time.sleep(0.3)
    _wait_for(lambda: len(engine.recent) > before and not engine._active, "the job did not stop")
    assert len(engine.recent) == before + 1, list(engine.recent)[before:]  # the queued one never ran
    assert engine.recent[-1].stop_reason == "interrupted" and engine.recent[-1].n_tokens < 100


def test_stream_usage_comes_once_at_the_end_with_include_usage(served):
    c = served.client()
    chunks = list(
        c.chat.completions.create(
            model=served.engine.alias,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    with_usage = [ch for ch in chunks if ch.usage is not None]
    assert len(with_usage) == 1 and with_usage[0] is chunks[-1] and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].model_extra["mtp"]["spec_type"] == "mtp"
    assert chunks[-2].choices[0].finish_reason == "length"


def test_a_failure_inside_llama_cpp_is_a_500_not_the_clients_fault(served, monkeypatch):
    from mtp_cli.errors import LlamaError

    def fails(*a, **k):
        raise LlamaError("llama_decode failed with code -3")

    monkeypatch.setattr(served.engine.rt, "generate", fails)
    status, doc = served.raw("POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2}))
    assert status == 500 and "llama_decode failed" in doc["error"]["message"], doc


def test_stop_strings_across_tokens_are_cut_and_nothing_is_sent_twice():
    from mtp_cli.serve.engine import Job
    from mtp_cli.serve.events import Delta, stream
    from mtp_cli.stats import TokenEvent

    pieces = ["Hel", "lo, wo", "rld", "! And", " more"]

    def gen():
        yield from (TokenEvent(i, t, "target", i) for i, t in enumerate(pieces))

    for stops, want in (
        (["o, w"], "Hell"),
        (["rld!"], "Hello, wo"),
        (["d! A", "x"], "Hello, worl"),
        ([], "".join(pieces)),
    ):
        sent: list = []
        text, cut, *_ = stream(gen(), Job(None, sent.append), stops, None)  # type: ignore[arg-type]
        assert text == want and cut == (stops[0] if stops else None)  # (the stop string that cut it)
        assert "".join(d.text for d in sent if isinstance(d, Delta)) == want


def test_the_servers_own_n_predict_is_clamped_to_the_room_left(tiny):
    engine = Engine.load(tiny["full"], GenConfig(spec_type="none", n_ctx=64, n_threads=1, n_predict=500)).start()
    s = Served(engine)
    try:
        r = s.client().completions.create(
            model=engine.alias, prompt="hello world", temperature=0, extra_body={"ignore_eos": True}
        )
        assert r.usage.prompt_tokens + r.usage.completion_tokens <= 64 and r.choices[0].finish_reason == "length"
        # a request's own max_tokens past the context: clamped the same way (llama-server's behaviour)
        r = s.client().completions.create(
            model=engine.alias, prompt="hello world", max_tokens=500, extra_body={"ignore_eos": True}
        )
        assert r.usage.prompt_tokens + r.usage.completion_tokens == 64 and r.choices[0].finish_reason == "length"
    finally:
        s.close()
        engine.close()


def test_the_gemma4_assistant_serves(tmp_path):
    """`serve -m TARGET -md ASSISTANT`: the agreeing tiny pair's drafts are all accepted, and the
    text is plain decoding's."""
    from mtp_cli.runtime import Runtime
    from tests.gemma4_pair import write_gemma4_pair

    pair = write_gemma4_pair(tmp_path, agree=1.0)
    with Runtime.load(pair.target) as rt:
        want = "".join(
            ev.text for ev in rt.generate(rt.tokenize("the cat"), GenConfig(n_predict=6, temp=0.0, n_threads=1))
        )
    base = GenConfig(spec_type="mtp", draft_n_max=3, n_ctx=N_CTX, n_threads=1)
    engine = Engine.load(pair.target, base, load=LoadConfig(spec_type="mtp", draft_model=str(pair.assistant)))
    s = Served(engine.start())
    try:
        r = s.client().completions.create(model=pair.target.name, prompt="the cat", temperature=0, max_tokens=6)
        mtp = r.model_extra["mtp"]
        assert r.choices[0].text == want and mtp["drafted"] == mtp["accepted"] > 0, (r.choices[0].text, want, mtp)
    finally:
        s.close()
        engine.close()


def test_per_request_penalties_and_bias_steer_the_drafts(served, tiny, monkeypatch):
    """A request's own penalties and logit_bias reach the drafter's picks (sampling.DraftSteer), and
    its drafts are generate's with the same flags: the same text, drafted and accepted by position."""
    from mtp_cli import loop

    seen: list[tuple] = []
    real = loop.DraftSteer

    def spy(edits, history, grammar=None):
        e = edits
        seen.append((float(e.penalty), float(e.freq), float(e.presence), dict(zip(e.bias_ids.tolist(), e.bias))))
        return real(edits, history, grammar)

    monkeypatch.setattr(loop, "DraftSteer", spy)
    plain = _generate(tiny, "-p", "hello world", "-n", "16", "--json")
    tok = served.engine.rt.tokenize(plain, add_special=False)[1]  # (a token of the plain answer: banned)
    flags = ["--repeat-penalty", "1.5", "--frequency-penalty", "1", "--presence-penalty", "0.5", "-l", f"{tok}-inf"]
    want = _generate_doc(tiny, "-p", "hello world", "-n", "16", "--json", *flags)
    seen.clear()
    body = {
        "model": "m",
        "prompt": "hello world",
        "temperature": 0,
        "max_tokens": 16,
        "repeat_penalty": 1.5,
        "frequency_penalty": 1,
        "presence_penalty": 0.5,
        "logit_bias": {str(tok): -100},
    }
    status, doc = served.raw("POST", "/v1/completions", json.dumps(body))
    assert status == 200 and doc["choices"][0]["text"] == want["text"] != plain
    assert seen and all(s == (1.5, 1.0, 0.5, {tok: -math.inf}) for s in seen), seen[:2]
    mtp, st = doc["mtp"], want["stats"]
    assert mtp["drafted_by_pos"] == st["drafted_at"] and mtp["accepted_by_pos"] == st["accepted_at"]
    assert sum(mtp["drafted_by_pos"]) == mtp["drafted"] > 0


def test_the_command_listens_on_several_addresses_at_one_port(tiny):
    """llama-server's `--host 127.0.0.1,::1`: one port on each address (the one given first names it);
    and its `-a` aliases (the first in sorted order answers) and `--tags`, listed in /v1/models."""
    import re
    import signal
    import subprocess
    import sys

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("IPv6 loopback is unavailable")
    cmd = [sys.executable, "-m", "mtp_cli", "serve", "-m", str(tiny["full"]), "--port", "0", "-c", str(N_CTX)]
    names = ["--host", "127.0.0.1,::1", "-a", "tiny-2, fim,code", "--tags", "chat,small"]
    proc = subprocess.Popen([*cmd, *names, "-t", "1"], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = ""
        while "serving" not in line and proc.poll() is None:  # (a note may come first)
            line = proc.stderr.readline()
        m = re.search(r"at http://127\.0\.0\.1:(\d+)/v1", line)
        assert m, line
        for host in ("127.0.0.1", "::1"):
            c = http.client.HTTPConnection(host, int(m.group(1)), timeout=30)
            c.request("GET", "/health")
            assert c.getresponse().status == 200
            c.close()
        c = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=30)
        c.request("GET", "/v1/models")
        model = json.loads(c.getresponse().read())["data"][0]
        assert (model["id"], model["aliases"], model["tags"]) == ("code", ["code", "fim", "tiny-2"], ["chat", "small"])
        c.close()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()
