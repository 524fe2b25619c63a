"""The CPU self-check: does this llama.cpp build survive a batched decode in its extra buffer types?

llama.cpp's AMX path crashes the whole process on builds mtp-cli did not make (GCC 12 and older
miscompile it: SIGSEGV at `ldtilecfg`, llama.cpp #20824) and after torch has used the tiles in the
same process (SIGILL). So before the first model load, when the CPU backend offers extra buffer
types, a child process loads tiny Q4_0 and Q8_0 models with them and decodes a 4-token batch. If it
dies, the next setting is tried (AMX left out but repack kept, then no extra buffer at all); the
verdict is kept in the user cache per llama.cpp build and CPU, and applied to every model this
process loads. The user can force either way with --repack / --no-repack (`forced`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from gguf_tools.probe_model import PROBE_TYPES, write_probe_model
from mtp_cli import llama_ext as lx
from mtp_cli.errors import LlamaError
from mtp_cli.llama_ext import buffers
from mtp_cli.llama_ext.buffers import AMX
from mtp_cli.llama_ext.build import build_info
from mtp_cli.user_cache import cache_dir

log = logging.getLogger(__name__)

# settings, fastest first where they run (benchmarks/cpu_buffers.py measured the order)
ALL, NO_AMX, NONE = "all", "no-amx", "none"
SETTINGS = (ALL, NO_AMX, NONE)
BROKEN = "broken"  # even a decode without extra buffer types died: no setting helps
PROBE_TIMEOUT_S = 120.0
Probe = Callable[[str, Path], Optional[str]]  # (setting, folder of probe models) -> how it died, or None
FIX_HEADER = Path(__file__).parent / "data" / "gcc12_amx_fix.h"  # (scripts/llama_build.py uses it too)


def rebuild_command() -> str:
    """How to rebuild llama-cpp-python so that its AMX path is right (GCC 12's intrinsics corrected;
    clang and GCC 13+ need no header, but it does no harm there)."""
    # scikit-build-core splits CMAKE_ARGS like a shell: the flag and its path stay one argument
    arg = shlex.quote(f"-DCMAKE_CXX_FLAGS=-include {FIX_HEADER}")
    return (
        f'CMAKE_ARGS="{arg}" pip install --force-reinstall --no-cache-dir '
        "--no-binary llama-cpp-python llama-cpp-python==0.3.36"
    )


@dataclass(frozen=True)
class Verdict:
    setting: str  # one of SETTINGS: what models are loaded with
    kept: tuple[str, ...]  # the extra buffer types weights may go to
    offered: tuple[str, ...]  # the ones this build offers
    failed: dict[str, str] = field(default_factory=dict)  # setting -> how its probe died
    key: str = ""  # of the cache entry: this llama.cpp build and CPU
    why: str = ""  # for a setting other than the probe's: torch in the process, --repack / --no-repack


def kept_for(setting: str, offered: tuple[str, ...]) -> tuple[str, ...]:
    if setting == ALL:
        return offered
    return tuple(b for b in offered if b != AMX) if setting == NO_AMX else ()


def candidates(offered: tuple[str, ...]) -> tuple[str, ...]:
    """The settings worth probing, in order (no-amx only where it differs from both others)."""
    if not offered:
        return ()
    middle = (NO_AMX,) if AMX in offered and len(offered) > 1 else ()
    return (ALL, *middle, NONE)


def cpu_features() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return line.split(":", 1)[1].strip()
    return ""


def check_key() -> str:
    """The cache key of this llama.cpp build (its libraries' fingerprint) and this CPU (its flags)."""
    return hashlib.sha256(f"{build_info().fingerprint}\n{cpu_features()}".encode()).hexdigest()[:16]


def _deaths(failed: dict[str, str]) -> str:
    return "; ".join(f"{s}: {how}" for s, how in failed.items())


def _cache_file(key: str) -> Path:
    return cache_dir() / "cpu-check" / f"{key}.json"


CHILD = (sys.executable, "-m", "mtp_cli.cpu_check")


def probe(setting: str, folder: Path, timeout: float = PROBE_TIMEOUT_S, child: Sequence[str] = CHILD) -> Optional[str]:
    """Run the probe for `setting` in a child process; None if it ran, else how it died."""
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # ggml's abort would fork a debugger
    cmd = [*child, setting, str(folder)]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"hung for {timeout:.0f} s"
    return None if r.returncode == 0 else died(r.returncode, r.stderr)


def died(returncode: int, stderr: str = "") -> str:
    """How a child ended: its signal's name (SIGSEGV, SIGILL, SIGABRT) or its exit code."""
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    return f"exit {returncode}" + (f" ({last[:160]})" if last else "")


def run_check(offered: tuple[str, ...], run_probe: Probe) -> tuple[str, dict[str, str]]:
    """The first setting whose probe survives, and how the ones before it died."""
    failed: dict[str, str] = {}
    order = candidates(offered)
    with tempfile.TemporaryDirectory(prefix="mtp-cli-cpu-check-") as tmp:
        for qtype in PROBE_TYPES:
            write_probe_model(Path(tmp) / f"probe-{qtype}.gguf", qtype)
        for setting in order:
            how = run_probe(setting, Path(tmp))
            if how is None:
                return setting, failed
            failed[setting] = how
    return BROKEN, failed


_applied: list[Verdict] = []
_torch_seen: list[bool] = []


def torch_in_process() -> None:
    """Say that this process runs (or will run) torch: ggml's AMX path must not run beside it
    (torch's oneDNN releases the tiles ggml believes configured: SIGILL). Applies at once."""
    _torch_seen.append(True)
    if _applied:
        ensure(refresh=True)


def _torch() -> bool:
    return bool(_torch_seen) or "torch" in sys.modules


def decide(offered: tuple[str, ...], probed: str, forced: Optional[bool], torch: bool) -> tuple[str, str]:
    """(setting, why): the probe's setting unless the user forced one; never AMX beside torch."""
    setting, why = probed, ""
    if forced is not None:
        setting, why = (ALL, "--repack") if forced else (NONE, "--no-repack")
    if torch and AMX in kept_for(setting, offered):
        setting, why = (NO_AMX if len(offered) > 1 else NONE), "torch runs in this process"
    return setting, why


def ensure(forced: Optional[bool] = None, *, refresh: bool = False, run_probe: Optional[Probe] = None) -> Verdict:
    """Decide (once per process; the probe once per build and CPU) which extra buffer types models
    may use, apply it, and return the verdict. `forced`: --repack (True: all) / --no-repack (False).
    Raises LlamaError when even a decode without extra buffer types dies."""
    if _applied and not refresh and forced is None:
        return _applied[-1]
    offered = buffers.offered()
    info = build_info()
    key = check_key()
    probed, failed = ALL, dict[str, str]()
    if offered and forced is None:
        probed, failed, fresh = _probed(key, offered, run_probe or probe)
        if probed == BROKEN:
            raise LlamaError(
                f"llama.cpp ({info.lib_dir}) dies on a 4-token decode here even without extra buffer types "
                f"({_deaths(failed)}); reinstall it: {rebuild_command()}"
            )
        if fresh and failed:
            _say_avoided(probed, offered, failed, info.compiler)
    setting, why = decide(offered, probed, forced, _torch())
    verdict = Verdict(setting, buffers.keep(kept_for(setting, offered)), offered, failed, key, why)
    _applied.append(verdict)
    log.info("extra buffer types: %s (%s)", ", ".join(verdict.kept) or "none", why or f"self-check: {setting}")
    return verdict


def _probed(key: str, offered: tuple[str, ...], run_probe: Probe) -> tuple[str, dict[str, str], bool]:
    """(setting, failures, fresh): from the cache, else from running the probes (then cached)."""
    path = _cache_file(key)
    try:
        saved = json.loads(path.read_text())
        if saved.get("setting") in (*SETTINGS, BROKEN):
            return saved["setting"], dict(saved.get("failed", {})), False
    except (OSError, ValueError, AttributeError):
        pass
    setting, failed = run_check(offered, run_probe)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a temporary of its own: two commands checking at once each write theirs, the last one wins
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
            f.write(json.dumps({"setting": setting, "failed": failed, "offered": list(offered)}))
        Path(f.name).replace(path)
    except OSError as e:  # (a read-only cache: the check runs again next time, nothing else is lost)
        log.warning("could not save the CPU self-check's verdict in %s: %s", path, e)
    return setting, failed, True


def _say_avoided(setting: str, offered: tuple[str, ...], failed: dict[str, str], compiler: str) -> None:
    avoided = [b for b in offered if b not in kept_for(setting, offered)]
    log.warning(
        "llama.cpp's %s buffers crash on this CPU with this build (%s; built by %s), so models load without them; "
        "to fix the build: %s",
        " and ".join(avoided),
        _deaths(failed),
        compiler,
        rebuild_command(),
    )


def forget() -> None:
    """Drop the per-process decision (tests)."""
    _applied.clear()


def recheck(run_probe: Optional[Probe] = None) -> Verdict:
    """Run the probes again, whatever the cache said (`mtp-cli doctor`), and apply the verdict."""
    _cache_file(check_key()).unlink(missing_ok=True)
    forget()
    return ensure(run_probe=run_probe)


def cached() -> Optional[dict[str, Any]]:
    """What the cache holds for this build and CPU (None: the check has not run), without running it."""
    try:
        saved = json.loads(_cache_file(check_key()).read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def summary_lines() -> list[str]:
    """The build's compiler and AMX path, and the check's cached verdict (--version, doctor)."""
    offered, info = buffers.offered(), build_info()
    saved = cached()
    check = "not run yet (`mtp-cli doctor` runs it)"
    if not offered:
        check = "not needed (no extra buffer types)"
    elif saved is not None:
        deaths = _deaths(dict(saved.get("failed") or {}))
        check = f"models load with `{saved.get('setting')}`" + (f" ({deaths})" if deaths else " (it ran)")
    return [
        f"llama.cpp built by: {info.compiler}; AMX path: {'in the build' if info.amx else 'compiled out'}",
        f"extra buffer types offered: {', '.join(offered) or 'none'}",
        f"CPU self-check: {check}",
    ]


def _child(setting: str, folder: Path) -> int:
    """The probe itself: load each probe model with `setting`'s buffers, decode a 4-token batch."""
    lx.quiet_logs()
    buffers.keep(kept_for(setting, buffers.offered()))
    for path in sorted(folder.glob("probe-*.gguf")):
        with lx.load_model(path) as model:
            ctx = lx.create_context(model, n_ctx=64, n_batch=8, n_threads=2)
            batch = lx.Batch(8)
            batch.add_many([1, 40, 41, 42], 0, logits_last=True)  # more than one row: AMX's tile path
            lx.decode(ctx, batch)
    return 0


if __name__ == "__main__":  # python -m mtp_cli.cpu_check SETTING FOLDER (the probe's child)
    sys.exit(_child(sys.argv[1], Path(sys.argv[2])))
