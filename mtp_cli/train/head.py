"""The glm4moe MTP head block in torch: exactly what llama.cpp's `graph_mtp` computes.

At position p, from token x_p and h = the trunk's hidden state of position p-1 after output_norm
(gguf_tools.glm4moe_head has the graph written out):

    x    = eh_proj @ concat(rms(embed(x_p)) * enorm, rms(h) * hnorm)      the embedding half first
    x    = x + attn_output @ attn(rms(x) * attn_norm)    causal over the head's own rows, NEOX rope
    x    = x + down(silu(gate y) * up y),  y = rms(x) * post_attention_norm   (the single-expert MoE)
           (+ the same over the shared expert's weights when it is trained: a twice-as-wide MLP)
    hout = rms(x) * (shared_head_norm, else output_norm)   what llama_get_embeddings_nextn_ith returns
    logits = output @ hout                                 the trunk's output matrix (or shared_head_head)

The embedding and the output matrix are the trunk's, dequantized and frozen (buffers); everything
else is a trainable parameter. Draft step 2 at decode time feeds token d1 at position p+1 with the
head's own `hout` of position p and attends to the catch-up rows 0..p plus itself: `step2` computes
that for every position at once (`forward` returns the K/V it needs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mtp_cli.train.trunk import Trunk, TrunkParams

FROZEN = ("embed_tokens", "shared_head_head")  # head-owned but never trained here


def _p(name: str) -> str:
    return name.replace(".", "_")


# ggml CPU: the type activations are converted to for a matmul with weights of this type
_ACT_ROUNDING = {"Q8_0": "q8", "Q4_0": "q8", "Q5_0": "q8", "Q4_1": "q8", "Q5_1": "q8", "F16": "f16"}


def q8_round(x: torch.Tensor) -> torch.Tensor:
    """x as ggml's quantize_row_q8_0 leaves it: blocks of 32, d = amax / 127 stored as F16, q = round(x / d)."""
    shape = x.shape
    b = x.reshape(-1, 32)
    d = b.abs().amax(-1, keepdim=True) / 127.0
    q = torch.round(torch.where(d > 0, b / d, torch.zeros_like(b)))
    return (q * d.to(torch.float16).float()).reshape(shape)


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class MtpHead(nn.Module):
    embed: torch.Tensor  # buffers (frozen, not saved)
    output: torch.Tensor
    output_norm: torch.Tensor
    inv_freq: torch.Tensor

    def __init__(
        self,
        params: TrunkParams,
        weights: Mapping[str, np.ndarray],
        embed: np.ndarray,
        output: np.ndarray,
        output_norm: np.ndarray,
        *,
        fast: bool = False,
        output_act: str | None = None,
    ):
        """`weights`: the head's short-named weights (glm4moe_head names; shared_head_norm optional).
        `fast`: multiply by the frozen output matrix in bfloat16 (about 2.5x faster on CPUs with
        AVX512-BF16), and by the block's weights too in training mode (a step 1.5x faster; norms,
        residuals and attention stay float32). For training. Parity checks use float32.
        `output_act` ("q8" or "f16"): round
        the output matmul's input as ggml's CPU kernels do for the output matrix's type (Q8_0-family
        weights quantize the activations to Q8_0 blocks; F16 weights round them to F16)."""
        super().__init__()
        self.params = params
        d = params.dims
        self.eps = params.eps
        self.n_head, self.n_head_kv, self.head_dim = d.n_head, d.n_head_kv, d.head_dim
        self.w = nn.ParameterDict()
        for name, arr in weights.items():
            if name in FROZEN:
                continue
            self.w[_p(name)] = nn.Parameter(torch.from_numpy(np.array(arr, dtype=np.float32)))
        emb = torch.from_numpy(np.asarray(weights.get("embed_tokens", embed), dtype=np.float32))
        out = weights.get("shared_head_head")
        out_t = (
            emb
            if out is None and output is embed
            else torch.from_numpy(np.asarray(output if out is None else out, dtype=np.float32))
        )
        self.register_buffer("embed", emb, persistent=False)
        self.register_buffer("output", out_t, persistent=False)
        self.register_buffer(
            "output_norm", torch.from_numpy(np.asarray(output_norm, dtype=np.float32)), persistent=False
        )
        self.fast = bool(fast)
        self.output_act = output_act
        self._out_bf16 = out_t.to(torch.bfloat16) if fast else None
        half = params.n_rot // 2
        self.register_buffer(
            "inv_freq",
            torch.tensor(
                [params.rope_scale * params.rope_base ** (-2.0 * i / params.n_rot) for i in range(half)],
                dtype=torch.float64,
            ),
            persistent=False,
        )

    @classmethod
    def from_trunk(
        cls, trunk: Trunk, weights: Mapping[str, np.ndarray], *, fast: bool = False, ggml_rounding: bool = False
    ) -> MtpHead:
        """`ggml_rounding`: emulate how llama.cpp's CPU matmul rounds the output matmul's input (for
        parity checks against a Q8_0 / F16 output matrix)."""
        emb = trunk.embed()
        out = emb if trunk.params.tied_output else trunk.output()
        act = None
        if ggml_rounding:
            own = f"blk.{trunk.params.n_trunk}.nextn.shared_head_head.weight"
            name = (
                own
                if "shared_head_head" in weights
                else ("token_embd.weight" if trunk.params.tied_output else "output.weight")
            )
            t = trunk.gf.tensors.get(name)
            act = _ACT_ROUNDING.get(t.type.name) if t is not None else None
        return cls(trunk.params, weights, emb, out, trunk.output_norm(), fast=fast, output_act=act)

    def has(self, name: str) -> bool:
        return _p(name) in self.w

    def W(self, name: str) -> torch.Tensor:
        return self.w[_p(name)]

    def weights(self) -> dict[str, np.ndarray]:
        """The trainable weights as short-named float32 arrays (for export)."""
        return {k.replace("_bias", ".bias"): v.detach().cpu().numpy().astype(np.float32) for k, v in self.w.items()}

    # -- pieces -----------------------------------------------------------------------------------

    def mm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x @ W(name).T, in bfloat16 (result float32) when training a `fast` head."""
        w = self.W(name)
        if self.fast and self.training:
            return (x.to(torch.bfloat16) @ w.to(torch.bfloat16).T).float()
        return x @ w.T

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """NEOX rope over the first n_rot dims of x (B, H, T, D); pos (B, T) or (T,)."""
        n = self.params.n_rot
        half = n // 2
        ang = pos.to(torch.float64)[..., None] * self.inv_freq  # (B?, T, half)
        if ang.dim() == 2:
            ang = ang[None]
        cos, sin = ang.cos().to(x.dtype)[:, None], ang.sin().to(x.dtype)[:, None]  # (B, 1, T, half)
        x1, x2, rest = x[..., :half], x[..., half:n], x[..., n:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)

    def inputs(self, tokens: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        e = rms(F.embedding(tokens, self.embed), self.W("enorm"), self.eps)
        g = rms(h, self.W("hnorm"), self.eps)
        return self.mm(torch.cat([e, g], dim=-1), "eh_proj")

    def qkv(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        a = rms(x, self.W("attn_norm"), self.eps)

        def proj(name: str, nh: int) -> torch.Tensor:
            y = self.mm(a, name)
            if self.has(name + ".bias"):
                y = y + self.W(name + ".bias")
            return y.view(B, T, nh, self.head_dim).transpose(1, 2)  # (B, H, T, D)

        q, k, v = proj("attn_q", self.n_head), proj("attn_k", self.n_head_kv), proj("attn_v", self.n_head_kv)
        if self.has("attn_q_norm"):
            q = rms(q, self.W("attn_q_norm"), self.eps)
        if self.has("attn_k_norm"):
            k = rms(k, self.W("attn_k_norm"), self.eps)
        return self.rope(q, pos), self.rope(k, pos), v

    def _expand(self, t: torch.Tensor) -> torch.Tensor:
        r = self.n_head // self.n_head_kv
        return t if r == 1 else t.repeat_interleave(r, dim=1)  # query head i reads kv head i // r

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Attention output (B, H, T, D) -> residual, FFN, the head's output norm: hout (B, T, E)."""
        B, H, T, D = attn.shape
        x = x + self.mm(attn.transpose(1, 2).reshape(B, T, H * D), "attn_output")
        y = rms(x, self.W("post_attention_norm"), self.eps)
        x = x + self.mm(F.silu(self.mm(y, "ffn_gate")) * self.mm(y, "ffn_up"), "ffn_down")
        if self.has("ffn_down_shexp"):  # glm4moe's shared expert: the MLP's second half
            x = x + self.mm(F.silu(self.mm(y, "ffn_gate_shexp")) * self.mm(y, "ffn_up_shexp"), "ffn_down_shexp")
        return x if self.params.h_prenorm else self.head_norm(x)

    def head_norm(self, x: torch.Tensor) -> torch.Tensor:
        norm = self.W("shared_head_norm") if self.has("shared_head_norm") else self.output_norm
        return rms(x, norm, self.eps)

    # -- the two draft steps ----------------------------------------------------------------------

    def forward(
        self, tokens: torch.Tensor, h: torch.Tensor, pos: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Draft step 1 over whole sequences (the catch-up rows): tokens (B, T), h (B, T, E) = the
        trunk's h of the previous position (zeros at 0). Returns (hout, k, v); causal attention."""
        T = tokens.shape[1]
        if pos is None:
            pos = torch.arange(T)
        x = self.inputs(tokens, h)
        q, k, v = self.qkv(x, pos)
        attn = F.scaled_dot_product_attention(q, self._expand(k), self._expand(v), is_causal=True)
        return self.finish(x, attn), k, v

    def step2(
        self,
        tokens: torch.Tensor,
        h_own: torch.Tensor,
        k1: torch.Tensor,
        v1: torch.Tensor,
        pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Draft step 2 at every position j: token x_j with the head's own hout of j-1 (h_own, row j),
        attending to step-1 rows 0..j-1 (k1, v1) and to itself, as the MTP context does while drafting."""
        T = tokens.shape[1]
        if pos is None:
            pos = torch.arange(T)
        x = self.inputs(tokens, h_own)
        q, k2, v2 = self.qkv(x, pos)
        k1e, v1e, k2e, v2e = map(self._expand, (k1, v1, k2, v2))
        scale = 1.0 / math.sqrt(self.head_dim)
        s1 = (q @ k1e.transpose(-1, -2)) * scale  # (B, H, T, T)
        strict = torch.ones(T, T, dtype=torch.bool).tril(-1)
        s1 = s1.masked_fill(~strict, float("-inf"))
        s_self = (q * k2e).sum(-1, keepdim=True) * scale
        w = torch.softmax(torch.cat([s1, s_self], dim=-1), dim=-1)
        attn = w[..., :T] @ v1e + w[..., T:] * v2e
        return self.finish(x, attn)

    def logits(self, hout: torch.Tensor, cols: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (float32) of hout rows (..., E): over the full vocabulary, or only the columns `cols`
        (a step35 hout is the block's output before the head's norm: normed here)."""
        if self.params.h_prenorm:
            hout = self.head_norm(hout)
        if self.fast and self._out_bf16 is not None:
            w = self._out_bf16 if cols is None else self._out_bf16[cols]
            return (hout.to(torch.bfloat16) @ w.T).float()
        if self.output_act == "q8":
            hout = q8_round(hout)
        elif self.output_act == "f16":
            hout = hout.to(torch.float16).float()
        return hout @ (self.output if cols is None else self.output[cols]).T


__all__ = ["MtpHead", "rms", "FROZEN"]
