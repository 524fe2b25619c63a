"""Adopting a Llama 3.x trunk (llama with llama 3 rope factors) as step35 (gguf_tools.adopt_step35):
the trunk's logits are llama.cpp's own for the source over a text long enough for the factors to act,
the file loads and decodes with its head slot (drafted output = plain), and what is not built yet
(training its head) is one line."""

from __future__ import annotations

from dataclasses import replace
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
    spec = TinySpec(arch="llama", kind="trunk", n_trunk_layers=3, trunk_mix=1.0, llama3_rope_orig=64)  # type: ignore[arg-type]
    return write_tiny_model(tmp_path_factory.mktemp("llama3") / "llama3.gguf", spec)


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
    with Runtime.load(out, spec_type="mtp") as rt:
        prompt = rt.tokenize("hello world the")
        cfg = GenConfig(temp=0.0, n_predict=24, n_threads=1, n_ctx=256)
        plain = [e.token for e in rt.generate(prompt, cfg)]
        gen = rt.generate(
            prompt, GenConfig(temp=0.0, n_predict=24, n_threads=1, n_ctx=256, spec_type="mtp", draft_n_max=2)
        )
        assert [e.token for e in gen] == plain and gen.stats.n_drafted > 0


def test_the_torch_head_computes_what_llama_cpps_step35_mtp_graph_does(llama3, tmp_path):
    """The trainer's mirror of step35's head (h before the output norm, no rope factors on the
    sliding-window head block) against llama.cpp: step 1, its h rows, and draft step 2."""
    pytest.importorskip("torch").set_num_threads(1)
    from tests.trainkit import check_parity

    out = tmp_path / "adopted.gguf"
    ops.adopt(llama3, out)
    check_parity(out)


def test_a_short_training_run_gives_the_adopted_llama3_a_head_that_drafts(llama3, tmp_path):
    """train on the tiny Llama-3-style trunk (adopted on the fly as step35): greedy output with the
    trained head equals plain decoding's, with drafts accepted."""
    pytest.importorskip("torch").set_num_threads(1)
    from mtp_cli.train.pipeline import run_train
    from tests.trainkit import tiny_train_job

    job = tiny_train_job(tmp_path, llama3)
    run_train(job)
    assert open_gguf(job.out).arch == TARGET
    with Runtime.load(job.out, spec_type="mtp") as rt:
        prompt = rt.tokenize("hello world the a")
        cfg = GenConfig(temp=0.0, n_predict=48, n_threads=1, n_ctx=256, ignore_eos=True)
        plain = [e.token for e in rt.generate(prompt, cfg)]
        gen = rt.generate(prompt, replace(cfg, spec_type="mtp", draft_n_max=2))
        assert [e.token for e in gen] == plain and gen.stats.n_accepted > 0, gen.stats.acceptance


def test_inspect_says_it_adopts_as_step35(llama3):
    from gguf_tools.report import inspect_file

    rep = inspect_file(llama3)
    assert rep.adoptable and "re-expressed exactly as step35" in rep.advice and "mtp-cli adopt" in rep.advice


def test_a_step35_rope_llama_cpp_would_abort_on_is_one_line(llama3, tmp_path):
    """The head block rotates rope.dimension_count_swa dims; left out, it is the unhalved count (twice
    the head dimension), on which ggml's rope asserts: refused before llama.cpp sees the file."""
    from gguf import GGUFValueType

    from gguf_tools.errors import BadFileError
    from gguf_tools.loadable import require_loadable

    out = tmp_path / "adopted.gguf"
    ops.adopt(llama3, out)
    require_loadable(open_gguf(out).scan, out, mtp=True)
    for kvs, drop in (
        ({}, ("step35.rope.dimension_count_swa",)),
        ({"step35.rope.dimension_count_swa": (18, GGUFValueType.UINT32)}, ()),
    ):
        bad = edited(out, tmp_path / "bad.gguf", kvs=kvs, drop_kvs=drop)
        with pytest.raises(BadFileError, match="step35.rope.dimension_count_swa"):
            require_loadable(open_gguf(bad).scan, bad, mtp=True)
