"""gguf_tools.archs: one record per architecture, and every check reads the table when it runs.
Adding an MTP architecture is one record: a fake one, registered, is picked up by the limits, the
key and hparam checks, pack's refusal, safetensors heads and inspect's readiness."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from gguf_tools import archs
from gguf_tools.archs import ArchRecord, registered
from gguf_tools.errors import MismatchError
from gguf_tools.gguf_file import open_gguf
from gguf_tools.hf.naming import QWEN, family_of
from gguf_tools.limits import RULE
from gguf_tools.loadable import problems
from gguf_tools.loadable.keys import required_keys
from gguf_tools.names import ADOPTABLE_ARCHS, MTP_ARCHS

FAKE = ArchRecord(
    "fakemtp",
    mtp_graph=True,
    one_head_block=True,
    recurrent=True,
    rms=True,
    hf_family="qwen",
    required=("expert_shared_count",),
)


def _header_only(path: Path) -> Path:
    """A fakemtp file: two head blocks (of two), no rms epsilon, no expert_shared_count, no tensors."""
    w = gguf.GGUFWriter(path, "fakemtp")
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_block_count(2)
    w.add_nextn_predict_layers(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_table_is_the_one_source_of_the_sets():
    assert MTP_ARCHS is archs.MTP_ARCHS and "glm4moe" in MTP_ARCHS and "llama" not in MTP_ARCHS
    assert list(ADOPTABLE_ARCHS) == ["llama", "qwen2", "qwen3"]
    assert set(archs.RECURRENT_ARCHS) == {"qwen35", "qwen35moe", "qwen3next"}
    assert dict(archs.ASSISTANT_FOR) == {"gemma4": "gemma4-assistant"}
    assert set(archs.ASSISTANT_ARCHS) == {"gemma4-assistant"}
    assert set(archs.HF_HEAD_ARCHS) == {"qwen35", "qwen35moe", "qwen3next", "glm4moe", "deepseek2"}
    assert required_keys("qwen35moe") == required_keys("qwen35")


def test_a_new_record_reaches_every_check(tmp_path):
    path = _header_only(tmp_path / "fake.gguf")
    before = {p.rule.id for p in problems(open_gguf(path).scan, mtp=True)}
    assert "fakemtp" not in MTP_ARCHS
    with pytest.raises(MismatchError, match="fakemtp"):
        family_of("fakemtp")
    with registered(FAKE):
        assert "fakemtp" in MTP_ARCHS and "fakemtp" in archs.RECURRENT_ARCHS
        assert family_of("fakemtp") is QWEN
        assert RULE["head-tensors"].applies("fakemtp") and RULE["recurrent-interval"].applies("fakemtp")
        found = problems(open_gguf(path).scan, mtp=True)
        after = {p.rule.id for p in found}
        missing = {p.key for p in found if p.rule.id == "required-key"}
        assert {"fakemtp.attention.layer_norm_rms_epsilon", "fakemtp.expert_shared_count"} <= missing
        assert {"one-head-block", "head-tensors"} <= after - before
    assert "fakemtp" not in MTP_ARCHS and not RULE["head-tensors"].applies("fakemtp")


def test_pack_and_inspect_read_the_table(tmp_path):
    from gguf_tools.errors import RefusedError
    from gguf_tools.report import inspect_gguf
    from gguf_tools.surgery import HeadSet, plan_pack

    gf = open_gguf(_header_only(tmp_path / "fake.gguf"))
    no_graph = "has no MTP graph for architecture 'fakemtp'"
    with pytest.raises(RefusedError, match=no_graph):
        plan_pack(gf, HeadSet(tmp_path, 0, 1, []))
    plain = inspect_gguf(gf)
    with registered(FAKE):
        try:
            plan_pack(gf, HeadSet(tmp_path, 0, 1, []))
        except RefusedError as e:
            assert no_graph not in str(e)
        except Exception:
            pass  # (past the arch check: this header-only file fails later, as it should)
        assert (inspect_gguf(gf).verdict, inspect_gguf(gf).advice) != (plain.verdict, plain.advice)
