"""llama_ext.views: the address getters and cached float views equal what the bindings return."""

from __future__ import annotations

import numpy as np

from mtp_cli import llama_ext as lx
from mtp_cli.llama_ext.views import float_view


def test_logits_and_h_views_equal_the_bindings_rows(tiny_models):
    s = tiny_models("glm4moe")
    m = lx.load_model(s["full"], load_mtp=True)
    ctx = lx.create_context(m, n_ctx=64, n_batch=16, n_threads=1)
    try:
        lx.set_embeddings_nextn(ctx, True, False)
        V, E = lx.n_vocab(m), lx.n_embd_out(m)
        b, pos = lx.Batch(16), 0
        for step in range(3):  # (the buffers may move between decodes: every view must follow)
            b.clear()
            for i in range(4 + step):
                b.add(5 + i + step, pos, logits=True)
                pos += 1
            lx.decode(ctx, b)
            rows = lx.logits_rows(ctx, b.n_tokens, V)
            h = lx.get_embeddings_nextn(ctx, b.n_tokens, copy=False, n_embd=E)
            for i in range(b.n_tokens):
                np.testing.assert_array_equal(rows[i], lx.logits_ith(ctx, i))
            assert h.shape == (b.n_tokens, E) and np.isfinite(h).all() and h.any()
    finally:
        ctx.close()
        m.close()


def test_a_view_is_made_once_per_address_and_length():
    buf = np.arange(12, dtype=np.float32)
    a, n = buf.ctypes.data, buf.size
    v = float_view(a, n)
    assert v is float_view(a, n) and float_view(a, 6) is not v
    np.testing.assert_array_equal(float_view(a, 6), buf[:6])
    buf[3] = -1.0
    assert v[3] == -1.0  # a view, not a copy
