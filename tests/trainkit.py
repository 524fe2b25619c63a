"""Helpers for the train tests: tiny trunks and sources, the torch head's drafts, parity checks
against llama.cpp's MTP graph.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gguf_tools.archs import nextn_h_of
from gguf_tools.gguf_file import open_gguf
from mtp_cli import llama_ext as lx
from tests.factory import TinySpec, write_tiny_model
from tests.support import Pair

# Parity tolerance: the head block is stored F16 in the GGUF (read back exactly by the torch head) but
# llama.cpp rounds activations to F16 for F16 matmuls and keeps its KV cache in F16; measured max
# |diff| ~2.5e-3 on logits of magnitude ~5 (tiny models).
PARITY_RTOL = 2e-3  # max |torch - llama.cpp| <= PARITY_RTOL * max(1, max |logit|)


PARITY_TOP1 = 0.99


WORDS = ["the", "hello", "world", "a"]


def tiny_trunk(tmp: Path, arch: str = "llama", **kw) -> Path:
    return write_tiny_model(
        tmp / f"tiny-{arch}.gguf", TinySpec(arch=arch, kind="trunk", dtype="f32", n_trunk_layers=2, **kw)
    )


def tiny_train_job(d: Path, model: Path):
    """A short training run's job on a tiny trunk (the shared `trained` run's settings)."""
    from mtp_cli.train.data import CollectConfig
    from mtp_cli.train.pipeline import TrainJob
    from mtp_cli.train.trainer import TrainConfig

    txt, pr = tiny_sources(d)
    return TrainJob(
        model=model,
        out=d / "out.gguf",
        texts=[txt],
        prompts=pr,
        seed=0,
        collect=CollectConfig(max_len=64, max_new=32),
        train=TrainConfig(minutes=0, max_steps=120, batch_seqs=8, lr=3e-3, eval_every_s=1e9, eval_rows=512),
    )


def tiny_sources(tmp: Path, n_docs: int = 24, n_prompts: int = 24) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    txt, pr = tmp / "text.txt", tmp / "prompts.txt"
    txt.write_text("\n\n\n".join(" ".join(rng.choice(WORDS, 60)) for _ in range(n_docs)))
    pr.write_text("\n".join(" ".join(rng.choice(WORDS, 5)) + f" {i}" for i in range(n_prompts)))
    return txt, pr


def slot_head(full: Path):
    from mtp_cli.train.head import MtpHead
    from mtp_cli.train.trunk import Trunk, initial_weights

    tr = Trunk(full)
    return MtpHead.from_trunk(tr, initial_weights(tr, "slot"))


def torch_draft(head, toks: list[int], h: np.ndarray):
    """Step-1 logits and hout over the sequence, plus step-2 logits at every position (torch)."""
    import torch

    hp = np.concatenate([np.zeros((1, h.shape[1]), np.float32), h[:-1]])
    with torch.no_grad():
        hout, k, v = head(torch.tensor([toks]), torch.from_numpy(hp)[None])
        h2 = torch.cat([torch.zeros_like(hout[:, :1]), hout[:, :-1]], 1)
        s2 = head.logits(head.step2(torch.tensor([toks]), h2, k, v))[0].numpy()
        return head.logits(hout)[0].numpy(), hout[0].numpy(), s2


def llama_step2(pair: Pair, toks: list[int], h: np.ndarray, hrows: np.ndarray, j: int) -> np.ndarray:
    """What the MTP context drafts at step 2 for position j: rows 0..j-1 as caught up, then (x_j, its own h of j-1)."""
    lx.memory_seq_rm(pair.dft, 0, j, -1)
    b = lx.Batch(1, pair.E)
    b.add(toks[j], j, logits=True, h=hrows[j - 1])
    lx.decode(pair.dft, b)
    out = lx.logits_ith(pair.dft, 0)
    lx.memory_seq_rm(pair.dft, 0, j, -1)  # put the caught-up rows j.. back
    b = lx.Batch(len(toks) - j, pair.E)
    for p in range(j, len(toks)):
        b.add(toks[p], p, h=h[p - 1])
    lx.decode(pair.dft, b)
    return out


def check_parity(full: Path) -> None:
    head = slot_head(full)
    pair = Pair(full, arch="glm4moe")
    # an h row for every MTP row, to compare hout (every row is an output: a graph that selects the
    # output rows before h, step35's, gives them masked; unmasked it would abort)
    lx.set_embeddings_nextn(pair.dft, True, nextn_h_of(open_gguf(full).arch) == "output_rows")
    top1 = []
    try:
        for seed in range(3):  # 3 sequences of 64 positions (the Pair's batch size)
            toks = [1, *np.random.default_rng(seed).integers(3, 300, 63).tolist()]
            lx.memory_clear(pair.tgt)
            lx.memory_clear(pair.dft)
            _, h = pair.target_all(toks)
            want = pair.mtp_prefill(toks, h)
            hrows = lx.get_embeddings_nextn(pair.dft, len(toks))
            got, hout, s2 = torch_draft(head, toks, h)
            assert np.abs(got - want).max() <= PARITY_RTOL * max(1.0, float(np.abs(want).max()))
            top1 += list(got.argmax(-1) == want.argmax(-1))
            assert np.abs(hout - hrows).max() <= PARITY_RTOL * max(1.0, float(np.abs(hrows).max()))
            # draft step 2: the head's own h row, attending to the caught-up rows and itself
            for j in (1, 2, 37, len(toks) - 1):
                w2 = llama_step2(pair, toks, h, hrows, j)
                assert np.abs(s2[j] - w2).max() <= PARITY_RTOL * max(1.0, float(np.abs(w2).max())), j
        assert np.mean(top1) >= PARITY_TOP1
    finally:
        pair.close()


def check_rounded_parity(model: Path, head, toks: list[int], rel_tol: float) -> None:
    """torch head vs llama.cpp's MTP context on `toks`: logits within rel_tol x max(1, |logit|max), and
    top-1 different only at near-ties of llama.cpp's own logits (within that tolerance)."""
    pair = Pair(model, arch="glm4moe")
    try:
        _, h = pair.target_all(toks)
        want = pair.mtp_prefill(toks, h)
    finally:
        pair.close()
    got = torch_draft(head, toks, h)[0]
    tol = rel_tol * max(1.0, float(np.abs(want).max()))
    assert np.abs(got - want).max() <= tol
    rows = np.arange(len(toks))
    a, b = got.argmax(-1), want.argmax(-1)
    assert np.all((a == b) | (want[rows, b] - want[rows, a] <= tol))
