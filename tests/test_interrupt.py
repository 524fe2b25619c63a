"""Ctrl-C: exit code 130 and one line for every command at every point, start-up imports included;
`generate` prints its summary first, as llama.cpp does."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from gguf_tools import ops
from mtp_cli import llama_ext as lx
from mtp_cli.cli import main
from tests.factory import tiny_model_set


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_set(tmp_path_factory.mktemp("int"), "glm4moe", "structured", "q8_0")


def _interrupt_decode_at(monkeypatch, n: int) -> None:
    calls = {"n": 0}
    real = lx.decode

    def flaky(ctx, batch):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt  # as Python delivers it when llama_decode returns
        return real(ctx, batch)

    monkeypatch.setattr(lx, "decode", flaky)


@pytest.mark.parametrize("spec", ["none", "mtp"])
def test_an_interrupted_generate_prints_its_summary_then_exits_130(tiny, monkeypatch, spec):
    _interrupt_decode_at(monkeypatch, 10)
    args = ["generate", "-m", str(tiny["full"]), "-p", "hello", "-n", "60", "--temp", "0", "--spec-type", spec]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 130, r.output
    assert "generated at" in r.stderr and "stop: interrupted" in r.stderr and "Traceback" not in r.output


def test_an_interrupted_generate_with_json_still_prints_the_document(tiny, monkeypatch):
    _interrupt_decode_at(monkeypatch, 10)
    args = ["generate", "-m", str(tiny["full"]), "-p", "hello", "-n", "60", "--temp", "0", "--json"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 130
    doc = json.loads(r.stdout)
    assert doc["stats"]["stop_reason"] == "interrupted" and 0 < doc["stats"]["n_tokens"] < 60


def test_an_interrupted_file_command_is_one_line_and_130(tiny, tmp_path, monkeypatch):
    def slow_pack(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ops, "pack", slow_pack)
    r = CliRunner().invoke(
        main, ["pack", str(tiny["trunk"]), "--heads", str(tiny["sidecar"]), "-o", str(tmp_path / "o")]
    )
    assert r.exit_code == 130 and r.stderr.strip() == "interrupted"


def test_ctrl_c_in_clicks_own_lines_around_a_command_is_one_line_and_130(tiny, monkeypatch):
    """A SIGINT landed while click closed the context after `inspect` ran (under load, in CI): click
    said "Aborted!" and exit 1. End of input stays click's "Aborted!" and 1; --help and a usage error
    exit as before."""
    import click

    leave = click.Context.__exit__

    def interrupted_exit(self, *exc):
        leave(self, *exc)
        if self.parent is None and getattr(self, "_depth", 0) == 0:  # (click's main closing the group's)
            raise KeyboardInterrupt

    monkeypatch.setattr(click.Context, "__exit__", interrupted_exit)
    r = CliRunner().invoke(main, ["inspect", str(tiny["full"])])
    assert r.exit_code == 130 and r.stderr.strip() == "interrupted", (r.exit_code, r.stderr)
    monkeypatch.setattr(click.Context, "__exit__", leave)

    def end_of_input(*a, **k):
        raise EOFError

    monkeypatch.setattr(ops, "pack", end_of_input)
    r = CliRunner().invoke(main, ["pack", str(tiny["trunk"]), "--heads", str(tiny["sidecar"]), "-o", "x.gguf"])
    assert r.exit_code == 1 and r.stderr.strip() == "Aborted!", (r.exit_code, r.stderr)
    assert CliRunner().invoke(main, ["--help"]).exit_code == 0
    r = CliRunner().invoke(main, ["inspect", "--no-such-flag"])
    assert r.exit_code == 2 and "No such option" in r.stderr


_IMPORT_HOOK = """
import builtins, sys
real, target = builtins.__import__, sys.argv[1]
def hook(name, *a, **k):
    if name.split(".")[0] == target:
        raise KeyboardInterrupt
    return real(name, *a, **k)
