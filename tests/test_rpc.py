"""llama.cpp RPC through mtp-cli (--rpc): endpoints checked before ggml sees them (it aborts on one it
cannot reach), and, through a loopback `ggml-rpc-server` built from the vendored sources (once,
cached), plain and MTP decoding with the weights on the server give local decoding's output, with
the model's own head kept local by -ngld 0 (loaded as a sidecar of its own)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mtp_cli import llama_ext as lx
from mtp_cli.cli import main
from mtp_cli.errors import LlamaError
from mtp_cli.llama_ext.rpc import hello, parse_endpoint

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_endpoints_are_checked_before_ggml_sees_them():
    assert parse_endpoint("10.0.0.2:50052") == ("10.0.0.2", 50052) and parse_endpoint("[::1]:7") == ("::1", 7)
    for bad in ("nohost", "h:0", "h:99999", ":80"):
        with pytest.raises(LlamaError, match="not HOST:PORT"):
            parse_endpoint(bad)
    with pytest.raises(LlamaError, match="cannot connect"):
        hello(f"127.0.0.1:{_free_port()}", timeout=2)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def answer_wrong() -> None:  # (an HTTP server, say: not ggml's handshake)
        conn, _ = srv.accept()
        conn.recv(64)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        conn.close()

    threading.Thread(target=answer_wrong, daemon=True).start()
    with pytest.raises(LlamaError, match="not an rpc-server"):
        hello(f"127.0.0.1:{srv.getsockname()[1]}", timeout=5)
    srv.close()


def test_a_bad_rpc_flag_is_one_line(tiny_models):
    model = str(tiny_models("glm4moe")["full"])
    for flags, says in ((["--rpc", "nohost"], "HOST:PORT"), (["--rpc", f"127.0.0.1:{_free_port()}"], "cannot connect")):
        r = CliRunner().invoke(main, ["generate", "-m", model, "-p", "hi", "-n", "2", *flags])
        assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output


@pytest.fixture(scope="module")
def rpc_server(tmp_path_factory):
    if not lx.supports_rpc():
        pytest.skip("this llama.cpp build has no RPC backend")
    sys.path.insert(0, str(ROOT / "scripts"))
    import llama_build

    from mtp_cli.user_cache import cache_dir

    binary = llama_build.build_tools(("ggml-rpc-server",), cache_dir()) / "ggml-rpc-server"
    port = _free_port()
    proc = subprocess.Popen(
        [str(binary), "-H", "127.0.0.1", "-p", str(port), "-t", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ep = f"127.0.0.1:{port}"
    t0 = time.monotonic()
    while True:
        try:
            hello(ep, timeout=1)
            break
        except LlamaError:
            assert proc.poll() is None and time.monotonic() - t0 < 30, "the rpc-server did not start"
            time.sleep(0.2)
    yield ep
    proc.terminate()
    proc.wait(timeout=20)


def _child(model: Path, spec: dict) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "tests.rpc_child", str(model), json.dumps(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_decoding_through_an_rpc_server_gives_local_output(rpc_server, tiny_models, tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_CLI_CACHE", str(tmp_path))  # (the head's sidecar is written there)
    model = tiny_models("glm4moe", head_noise=1.0)["full"]
    runs = [{"spec_type": "none"}, {"spec_type": "mtp", "draft_n_max": 2}]
    local = _child(model, {"runs": runs, "ngl": 0})
    remote = _child(model, {"rpc": [rpc_server], "runs": runs})
    apart = _child(model, {"rpc": [rpc_server], "runs": runs, "ngld": 0})
    assert "RPC0" in remote["devices"] and "RPC0" not in local["devices"]
    want = local["runs"][0]["tokens"]
    for got in (local, remote, apart):
        assert [r["tokens"] for r in got["runs"]] == [want, want]
        assert got["runs"][1]["accepted"] > 0
    assert remote["draft"] is None and apart["draft"] and Path(apart["draft"]).parent == tmp_path / "heads"
