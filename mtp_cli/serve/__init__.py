"""`mtp-cli serve`: an OpenAI-compatible HTTP server that drafts with MTP (the optional `serve`
extra: fastapi + uvicorn, imported only by the modules that need them).

    requests.py  the request bodies (pydantic): what the OpenAI API sends, mapped onto a GenConfig
    engine.py    one Runtime, one worker thread, a FIFO of jobs; the KV cache kept across requests
    api.py       the FastAPI app: routes, OpenAI-style errors, SSE streaming

    engine = Engine.load("model.gguf", GenConfig(spec_type="mtp", draft_mode="auto"))
    app = create_app(engine, api_key=None)   # then uvicorn.run(app, host="127.0.0.1", port=8080)
"""

from __future__ import annotations

from types import ModuleType

from mtp_cli.errors import MissingExtraError

SERVE_HINT = "serving needs fastapi and uvicorn: pip install 'mtp-cli[serve]'"


def require_serve() -> tuple[ModuleType, ModuleType]:
    """(fastapi, uvicorn), or MissingExtraError with the one-line install hint."""
    try:
        import fastapi
        import uvicorn
    except ImportError:
        raise MissingExtraError(SERVE_HINT) from None
    return fastapi, uvicorn


__all__ = ["SERVE_HINT", "require_serve"]
