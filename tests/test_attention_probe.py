"""Flash attention for a context of several sequences (serve's slots): measured on this CPU by
decoding a model of the target's attention shape both ways (mtp_cli.attention_probe), kept per
llama.cpp build, CPU, shape, sequences and threads."""

from __future__ import annotations

from typing import Any

import pytest

from mtp_cli import attention_probe as ap
from mtp_cli import llama_ext as lx
from mtp_cli.attention_probe import AttentionShape
from mtp_cli.config import GenConfig
from mtp_cli.contexts import flash_attn_for
from mtp_cli.runtime import Runtime

SHAPE = AttentionShape(2, 4, 2, 16, 16)


class FakeFile:
    """A header's arch keys (GGUFFile.arch_get)."""

    def __init__(self, **kv: Any):
        self.kv = {k.replace("__", "."): v for k, v in kv.items()}

    def arch_get(self, name: str, default: Any = None) -> Any:
        return self.kv.get(name, default)


def _file(**kv: Any) -> Any:
    base = dict(block_count=30, embedding_length=576, attention__head_count=9, attention__head_count_kv=3)
    return FakeFile(**{**base, **kv})


def test_a_files_attention_shape():
    assert AttentionShape.of(_file()) == AttentionShape(ap.MAX_LAYERS, 9, 3, 64, 64)
    assert AttentionShape.of(_file(block_count=2, attention__head_count_kv=None)) == AttentionShape(2, 9, 9, 64, 64)
    # per layer, 0 where a layer has none (a hybrid's recurrent layers); head sizes of their own
    hybrid = _file(
        block_count=4,
        attention__head_count=[4, 4, 4, 4],
        attention__head_count_kv=[0, 2, 0, 2],
        attention__key_length=32,
        attention__value_length=32,
    )
    assert AttentionShape.of(hybrid) == AttentionShape(4, 4, 2, 32, 32)
    # what a llama block does not stand for, or an odd header: measured nowhere, so off as for one sequence
    for odd in (
        _file(attention__head_count_kv=[2, 4]),
        _file(attention__head_count=[9, 3]),
        _file(attention__kv_lora_rank=512),
        _file(attention__sliding_window=4096),
        _file(attention__head_count=None),
        _file(attention__key_length=32, attention__value_length=16),  # (llama wants them equal)
        _file(attention__key_length=63, attention__value_length=63),  # (rope wants an even size)
        _file(attention__key_length=4096, attention__value_length=4096),
        _file(attention__head_count=8, attention__head_count_kv=3),  # (groups of KV heads)
        _file(attention__head_count=1 << 20, attention__head_count_kv=1),
        _file(attention__head_count=True, attention__head_count_kv=True),
        _file(block_count="30"),
        _file(embedding_length=0),
        _file(attention__head_count_kv=[0, 0]),
        _file(attention__head_count_kv=["3"]),
    ):
        assert AttentionShape.of(odd) is None, odd.kv


def _measured(monkeypatch, on_ms: float, off_ms: float) -> list[tuple]:
    calls: list[tuple] = []
    monkeypatch.setattr(ap, "measure", lambda *a: calls.append(a) or (on_ms, off_ms))
    return calls


def test_the_probe_runs_once_per_shape_sequences_and_threads_then_its_verdict_is_kept(monkeypatch):
    calls = _measured(monkeypatch, 9.0, 10.0)
    v = ap.choose(SHAPE, 4, 2)
    assert v.on and v.fresh and calls == [(SHAPE, 4, 2)]
    assert ap.choose(SHAPE, 4, 2) is v  # (this process)
    ap._verdicts.clear()
    again = ap.choose(SHAPE, 4, 2)  # (the user cache: another command, another day)
    assert again.on and not again.fresh and again.ms == (9.0, 10.0) and len(calls) == 1
    calls = _measured(monkeypatch, 9.8, 10.0)  # (within ON_MARGIN: off)
    assert not ap.choose(SHAPE, 2, 2).on
    assert not ap.choose(SHAPE, 4, 1).on
    assert len(calls) == 2
    ap.forget()  # (mtp-cli doctor)
    assert not ap.choose(SHAPE, 4, 2).on and len(calls) == 3


