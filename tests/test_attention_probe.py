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
        attention__value_length=16,
    )
    assert AttentionShape.of(hybrid) == AttentionShape(4, 4, 2, 32, 16)
    # what a llama block does not stand for: measured nowhere, so off as for one sequence
    for odd in (
        _file(attention__head_count_kv=[2, 4]),
        _file(attention__kv_lora_rank=512),
        _file(attention__sliding_window=4096),
        _file(attention__head_count=None),
    ):
        assert AttentionShape.of(odd) is None


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
    for broken in ("{", '{"on": true}', "[]"):
        path.write_text(broken)
        ap._verdicts.clear()
        assert ap.choose(SHAPE, 2, 2).on
    assert len(calls) == 4


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
        ap._verdicts.clear()
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
def test_the_probe_decodes_one_row_per_sequence_both_ways_on_this_cpu(monkeypatch):
    monkeypatch.setattr(ap, "DEPTHS", (16, 64))
    on_ms, off_ms = ap.measure(SHAPE, 3, 1)
    assert on_ms > 0 and off_ms > 0
    v = ap.choose(SHAPE, 3, 1)
    assert v.fresh and v.on == (v.on_ms <= ap.ON_MARGIN * v.off_ms)
