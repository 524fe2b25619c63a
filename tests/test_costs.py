"""The cost model (mtp_cli.speed.costs) and its measurement (mtp_cli.speed.probe)."""

from __future__ import annotations

import pytest

from mtp_cli.runtime import Runtime
from mtp_cli.speed.costs import CostModel, expected_tokens, solve_alpha
from tests.speedkit import greedy, tokens


@pytest.fixture(scope="session")
def models(tiny_models):
    return lambda arch="glm4moe", **kw: tiny_models(arch, "structured", "q8_0", **kw)


def test_break_even():
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert solve_alpha(1.75, 2) == pytest.approx(0.5, abs=1e-6)
    assert solve_alpha(0.9, 3) == 0.0 and solve_alpha(4.5, 3) is None
    cm = CostModel(
        t_ms=10.0, verify=[1.0, 1.8, 2.0], draft=0.3, draft_rows=[0.3, 0.35, 0.4], overhead_plain=0.0, overhead={2: 0.1}
    )
    # N=1: 1.8 + c(E) + 0.1 > E for every E <= 2: cannot pay
    assert cm.break_even_alpha(1) is None and cm.break_even_tokens(1) > 2
    # N=2: E = 2.0 + c(E) + 0.3 + 0.1 (the first head decode carries E-1 catch-up rows): E ~ 2.79
    e = cm.break_even_tokens(2)
    assert e == pytest.approx(cm.step_cost(2, e)) and 2.7 < e < 2.9
    a = cm.break_even_alpha(2)
    assert expected_tokens(a, 2) == pytest.approx(e, rel=1e-6)
    assert cm.ratio(2, [1.0, 1.0]) == pytest.approx(3 / (2.0 + 0.4 + 0.3 + 0.1))


@pytest.mark.parametrize("arch", ["glm4moe", "qwen35"])
def test_measure_costs_directly(models, arch):
    from mtp_cli.speed.probe import measure_costs

    with Runtime.load(models(arch, head_noise=1.0)["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize("hello world, this is a prompt")
        cm = measure_costs(rt, greedy(), 3, prompt, rounds=1, reps=2)
        assert cm.t_ms > 0 and len(cm.verify) == 4 and all(v > 0 for v in cm.verify)
        # c(m) for m = 1..4 (the first head decode of a step cycles through them), c from the later ones
        assert len(cm.draft_rows) == 4 and all(r > 0 for r in cm.draft_rows) and cm.draft > 0
        # the smallest setting tune can shrink to still measures c(1) and c(2) (c: no later decodes at N=1)
        small = measure_costs(rt, greedy(), 1, prompt, rounds=1, reps=1)
        assert len(small.draft_rows) == 2 and small.draft == small.draft_rows[0]
        with pytest.raises(ValueError, match="N >= 1"):
            measure_costs(rt, greedy(), 0, prompt)
        # the runtime still generates plain decoding's tokens afterwards (the contexts were left clean)
        ref = tokens(rt, prompt, greedy(n_predict=24))
        assert tokens(rt, prompt, greedy(n_predict=24, spec_type="mtp", draft_n_max=3)) == ref
        # what a generation left in memory is gone after a measurement: nothing is kept from it
        list(rt.generate(prompt, greedy(n_predict=8, spec_type="mtp", draft_n_max=3), reuse=True))
        measure_costs(rt, greedy(), 1, prompt, rounds=1, reps=1)
        again = rt.generate(prompt, greedy(n_predict=24, spec_type="mtp", draft_n_max=3), reuse=True)
        assert [e.token for e in again] == ref and again.stats.n_cached == 0
