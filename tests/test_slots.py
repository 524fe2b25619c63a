"""Sequences (slots) on one runtime: `LoadConfig.n_parallel` sequences share the target context and
every drafter follows its own; generations in different sequences may be iterated in turn, each
giving what it gives alone, with the same drafts kept. One thread (see tests/parity.py).
"""

from __future__ import annotations

import pytest

from mtp_cli.config import GenConfig
from mtp_cli.errors import ConfigError
from mtp_cli.runtime import Runtime
from tests.parity import SENSITIVE, greedy


def _kinds(tiny_models, tmp_path):
    from tests.gemma4_pair import write_gemma4_pair

    glm = tiny_models("glm4moe", head_noise=1.0, **SENSITIVE)
    return {
        "glm4moe": (glm["full"], dict(spec_type="mtp")),
        "qwen35": (tiny_models("qwen35", head_noise=1.0, **SENSITIVE)["full"], dict(spec_type="mtp")),
        "draft": (glm["full"], dict(spec_type="draft", draft_model=str(glm["trunk"]))),
        "lookup,mtp": (glm["full"], dict(spec_type="lookup,mtp")),
        "gemma4": (lambda: write_gemma4_pair(tmp_path, agree=0.8), None),
    }


def _load(kinds, kind: str, n_parallel: int) -> Runtime:
    path, spec = kinds[kind]
    if spec is None:  # (the assistant reads the target's memory: sequence by sequence)
        pair = path()
        path, spec = pair.target, dict(spec_type="mtp", draft_model=str(pair.assistant))
    return Runtime.load(path, n_parallel=n_parallel, **spec)


def _figures(gen) -> tuple[list[int], list[int], list[int]]:
    return gen.tokens, list(gen.stats.drafted_at), list(gen.stats.accepted_at)


@pytest.mark.parametrize("kind", ["glm4moe", "qwen35", "draft", "lookup,mtp", "gemma4"])
def test_generations_in_two_sequences_interleave_each_as_if_alone(tiny_models, tmp_path, kind):
    """Token by token in turn, seq 0 and seq 1 each give their tokens and their drafts' fate as on a
    runtime of one sequence: every batch row, rollback and drafter memory edit names its sequence
    (one 0 left anywhere drops the other's cells or reads its memory)."""
    kinds = _kinds(tiny_models, tmp_path)
    spec = "mtp" if kind == "gemma4" else kinds[kind][1]["spec_type"]
    cfg = greedy(spec_type=spec, draft_n_max=3, n_ctx=512)
    texts = ("hello world", "the cat sat on")
    with _load(kinds, kind, 1) as rt:
        alone = []
        for t in texts:
            gen = rt.generate(rt.tokenize(t), cfg)
            list(gen)
            alone.append(_figures(gen))
    with _load(kinds, kind, 2) as rt:
        gens = [rt.generate(rt.tokenize(t), cfg, seq=s) for s, t in enumerate(texts)]
        live = list(gens)
        while live:
            for g in list(live):
                if next(g, None) is None:
                    live.remove(g)
        assert [_figures(g) for g in gens] == alone
        assert sum(alone[0][2]) > 0  # (drafts were kept: the drafter's memory was exercised)


def test_a_sequences_memory_is_kept_for_its_next_generation(tiny_models):
    """What a generation left in sequence 1 is reused by the next one there, although sequence 0
    generated in between."""
    s = tiny_models("glm4moe", head_noise=1.0, **SENSITIVE)
    cfg = greedy(spec_type="mtp", draft_n_max=3, n_ctx=512)
    with Runtime.load(s["full"], spec_type="mtp", n_parallel=2) as rt:
        p1 = rt.tokenize("the cat sat on")
        first = rt.generate(p1, cfg, seq=1)
        out = [ev.token for ev in first]
        list(rt.generate(rt.tokenize("hello world"), cfg, seq=0))
        again = rt.generate(p1 + out + rt.tokenize(" and", add_special=False), cfg, seq=1, reuse=True)
        list(again)
        assert again.stats.n_cached == len(p1) + len(out) - 1


def test_sequences_are_checked(tiny_models):
    s = tiny_models("glm4moe", head_noise=1.0, **SENSITIVE)
    cfg = greedy(spec_type="mtp", draft_n_max=3, n_ctx=512)
    with Runtime.load(s["full"], spec_type="mtp", n_parallel=2) as rt:
        p = rt.tokenize("hello")
        with pytest.raises(ConfigError, match="sequence 2 is not one of this runtime's 2"):
            rt.generate(p, cfg, seq=2)
        g = rt.generate(p, cfg, seq=1)
        next(g)
        with pytest.raises(ConfigError, match="sequence 1 is generating"):
            rt.generate(p, cfg, seq=1)
        with pytest.raises(ConfigError, match="cannot change while sequence 1 generates"):
            rt.generate(p, GenConfig(**{**cfg.__dict__, "n_ctx": 1024}), seq=0)
        g.close()
        list(rt.generate(p, cfg, seq=1))  # (closed, it is free again)
    with pytest.raises(ConfigError, match="n_parallel"):
        Runtime.load(s["full"], n_parallel=0)
