"""Gemma 4's assistant drafter (gemma4-assistant: Q-only attention over the target's KV cache) with a
tiny random pair (tests/gemma4_pair.py): inspect names both, generate drafts with it through the
memory-shared path and keeps plain decoding's output, and misuse is one line."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gguf_tools.report import ASSISTANT, NO_MTP_GRAPH, inspect_file
from mtp_cli.cli import main
from mtp_cli.config import GenConfig
from mtp_cli.drafters.mtp import MtpDrafter
from mtp_cli.runtime import Runtime
from tests.gemma4_pair import write_gemma4_pair
from tests.parity import PROMPT, greedy, run


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return write_gemma4_pair(tmp_path_factory.mktemp("gemma4"))


def test_inspect_says_what_each_file_is_and_how_to_use_them_together(pair):
    t, a = inspect_file(pair["target"]), inspect_file(pair["assistant"])
    assert t.verdict == NO_MTP_GRAPH and "gemma4-assistant" in t.advice and "-md ASSISTANT.gguf" in t.advice
    assert a.verdict == ASSISTANT and f"-md {pair['assistant']}" in a.advice


def test_the_assistant_drafts_through_the_targets_memory_and_keeps_plain_output(pair):
    with Runtime(pair["target"], spec_type="mtp", draft_model=pair["assistant"]) as rt:
        prompt = rt.tokenize(PROMPT)
        ref = run(rt, prompt, greedy(n_predict=24))
        for n in (1, 2, 3, 4, 8):
            out = run(rt, prompt, greedy(n_predict=24, spec_type="mtp", draft_n_max=n))
            assert out == ref, n
            assert rt.stats.n_drafted > 0 and rt.stats.stop_reason == "n_predict"
        d = rt.contexts(GenConfig(spec_type="mtp", draft_n_max=8, n_ctx=256, n_batch=64, n_threads=1))[1]
        assert isinstance(d, MtpDrafter) and d.mem_shared  # (no KV of its own: ctx_other kept)


def test_an_agreeing_assistant_has_every_draft_accepted_and_the_same_output(tmp_path):
    both = write_gemma4_pair(tmp_path / "agree", agree=True)
    with Runtime(both["target"], spec_type="mtp", draft_model=both["assistant"]) as rt:
        prompt = rt.tokenize(PROMPT)
        ref = run(rt, prompt, greedy(n_predict=25))
        assert len(ref) == 25
        for n in (1, 3, 6):
            assert run(rt, prompt, greedy(n_predict=25, spec_type="mtp", draft_n_max=n)) == ref, n
            st = rt.stats
            # every pass keeps its N drafts and adds its own token: 24 tokens after the first
            assert st.acceptance == 1.0 and st.n_verify == -(-24 // (n + 1)), (n, st.acceptance, st.n_verify)


def test_pack_refuses_the_pair_saying_how_it_is_used(pair, tiny_models, tmp_path):
    out = tmp_path / "o.gguf"
    r = CliRunner().invoke(
        main, ["pack", str(pair["target"]), "--heads", str(tiny_models("glm4moe")["sidecar"]), "-o", str(out)]
    )
    assert r.exit_code == 2 and "gemma4-assistant model, given as -md" in r.output, r.output
    r = CliRunner().invoke(
        main, ["pack", str(tiny_models("glm4moe")["trunk"]), "--heads", str(pair["assistant"]), "-o", str(out)]
    )
    assert r.exit_code == 2 and "drafter, not an MTP head" in r.output and "-md" in r.output, r.output
    assert not out.exists()


def test_misuse_is_one_line(pair, tmp_path):
    r = CliRunner().invoke(main, ["generate", "-m", str(pair["assistant"]), "-p", "hi", "-n", "2"])
    assert r.exit_code == 2 and "is a gemma4-assistant drafter: give it as -md" in r.output, r.output
    r = CliRunner().invoke(
        main, ["generate", "-m", str(pair["target"]), "-md", str(pair["target"]), "--spec-type", "mtp", "-p", "hi"]
    )
    assert r.exit_code == 2 and "has no MTP head" in r.output, r.output
    other = write_gemma4_pair(tmp_path, target_width=128)["assistant"]  # an assistant for a wider target
    r = CliRunner().invoke(
        main, ["generate", "-m", str(pair["target"]), "-md", str(other), "--spec-type", "mtp", "-p", "hi", "-n", "2"]
    )
    assert r.exit_code == 2 and "128" in r.output and "64" in r.output and "Traceback" not in r.output, r.output


def test_bench_and_tune_take_the_assistant(pair, tmp_path):
    """tune's cost probe decoded the assistant at a position the target already held: llama.cpp
    refused the batch ("llama_decode failed with code -1")."""
    from mtp_cli.speed.bench import bench
    from mtp_cli.speed.tune import tune

    b = bench(pair["target"], pair["assistant"], n_predict=8, repeats=1, n_threads=1)
    rows = {r.name: r for r in b.rows}
    for name in ("none", "mtp N=1", "mtp N=2", "mtp N=3", "mtp N=4", "auto", "adaptive"):
        assert rows[name].result is not None, name
    assert rows["mtp N=3"].result.stats.n_drafted > 0
    t = tune(pair["target"], pair["assistant"], budget=3, n_max=2, n_threads=1, save=False, config_dir=tmp_path)
    assert t.cost is not None and len(t.cost.verify) == 3 and t.best is not None