builtins.__import__ = hook
sys.argv = ["mtp-cli", "--help"]
from mtp_cli.__main__ import main
main()
"""


@pytest.mark.parametrize("module", ["click", "rich", "gguf"])
def test_ctrl_c_during_start_up_imports_is_one_line_and_130(module):
    r = subprocess.run([sys.executable, "-c", _IMPORT_HOOK, module], capture_output=True, text=True)
    assert (r.returncode, r.stderr) == (130, "interrupted\n")


_IN_A_CALLBACK = """
import builtins, sys, weakref
real, done = builtins.__import__, []
def hook(name, *a, **k):
    if name.split(".")[0] == "rich" and not done:  # a weakref callback interrupted, as importlib's can be
        done.append(1)
        class Obj: pass
        def cb(_):
            raise KeyboardInterrupt
        o = Obj(); ref = weakref.ref(o, cb); del o
    return real(name, *a, **k)
builtins.__import__ = hook
sys.argv = ["mtp-cli", "--help"]
from mtp_cli.__main__ import main
main()
"""


def test_ctrl_c_inside_a_callback_is_one_line_and_130_too():
    """Python cannot raise from a weakref callback: it printed "Exception ignored in ..." with a
    traceback and went on (a real SIGINT landed there once in the test below)."""
    r = subprocess.run([sys.executable, "-c", _IN_A_CALLBACK], capture_output=True, text=True)
    assert (r.returncode, r.stderr) == (130, "interrupted\n")


_READY_THEN_RUN = """
import sys
class Ready:  # says "ready" when main() imports the CLI: inside its Ctrl-C guard, never before it
    def find_spec(self, name, path=None, target=None):
        if name == "mtp_cli.cli":
            sys.meta_path.remove(self)
            sys.stderr.write("ready\\n"); sys.stderr.flush()
        return None
sys.argv = ["mtp-cli", *sys.argv[1:]]
sys.meta_path.insert(0, Ready())
from mtp_cli.__main__ import main  # what the console script does first
main()
"""


def test_a_real_sigint_at_any_point_after_the_interpreter_starts_never_shows_a_traceback(tiny):
    # (Python's own start-up and the console script's import of the entry module, a few milliseconds
    # before any project code runs, are outside our reach: the test starts when main() imports the
    # CLI, inside its guard; a "ready" written before main() let a SIGINT land in the harness's own
    # lines under load)
    codes = set()
    for delay in (0.0, 0.01, 0.03, 0.06, 0.1, 0.2, 0.4, 0.8):
        p = subprocess.Popen(
            [sys.executable, "-c", _READY_THEN_RUN, "inspect", str(tiny["full"])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert p.stderr is not None and p.stderr.readline() == "ready\n"
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        out, errs = p.communicate(timeout=60)
        assert "Traceback" not in errs and "KeyboardInterrupt" not in errs, errs
        # -SIGINT: it landed while the interpreter was shutting down, its default action restored
        assert p.returncode in (0, 130) or (p.returncode, errs) == (-signal.SIGINT, ""), (p.returncode, errs)
        if p.returncode == 130:
            assert errs.strip() == "interrupted", errs
        codes.add(p.returncode)
    assert 130 in codes


def test_a_ctrl_c_while_ctypes_reads_a_handle_stays_a_keyboard_interrupt():
    """ctypes runs the handle's `_as_parameter_` (Python) to pass it; a SIGINT landing there comes out
    of ctypes as ArgumentError("argument 1: KeyboardInterrupt"), which the loop would report as a
    crash: decode gives it back as the KeyboardInterrupt it was (seen once in CI: a conversation's
    Ctrl-C printed a traceback)."""

    class Interrupted:
        @property
        def _as_parameter_(self):
            raise KeyboardInterrupt

    b = lx.Batch(2)
    b.add(1, 0, logits=True)
    with pytest.raises(KeyboardInterrupt):
        lx.decode(Interrupted(), b)  # type: ignore[arg-type]
