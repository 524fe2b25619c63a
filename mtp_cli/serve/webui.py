"""The chat page at / (`serve --no-webui` turns it off): plain HTML, CSS and JavaScript shipped in the
package (webui/index.html), no build step, no CDN. It streams answers from /v1/chat/completions with
`mtp_pieces` on, so each token says whether it came from an accepted draft, and shows the figures
of the last chunk's `mtp` object (tokens per second, acceptance by position, the N used)."""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi.responses import HTMLResponse


@cache
def _html() -> str:
    return resources.files("mtp_cli.serve").joinpath("webui/index.html").read_text(encoding="utf-8")


async def page() -> HTMLResponse:
    return HTMLResponse(_html(), headers={"Cache-Control": "no-cache"})


__all__ = ["page"]
