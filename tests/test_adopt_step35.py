"""Adopting a Llama 3.x trunk (llama with llama 3 rope factors) as step35 (gguf_tools.adopt_step35):
the trunk's logits are llama.cpp's own for the source over a text long enough for the factors to act,
the file loads and decodes with its head slot (drafted output = plain), and what is not built yet
(training its head) is one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from gguf_tools import ops
from gguf_tools.adopt_step35 import TARGET
from gguf_tools.adopt_step35 import blocker as adopt_blocker
from gguf_tools.gguf_file import open_gguf
from mtp_cli.cli import main
from mtp_cli.config import GenConfig
from mtp_cli.runtime import Runtime
from tests.factory import TinySpec, write_tiny_model
from tests.hostile import edited
from tests.test_adopt import teacher_forced


@pytest.fixture(scope="module")
def llama3(tmp_path_factory) -> Path:
    """A tiny llama with llama 3 rope factors whose original context is short (so they act)."""
    sys_path = Path(__file__).resolve().parents[1] / "benchmarks"
    import sys

    sys.path.insert(0, str(sys_path))
    from step35_probe import llama3_factors

    root = tmp_path_factory.mktemp("llama3")
    spec = TinySpec(arch="llama", kind="trunk", n_trunk_layers=3, trunk_mix=1.0)  # type: ignore[arg-type]
    base = write_tiny_model(root / "llama.gguf", spec)
    factors = llama3_factors(spec.head_dim, spec.rope_theta, 8.0, 1.0, 4.0, 64)
    return edited(base, root / "llama3.gguf", add=(("rope_freqs.weight", factors),))


def test_a_llama3_trunk_adopts_as_step35_and_keeps_its_logits(llama3, tmp_path):
    assert adopt_blocker(open_gguf(llama3)) is None
    out = tmp_path / "adopted.gguf"
    r = CliRunner().invoke(main, ["adopt", str(llama3), "-o", str(out)])
    assert r.exit_code == 0, r.output
    gf = open_gguf(out)
    assert gf.arch == TARGET and gf.layout().nextn_layers == 1
    src = open_gguf(llama3)
    for name in ("token_embd.weight", "rope_freqs.weight", "blk.1.attn_v.weight", "blk.2.ffn_down.weight"):
        a, b = src.tensors[name], gf.tensors[name]
        assert (
            src.path.read_bytes()[a.offset : a.offset + a.n_bytes]
            == gf.path.read_bytes()[b.offset : b.offset + b.n_bytes]
        )
    toks = [1] + np.random.default_rng(0).integers(3, 259, 399).tolist()
    ref, got = teacher_forced(llama3, toks), teacher_forced(out, toks)
    assert np.abs(ref - got).max() < 2e-3 and (ref.argmax(1) == got.argmax(1)).mean() > 0.99


def test_the_adopted_file_decodes_with_its_head_slot(llama3, tmp_path):
    out = tmp_path / "adopted.gguf"
    ops.adopt(llama3, out)
    with Runtime(out, spec_type="mtp") as rt:
        prompt = rt.tokenize("hello world the")
        cfg = GenConfig(temp=0.0, n_predict=24, n_threads=1, n_ctx=256)
        plain = [e.token for e in rt.generate(prompt, cfg)]
        gen = rt.generate(
            prompt, GenConfig(temp=0.0, n_predict=24, n_threads=1, n_ctx=256, spec_type="mtp", draft_n_max=2)
        )
        assert [e.token for e in gen] == plain and gen.stats.n_drafted > 0


def test_training_its_head_is_one_line_for_now(llama3, tmp_path):
    out = tmp_path / "adopted.gguf"
    ops.adopt(llama3, out)
    from gguf_tools.errors import RefusedError
    from mtp_cli.train.trunk import TrunkParams

    with pytest.raises(RefusedError, match="cannot be trained yet"):
        TrunkParams.from_gguf(open_gguf(out))


def test_inspect_says_it_adopts_as_step35(llama3):
    from gguf_tools.report import inspect_file

    rep = inspect_file(llama3)
    assert rep.adoptable and "re-expressed exactly as step35" in rep.advice and "mtp-cli adopt" in rep.advice
