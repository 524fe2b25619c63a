"""What chooses the target's token beyond temperature (mtp_cli.sampling.Chooser): a grammar (GBNF, or a
JSON schema turned into one), logit biases, frequency and presence penalties, log-probabilities.
Each is exact under drafting: greedy and seeded outputs equal plain decoding's for every spec type,
and the grammar's state follows only the emitted tokens (a rejected draft never reaches it)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from mtp_cli import llama_ext as lx
from mtp_cli.config import GenConfig
from mtp_cli.errors import ConfigError
from mtp_cli.runtime import Runtime
from mtp_cli.sampling import RowEdits, log_probs
from tests.parity import PROMPT, SENSITIVE, greedy
from tests.test_row_edits import _llama_penalized

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}, "w": {"enum": ["hello", "world"]}},
    "required": ["n", "ok", "w"],
}
SPECS = [("none", {}), ("mtp", {"draft_n_max": 3}), ("ngram", {"draft_n_max": 3}), ("lookup", {"draft_n_max": 16})]


@pytest.fixture(scope="module")
def rt(tiny_models):
    with Runtime.load(tiny_models("glm4moe", head_noise=1.0, **SENSITIVE)["full"], spec_type="mtp") as r:
        yield r


def _gen(rt: Runtime, cfg: GenConfig) -> tuple[list[int], str, object]:
    gen = rt.generate(rt.tokenize(PROMPT), cfg)
    events = list(gen)
    return [e.token for e in events], gen.text, (gen.stats, events)


@pytest.mark.parametrize("spec, kw", SPECS)
def test_a_json_schema_grammar_gives_valid_json_and_drafting_changes_nothing(rt, spec, kw):
    gbnf = lx.json_schema_grammar(SCHEMA)
    plain, text, (st, _) = _gen(rt, greedy(n_predict=80, grammar=gbnf))
    doc = json.loads(text)
    assert set(doc) == {"n", "ok", "w"} and isinstance(doc["n"], int) and doc["w"] in ("hello", "world")
    assert st.stop_reason == "eog"  # (the grammar complete: only the end of text is allowed)
    toks, _, (st, _) = _gen(rt, greedy(n_predict=80, grammar=gbnf, spec_type=spec, **kw))
    assert toks == plain, spec
    seeded = dict(temp=0.9, seed=7, n_predict=80, grammar=lx.JSON_GRAMMAR)
    want, text, _ = _gen(rt, greedy(**seeded))
    assert _gen(rt, greedy(**seeded, spec_type=spec, **kw))[0] == want
    json.loads(text) if text.rstrip().endswith("}") else None


def test_drafts_the_grammar_forbids_are_rejected_and_never_reach_it(rt):
    """An unconstrained head drafts freely; every kept token obeys the grammar, and the grammar,
    fed only emitted tokens, never aborts the process (llama.cpp's does on a token it forbids)."""
    gbnf = 'root ::= ("hello" | " world" | " the")+ "."'
    plain, text, _ = _gen(rt, greedy(n_predict=24, grammar=gbnf))
    toks, text2, (st, _) = _gen(rt, greedy(n_predict=24, grammar=gbnf, spec_type="mtp", draft_n_max=4))
    assert toks == plain and text2 == text and st.n_drafted > st.n_accepted
    words = re.match(r"(hello| world| the)*", text)
    assert words is not None and words.end() > 0
    rest = text[words.end() :]  # (cut by n_predict: a prefix of a word, or the final ".")
    assert rest == "." or any(w.startswith(rest) for w in ("hello", " world", " the")), text


def test_a_grammar_llama_cpp_cannot_parse_is_one_line(rt):
    for bad in ("root ::= (", "start ::= [a-z]", 'root ::= root "x"'):
        with pytest.raises(ConfigError, match="grammar: the grammar does not parse"):
            rt.generate(rt.tokenize(PROMPT), greedy(grammar=bad))


@pytest.mark.parametrize("spec, kw", SPECS)
def test_logit_bias_and_penalties_drafted_or_not(rt, spec, kw):
    sets = [
        dict(logit_bias=((rt.tokenize(" world", add_special=False)[0], 6.0),)),
        dict(frequency_penalty=0.8, presence_penalty=0.4, repeat_last_n=32),
    ]
    for extra in sets:
        plain, _, _ = _gen(rt, greedy(n_predict=40, **extra))
        assert _gen(rt, greedy(n_predict=40, spec_type=spec, **kw, **extra))[0] == plain, (spec, extra)
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        rt.generate(rt.tokenize(PROMPT), greedy(logit_bias=((10**6, 1.0),)))


@pytest.mark.parametrize("freq, presence", [(0.5, 0.0), (0.0, 1.25), (0.7, 0.3)])
def test_frequency_and_presence_penalties_are_llama_cpps(freq, presence):
    rng = np.random.default_rng(3)
    V = 40
    history = rng.integers(0, V, 30).tolist()
    drafts = rng.integers(0, V, 3).tolist()
    rows = rng.normal(0, 3, (4, V)).astype(np.float32)
    edited = rows.copy()
    cfg = GenConfig(repeat_penalty=1.3, repeat_last_n=16, frequency_penalty=freq, presence_penalty=presence)
    RowEdits(cfg, ()).apply(edited, history, drafts)
    for i in range(4):
        want = _llama_penalized(rows[i], history + drafts[:i], 16, 1.3, freq, presence)
        np.testing.assert_allclose(edited[i], want, rtol=0, atol=1e-5, err_msg=f"row {i}")


def test_logprobs_are_the_rows_log_softmax_and_drafting_reports_the_same(rt):
    plain, _, (_, events) = _gen(rt, greedy(n_predict=16, logprobs=3))
    drafted, _, (st, devents) = _gen(rt, greedy(n_predict=16, logprobs=3, spec_type="mtp", draft_n_max=3))
    assert drafted == plain and st.n_accepted > 0
    for e, d in zip(events, devents):
        assert e.logprob is not None and d.logprob is not None and e.logprob <= 0
        assert [t for t, _ in e.top] == [t for t, _ in d.top] and e.top[0][0] == e.token  # (greedy: the best)
        assert abs(e.logprob - d.logprob) < 1e-2 and len(e.top) == 3  # (batched kernels: ~1e-3 apart)
    row = np.array([1.0, 3.0, 2.0, -np.inf], dtype=np.float32)
    lp, top = log_probs(row, 2, 2)
    want = np.log(np.exp(row[:3]) / np.exp(row[:3]).sum())
    assert lp == pytest.approx(want[2]) and [t for t, _ in top] == [1, 2] and top[0][1] == pytest.approx(want[1])


def test_drafts_are_picked_among_what_the_grammar_allows(rt, monkeypatch):
    """A copy of the target's grammar guides the head's picks: every draft is one the grammar allows
    (a forbidden one could never be kept), acceptance rises, and the output is the same."""
    from mtp_cli.loop import VerifyLoop

    gbnf = lx.json_schema_grammar(SCHEMA)
    cfg = greedy(n_predict=80, grammar=gbnf, spec_type="mtp", draft_n_max=3)
    guided, _, (st, _) = _gen(rt, cfg)
    monkeypatch.setattr(VerifyLoop, "_steered", lambda self, k, limit: self._draft(k, limit))
    free, _, (st_free, _) = _gen(rt, cfg)
    assert guided == free and st.n_accepted > st_free.n_accepted, (st.acceptance, st_free.acceptance)


def test_a_draft_model_gives_plain_decodings_output_under_a_grammar(tiny_models):
    """The fourth spec type (a separate draft model, guided by the grammar too), greedy and seeded."""
    s = tiny_models("glm4moe", head_noise=1.0, **SENSITIVE)
    d = tiny_models("glm4moe", perturb=0.35)
    gbnf = lx.json_schema_grammar(SCHEMA)
    with Runtime.load(s["full"], spec_type="draft", draft_model=d["trunk"]) as rt:
        for kw in (dict(), dict(temp=0.9, seed=11)):
            plain, _, _ = _gen(rt, greedy(n_predict=80, grammar=gbnf, **kw))
            toks, _, (st, _) = _gen(rt, greedy(n_predict=80, grammar=gbnf, spec_type="draft", draft_n_max=3, **kw))
            assert toks == plain and st.n_drafted > 0, kw