def test_a_cache_file_that_is_not_a_verdict_is_measured_again(monkeypatch, isolated_dirs):
    calls = _measured(monkeypatch, 1.0, 2.0)
    ap.choose(SHAPE, 2, 2)
    (path,) = (isolated_dirs["cache"] / "attention").glob("*.json")
    broken = (
        "{",
        '{"on": true}',
        "[]",
        '{"on": "false", "on_ms": 3, "off_ms": 1}',
        '{"on": false, "on_ms": 1e999, "off_ms": 1}',
    )
    for text in (*broken, "[" * 100_000):
        path.write_text(text)
        ap._verdicts.clear()
        assert ap.choose(SHAPE, 2, 2).on
    assert len(calls) == 1 + len(broken) + 1


def test_a_probe_that_cannot_run_says_off_and_is_measured_again_next_time(monkeypatch, isolated_dirs):
    from mtp_cli.errors import LlamaError

    def fails(*a):
        raise LlamaError("llama.cpp failed to load the model")

    monkeypatch.setattr(ap, "measure", fails)
    v = ap.choose(SHAPE, 2, 2)
    assert not v.on and not list((isolated_dirs["cache"] / "attention").glob("*.json"))
    ap._verdicts.clear()
    _measured(monkeypatch, 1.0, 2.0)
    assert ap.choose(SHAPE, 2, 2).on


def test_several_sequences_get_the_probes_verdict_and_one_sequence_stays_off(monkeypatch):
    calls = _measured(monkeypatch, 1.0, 2.0)
    assert flash_attn_for(GenConfig(), True, 4, SHAPE) is True
    assert flash_attn_for(GenConfig(), True, 1, SHAPE) is False
    assert flash_attn_for(GenConfig(), True, 4, None) is False  # (a shape nobody measured)
    assert flash_attn_for(GenConfig(flash_attn=False), True, 4, SHAPE) is False  # (-fa off)
    assert flash_attn_for(GenConfig(cache_type_v="q8_0"), True, 4, SHAPE) is None  # (a quantized V needs it)
    assert flash_attn_for(GenConfig(), False, 4, SHAPE) is None  # (offloaded: llama.cpp's auto)
    assert flash_attn_for(GenConfig(cache_type_k="bf16", n_threads=1), True, 2, SHAPE) is True
    assert calls[-1] == (AttentionShape(2, 4, 2, 16, 16, "bf16", "f16"), 2, 1)  # (the cells' type is measured)


def test_a_runtime_of_several_slots_creates_its_target_context_as_the_probe_chose(tiny_models, monkeypatch):
    model = tiny_models("glm4moe")["full"]
    made: list[dict] = []
    real = lx.create_context
    monkeypatch.setattr(lx, "create_context", lambda *a, **k: made.append(k) or real(*a, **k))
    for on_ms, expected in ((1.0, True), (3.0, False)):
        _measured(monkeypatch, on_ms, 2.0)
        ap.forget()
        with Runtime.load(model, spec_type="none", n_parallel=2) as rt:
            assert rt.attn == AttentionShape(3, 4, 2, 16, 16)
            made.clear()
            rt.contexts(GenConfig(n_ctx=256))
            assert [k["kv"].flash_attn for k in made] == [expected]
        with Runtime.load(model, spec_type="none") as rt:
            made.clear()
            rt.contexts(GenConfig(n_ctx=256))
            assert [k["kv"].flash_attn for k in made] == [False]


@pytest.mark.measured_attention
def test_a_probe_keeps_its_kv_cells_within_the_budget(monkeypatch):
    loads: list = []
    monkeypatch.setattr(lx, "load_model", lambda *a, **k: loads.append(a) or pytest.fail("loaded"))
    big = AttentionShape(8, 64, 64, 128, 128)  # (a layer's cells at 64 sequences: 2.2 GB)
    assert ap.measure(big, 64, 2) == (0.0, 0.0) and not loads
    assert not ap.choose(big, 64, 2).on
    cells = (max(ap.DEPTHS) + ap.BLOCK + 8) * 2 * 2  # (SHAPE's KV heads at 2 sequences, a layer of a context)
    monkeypatch.setattr(ap, "KV_BUDGET", 3 * 2 * cells * (16 * 2 + 16 * 2))  # (three layers, both contexts, f16)
    written: list = []
    real = ap.write_attention_probe
    monkeypatch.setattr(ap, "write_attention_probe", lambda *a, **k: written.append(k) or real(*a, **k))
    with pytest.raises(pytest.fail.Exception):  # (the load refused: only the layer count matters here)
        ap.measure(AttentionShape(8, 4, 2, 16, 16), 2, 1)
    assert written[0]["n_layer"] == 3


