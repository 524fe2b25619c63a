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
    from tests.test_drafters import write_tiny_mimo2

    glm = tiny_models("glm4moe", head_noise=1.0, **SENSITIVE)
    qwen = tiny_models("qwen35", head_noise=1.0, **SENSITIVE)
    mimo2 = write_tiny_mimo2(tmp_path / "mimo2-3heads.gguf", n_heads=3, mix=2.0, head_noise=1.0)
    return {
        "chained": (mimo2, dict(spec_type="mtp")),
        "draft-recurrent": (qwen["full"], dict(spec_type="draft", draft_model=str(qwen["trunk"]))),
        "glm4moe": (glm["full"], dict(spec_type="mtp")),
        "qwen35": (qwen["full"], dict(spec_type="mtp")),
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


def run_batched(runner, joins=None) -> tuple[dict[int, list[int]], int]:
    """Step a BatchRunner until every sequence ends: each sequence's tokens, and the steps taken;
    `joins[k]()` runs after step k (a sequence joining while others run)."""
    toks: dict[int, list[int]] = {}
    steps = 0
    while runner.running:
        for seq, o in runner.step().items():
            assert o.error is None, o.error
            toks.setdefault(seq, []).extend(ev.token for ev in o.events)
        steps += 1
        if joins and steps in joins:
            joins[steps]()
    return toks, steps


def _figures(gen) -> tuple[list[int], list[int], list[int]]:
    return gen.tokens, list(gen.stats.drafted_at), list(gen.stats.accepted_at)


def _alone(kinds, kind: str, cfg: GenConfig, texts) -> list[tuple[list[int], list[int], list[int]]]:
    """Each text's tokens and drafts' fate on a runtime of one sequence, one after another."""
    with _load(kinds, kind, 1) as rt:
        out = []
        for t in texts:
            gen = rt.generate(rt.tokenize(t), cfg)
            list(gen)
            out.append(_figures(gen))
        return out


@pytest.mark.parametrize("kind", ["glm4moe", "qwen35", "draft", "lookup,mtp", "gemma4"])
def test_generations_in_two_sequences_interleave_each_as_if_alone(tiny_models, tmp_path, kind):
    """Token by token in turn, seq 0 and seq 1 each give their tokens and their drafts' fate as on a
    runtime of one sequence: every batch row, rollback and drafter memory edit names its sequence
    (one 0 left anywhere drops the other's cells or reads its memory)."""
    kinds = _kinds(tiny_models, tmp_path)
    spec = "mtp" if kind == "gemma4" else kinds[kind][1]["spec_type"]
    cfg = greedy(spec_type=spec, draft_n_max=3, n_ctx=512)
    texts = ("hello world", "the cat sat on")
    alone = _alone(kinds, kind, cfg, texts)
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


@pytest.mark.parametrize("kind", ["glm4moe", "qwen35", "draft", "lookup,mtp", "gemma4", "chained"])
def test_batched_sequences_each_give_what_they_give_alone(tiny_models, tmp_path, kind):
    """One decode per step for three sequences (one joining late, prompts of different lengths read
    in chunks beside the others' steps): each gets its tokens and its drafts' fate as alone, which
    needs every loop to read its own rows of the shared decode (logits, the sampler's index, the
    head's h rows)."""
    _batched_as_alone(_kinds(tiny_models, tmp_path), kind)


def test_chained_heads_of_an_unknown_graph_batched_give_what_they_give_alone(tiny_models, tmp_path):
    """Where the graph's h order is unknown, every row of a chained head's draft batch is an output and
    its catch-up decodes alone (tests/test_joint.py): batched, each slot still reads its own rows
    (logits and h by output), with the third sequence joining late (the slots' phases apart)."""
    from tests.test_drafters import _as_recorded

    kinds = _kinds(tiny_models, tmp_path)
    with _as_recorded("mimo2", False):
        _batched_as_alone(kinds, "chained")


def _batched_as_alone(kinds, kind: str) -> None:
    from mtp_cli.slots import BatchRunner

    spec = "mtp" if kind == "gemma4" else kinds[kind][1]["spec_type"]
    cfg = greedy(spec_type=spec, draft_n_max=3, n_ctx=768, n_batch=16)
    texts = ("hello world", "the cat sat on the mat and then the dog", "a b c")
    alone = _alone(kinds, kind, cfg, texts)
    with _load(kinds, kind, 3) as rt:
        runner = BatchRunner(rt)
        stats = {s: runner.add(rt.prepare(rt.tokenize(texts[s]), cfg, seq=s)) for s in (0, 1)}
        join = {3: lambda: stats.update({2: runner.add(rt.prepare(rt.tokenize(texts[2]), cfg, seq=2))})}
        toks, steps = run_batched(runner, join)  # (the third joins while the others run)
        got = [(toks[s], list(stats[s].drafted_at), list(stats[s].accepted_at)) for s in range(3)]
        assert got == alone
        assert steps < sum(len(a[0]) for a in alone) * 0.6  # (shared decodes: far fewer than one per token)


def test_batched_seeded_sampling_is_each_requests_own(tiny_models, tmp_path):
    """Sampled with a seed, a sequence draws the same tokens batched beside others as alone (its
    sampler reads its own rows of the shared decode)."""
    from mtp_cli.slots import BatchRunner

    s = tiny_models("glm4moe", head_noise=1.0, **SENSITIVE)
    cfgs = [
        greedy(spec_type="mtp", draft_n_max=3, n_ctx=512, temp=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=7 + i)
        for i in range(2)
    ]
    texts = ("hello world", "the cat sat on")
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        alone = [[ev.token for ev in rt.generate(rt.tokenize(t), c)] for t, c in zip(texts, cfgs)]
    with Runtime.load(s["full"], spec_type="mtp", n_parallel=2) as rt:
        runner = BatchRunner(rt)
        for i, (t, c) in enumerate(zip(texts, cfgs)):
            runner.add(rt.prepare(rt.tokenize(t), c, seq=i))
        toks: dict[int, list[int]] = {0: [], 1: []}
        while runner.running:
            for seq, o in runner.step().items():
                toks[seq] += [ev.token for ev in o.events]
        assert [toks[0], toks[1]] == alone and alone[0] != alone[1]


def test_batched_sequences_whose_drafters_sleep_and_wake_apart(tiny_models):
    """One sequence's head sleeps (its loop stops the target's h rows) while another's drafts on
    the same decodes: the h rows are the context's, so they are computed while any drafter reads
    them; each sequence still gives what it gives alone."""
    from mtp_cli.policy import DraftPolicy
    from mtp_cli.slots import BatchRunner

    class Nap(DraftPolicy):
        """Asleep for steps 2..11, quietly (the loop stops the h rows), then drafting again."""

        def step(self, drafted: int, accepted: int, t_consumer: float, done: int) -> int:
            self.sleep = 2 <= done < 12
            self.quiet = max(0, 10 - done) if self.sleep else 0
            return 0 if self.sleep else self.n_max

    s = tiny_models("glm4moe", head_noise=1.0, **SENSITIVE)
    cfg = greedy(spec_type="mtp", draft_n_max=3, n_ctx=512)
    texts = ("hello world", "the cat sat on")
    pols = (lambda: Nap(3), lambda: None)
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        alone = []
        for t, pol in zip(texts, pols):
            gen = rt.generate(rt.tokenize(t), cfg, policy=pol())
            list(gen)
            alone.append(_figures(gen))
    with Runtime.load(s["full"], spec_type="mtp", n_parallel=2) as rt:
        runner = BatchRunner(rt)
        stats = [
            runner.add(rt.prepare(rt.tokenize(t), cfg, policy=pol(), seq=i))
            for i, (t, pol) in enumerate(zip(texts, pols))
        ]
        toks: dict[int, list[int]] = {0: [], 1: []}
        while runner.running:
            for seq, o in runner.step().items():
                assert o.error is None, o.error
                toks[seq] += [ev.token for ev in o.events]
        assert [(toks[i], list(st.drafted_at), list(st.accepted_at)) for i, st in enumerate(stats)] == alone


def test_under_load_a_gated_sequence_drafts_nothing_and_alone_its_policy_decides(tiny_models):
    """gate=True (a draft length not forced): while another sequence shares the decodes and nothing
    says drafting pays there (no acceptance of its own seen yet: mtp_cli.load), no drafts, the
    lookup's included; once alone, its own policy drafts again. The output stays plain decoding's;
    the held steps are the inner policy's foreign ones."""
    from mtp_cli.policy import DraftPolicy
    from mtp_cli.slots import BatchRunner

    class Seen(DraftPolicy):
        def __init__(self, n):
            super().__init__(n)
            self.foreign_steps = 0

        def foreign(self, seconds: float) -> None:
            self.foreign_steps += 1

    s = tiny_models("glm4moe", head_noise=1.0, **SENSITIVE)
    texts = ("hello world hello world hello world", "the cat sat on")
    with Runtime.load(s["full"], spec_type="lookup,mtp", n_parallel=2) as rt:
        cfg = greedy(spec_type="lookup,mtp", draft_n_max=3, n_ctx=512)
        short = greedy(spec_type="lookup,mtp", draft_n_max=3, n_ctx=512, n_predict=24)
        plain = [
            [ev.token for ev in rt.generate(rt.tokenize(t), greedy(n_ctx=512, n_predict=c.n_predict))]
            for t, c in zip(texts, (cfg, short))
        ]
        runner = BatchRunner(rt)
        inner = Seen(3)
        st = runner.add(rt.prepare(rt.tokenize(texts[0]), cfg, policy=inner, seq=0), gate=True)
        other = runner.add(rt.prepare(rt.tokenize(texts[1]), short, seq=1))  # (forced: drafts all along)
        toks: dict[int, list[int]] = {0: [], 1: []}
        drafted_while_shared = None
        while runner.running:
            for seq, o in runner.step().items():
                toks[seq] += [ev.token for ev in o.events]
            if drafted_while_shared is None and 1 not in runner.running:
                drafted_while_shared = st.n_drafted
        assert [toks[0], toks[1]] == plain
        assert drafted_while_shared == 0 and other.n_drafted > 0  # (held while shared)
        assert st.n_drafted > 0 and inner.foreign_steps > 0  # (drafting alone again)


@pytest.mark.parametrize("spec", ["mtp", "draft"])
def test_every_slots_drafter_shares_one_context(tiny_models, spec):
    """A head's (or a draft model's) context holds every slot's stream (n_seq_max): one for all
    slots, not one a slot, each holding every slot's cells (n_seq times the memory); the runtime
    closes it."""
    s = tiny_models("glm4moe", head_noise=1.0, **SENSITIVE)
    kw = dict(spec_type=spec, draft_model=str(s["trunk"])) if spec == "draft" else dict(spec_type=spec)
    cfg = greedy(spec_type=spec, draft_n_max=3, n_ctx=512)
    with Runtime.load(s["full"], n_parallel=2, **kw) as rt:
        for seq in (0, 1):
            list(rt.generate(rt.tokenize("hello"), cfg, seq=seq))
        ds = [rt._ctx.drafters[(spec, seq)] for seq in (0, 1)]  # type: ignore[union-attr]
        assert ds[0].ctx is ds[1].ctx and not ds[0].ctx.closed
        ctx = ds[0].ctx
    assert ctx.closed


@pytest.mark.parametrize("kind", ["glm4moe", "qwen35", "lookup,mtp", "draft", "draft-recurrent", "chained"])
def test_every_slots_drafter_decodes_in_one_decode_per_draft_position(tiny_models, tmp_path, monkeypatch, kind):
    """Three sequences drafting up to 3 each: their heads' (or draft models') rows go into one decode
    per draft position (catch-up rows and the first draft rows together, then a row a sequence), not
    one decode per sequence; each still drafts, keeps and gives what it does alone, which needs every
    drafter to read its own rows of the shared decode (logits, h rows)."""
    from mtp_cli import llama_ext as lx
    from mtp_cli.slots import BatchRunner

    kinds = _kinds(tiny_models, tmp_path)
    cfg = greedy(spec_type=kinds[kind][1]["spec_type"], draft_n_max=3, n_ctx=768, n_batch=16)
    texts = ("hello world", "the cat sat on the mat and then the dog", "a b c")
    alone = _alone(kinds, kind, cfg, texts)
    real = lx.decode
    for joint in (True, False):
        seqs: list[int] = []  # sequences in each drafter decode
        rt = _load(kinds, kind, 3)

        def spy(ctx, batch, seqs=seqs, rt=rt):
            if rt._ctx is not None and ctx is not rt._ctx.target:  # (a drafter's context)
                seqs.append(len(set(batch.seq_ids[: batch.n_tokens].tolist())))
            real(ctx, batch)

        monkeypatch.setattr(lx, "decode", spy)
        with rt:
            runner = BatchRunner(rt, joint=joint)
            stats = {s: runner.add(rt.prepare(rt.tokenize(t), cfg, seq=s)) for s, t in enumerate(texts)}
            toks, _ = run_batched(runner)
        got = [(toks[s], list(stats[s].drafted_at), list(stats[s].accepted_at)) for s in range(3)]
        assert got == alone, joint
        if joint:
            shared, n_joint = sum(n > 1 for n in seqs), len(seqs)
        else:
            assert max(seqs) == 1
            n_apart = len(seqs)
    assert shared > 0 and n_joint < 0.75 * n_apart, (shared, n_joint, n_apart)
