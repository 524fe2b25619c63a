"""What one training step computes: store sequences as padded tensors (Batcher) and the losses.

Losses: "kl" = cross-entropy to the trunk's top-K distribution (renormalised; = KL up to a
constant), "ce" = cross-entropy on the trunk's top-1 token, "mix" = their mean; the feature loss
pulls the head's h towards the trunk's h of the same row (EAGLE's feature regression).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mtp_cli.train.data import Store

LOSSES = ("kl", "ce", "mix")


class Batcher:
    """Whole sequences from the store as padded tensors."""

    def __init__(self, store: Store):
        self.store = store

    def make(self, seqs: list[dict], prompt_weight: float = 1.0) -> dict[str, torch.Tensor]:
        """`weight`: 1 on answer and text rows, `prompt_weight` on a prompt's own rows (never drafted at
        decode time); `answer`: the rows decode-time drafting sees (answers, or whole text windows)."""
        T = max(s["len"] for s in seqs)
        B, E, K = len(seqs), self.store.E, self.store.K
        tokens = np.zeros((B, T), np.int64)
        hprev = np.zeros((B, T, E), np.float32)
        hcur = np.zeros((B, T, E), np.float32)
        ids = np.zeros((B, T, K), np.int64)
        lp = np.full((B, T, K), -1e4, np.float32)
        valid = np.zeros((B, T), bool)
        answer = np.zeros((B, T), bool)
        for b, s in enumerate(seqs):
            d = self.store.sequence(s)
            n = s["len"]
            tokens[b, :n] = d["tokens"]
            hprev[b, 1:n] = d["h"][: n - 1]
            hcur[b, :n] = d["h"][:n]
            ids[b, :n] = d["topk_id"]
            lp[b, :n] = d["topk_lp"]
            valid[b, :n] = True
            answer[b, s.get("n_prompt", 0) : n] = True
        valid2 = np.zeros_like(valid)
        valid2[:, 1:] = valid[:, 1:] & (tokens[:, 1:] == ids[:, :-1, 0])  # x_j is the trunk's greedy after j-1
        t = torch.from_numpy
        weight = np.where(answer, 1.0, prompt_weight).astype(np.float32)
        return {
            "tokens": t(tokens),
            "hprev": t(hprev),
            "hcur": t(hcur),
            "ids": t(ids),
            "lp": t(lp),
            "valid": t(valid),
            "valid2": t(valid2),
            "answer": t(answer),
            "weight": t(weight),
        }


def feature_loss(hout: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Smooth-L1 between the head's h and the trunk's h of the same row (EAGLE's feature regression),
    weighted mean over rows."""
    w = w / w.sum().clamp_min(1e-6)
    return (F.smooth_l1_loss(hout, h, reduction="none").mean(-1) * w).sum()


def loss(logits: torch.Tensor, ids: torch.Tensor, lp: torch.Tensor, kind: str, w: torch.Tensor) -> torch.Tensor:
    """Weighted mean over rows (weights `w`); `ids` index the columns of `logits` (the vocabulary, or
    the sampled candidates)."""
    logq = torch.log_softmax(logits, dim=-1)
    w = w / w.sum().clamp_min(1e-6)
    ce = -(logq.gather(-1, ids[:, :1]).squeeze(-1) * w).sum()
    if kind == "ce":
        return ce
    p = torch.softmax(lp, dim=-1)  # the trunk's top-K, renormalised
    kl = -((p * logq.gather(-1, ids)).sum(-1) * w).sum()
    return kl if kind == "kl" else 0.5 * (kl + ce)


__all__ = ["Batcher", "LOSSES", "loss", "feature_loss"]