@pytest.mark.measured_attention
def test_the_probe_decodes_one_row_per_sequence_both_ways_on_this_cpu(monkeypatch):
    monkeypatch.setattr(ap, "DEPTHS", (16, 64))
    made: list[tuple[Any, dict]] = []
    real_create, real_timed = lx.create_context, ap.timed
    monkeypatch.setattr(lx, "create_context", lambda *a, **k: made.append((real_create(*a, **k), k)) or made[-1][0])
    rows: list[tuple[bool, int, int]] = []

    def timed(ctx, n_seq, depth, *a):  # (the real decodes, each context's setting recorded)
        kv = next(k["kv"] for c, k in made if c is ctx)
        rows.append((kv.flash_attn, n_seq, depth))
        return real_timed(ctx, n_seq, depth, *a)

    monkeypatch.setattr(ap, "timed", timed)
    on_ms, off_ms = ap.measure(SHAPE, 3, 1)
    assert on_ms > 0 and off_ms > 0
    assert sorted({k["kv"].flash_attn for _, k in made}) == [False, True] and all(k["n_seq_max"] == 3 for _, k in made)
    assert sorted(set(rows)) == [(on, 3, d) for on in (False, True) for d in (16, 64)]
    assert len(rows) == 2 * 2 * ap.ROUNDS


@pytest.mark.measured_attention
def test_the_probe_adds_each_settings_decodes_to_its_own_side(monkeypatch):
    """(with, without) come from the contexts created with and without flash attention, summed over DEPTHS."""
    made: dict[int, bool] = {}
    real_create = lx.create_context

    def create(*a, **k):
        ctx = real_create(*a, **k)
        made[id(ctx)] = k["kv"].flash_attn
        return ctx

    monkeypatch.setattr(lx, "create_context", create)
    monkeypatch.setattr(ap, "DEPTHS", (16, 32))
    monkeypatch.setattr(ap, "timed", lambda ctx, *a: [0.001 if made[id(ctx)] else 0.002] * 3)
    assert ap.measure(SHAPE, 2, 1) == pytest.approx((2.0, 4.0))


def test_a_server_of_several_slots_runs_and_says_the_attention_its_probe_chose(tiny_models, monkeypatch, capsys):
    pytest.importorskip("fastapi")
    from mtp_cli.cli.serve import _say_serving
    from mtp_cli.config import LoadConfig
    from mtp_cli.serve.engine import Engine

    model = tiny_models("glm4moe")["full"]
    for on_ms, on in ((1.0, True), (3.0, False)):
        _measured(monkeypatch, on_ms, 2.0)
        ap.forget()
        engine = Engine.load(model, GenConfig(n_ctx=512, n_threads=1), load=LoadConfig(n_parallel=2))
        try:
            assert engine.flash_attn is on and engine.rt._ctx.key.kv.flash_attn is on
            _say_serving(engine, ("127.0.0.1", 8080), False)
            assert f", 2 slots, flash attention {'on' if on else 'off'}, context 256)" in capsys.readouterr().err
        finally:
            engine.close()


def test_auto_looks_for_the_profile_of_the_attention_its_slots_run_with(tiny_models, monkeypatch):
    """Profiles are keyed by the resolved flash attention: a server whose probe turned it on for its
    slots does not take a profile tuned without it."""
    from gguf_tools.gguf_file import open_gguf
    from mtp_cli.speed import profiles
    from mtp_cli.speed.auto import AutoDraft

    model = tiny_models("glm4moe")["full"]
    for on_ms, on in ((1.0, True), (3.0, False)):
        _measured(monkeypatch, on_ms, 2.0)
        ap.forget()
        with Runtime.load(model, spec_type="mtp", n_parallel=2) as rt:
            where = dict(n_gpu_layers=rt.config.n_gpu_layers, placement=rt.config.placement)
            want = profiles.identify(open_gguf(model), None, n_threads=1, flash_attn=on, **where).key
            assert AutoDraft(rt).profile_key(GenConfig(n_threads=1)) == want
