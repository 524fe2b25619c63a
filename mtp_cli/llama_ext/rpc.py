"""llama.cpp's RPC backend: the devices of other machines (`rpc-server` on each), registered before the
first model load as llama.cpp's --rpc does (common/arg.cpp add_rpc_devices).

ggml aborts the process when an endpoint does not parse, does not connect or does not answer its
handshake (ggml-rpc.cpp rpc_dispatcher::start): each one is checked here first, with the same
handshake, so a bad endpoint is one LlamaError naming it.
"""

from __future__ import annotations

import ctypes
import re
import socket
import struct
from collections.abc import Sequence

from llama_cpp import llama_cpp as _C

from mtp_cli.errors import LlamaError
from mtp_cli.llama_ext.ggml import ggml

# the handshake of the pinned llama.cpp (ggml/src/ggml-rpc: RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE,
# RPC_PROTO_MAJOR_VERSION / MINOR_VERSION): | cmd (1 byte) | size (8) | caps | -> | size (8) | major
# minor patch pad | caps |
HELLO, CAPS, MAJOR, MINOR = 14, 24, 7, 0
CONNECT_TIMEOUT = 5.0  # seconds

_registered: dict[str, None] = {}  # endpoints added in this process (ggml keeps them for its life)


def supports_rpc() -> bool:
    return bool(_C.llama_supports_rpc())


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets, as ggml's parse_endpoint splits at the last colon)."""
    m = re.fullmatch(r"\s*(\[[^\]]+\]|[^:\s]+):(\d{1,5})\s*", endpoint)
    if not m or not 0 < int(m.group(2)) < 65536:
        raise LlamaError(f"RPC server {endpoint!r}: not HOST:PORT")
    return m.group(1).strip("[]"), int(m.group(2))


def hello(endpoint: str, timeout: float = CONNECT_TIMEOUT) -> tuple[int, int, int]:
    """The server's protocol version, by llama.cpp's own handshake; LlamaError naming the endpoint
    when it cannot be reached or is not an rpc-server of a version this build speaks."""
    host, port = parse_endpoint(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(struct.pack("<BQ", HELLO, CAPS) + bytes(CAPS))
            size = struct.unpack("<Q", _recv(s, 8))[0]
            if size != 4 + CAPS:
                raise LlamaError(f"RPC server {endpoint}: answered the handshake with {size} bytes: not an rpc-server")
            major, minor, patch = _recv(s, size)[:3]
    except OSError as e:
        raise LlamaError(f"RPC server {endpoint}: cannot connect ({e.strerror or e})") from None
    if major != MAJOR or minor > MINOR:
        raise LlamaError(f"RPC server {endpoint}: protocol {major}.{minor}.{patch}, this build speaks {MAJOR}.{MINOR}")
    return major, minor, patch


def _recv(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise OSError("the connection closed during the handshake")
        out += chunk
    return out


def add_servers(endpoints: Sequence[str]) -> list[str]:
    """Register each server's devices with ggml (once per process per endpoint); the endpoints now
    registered. Each is checked first (hello)."""
    if not endpoints:
        return list(_registered)
    if not supports_rpc():
        raise LlamaError("this llama.cpp build has no RPC backend: reinstall with `make setup` (it builds one)")
    g = ggml()
    reg = g.ggml_backend_reg_by_name(b"RPC") if g is not None else None
    add = g.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server") if g is not None and reg else None
    if g is None or not add:
        raise LlamaError("this llama.cpp build has no RPC backend to add servers to")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(add)
    for ep in (e.strip() for e in endpoints):
        if ep in _registered:
            continue
        hello(ep)
        server = add_server(ep.encode())
        if not server:
            raise LlamaError(f"RPC server {ep}: it offers no device")
        g.ggml_backend_register(server)
        _registered[ep] = None
    return list(_registered)


__all__ = ["supports_rpc", "parse_endpoint", "hello", "add_servers"]
