"""A prompt that starts with what another sequence holds (a shared system prompt, a document every
conversation quotes) copies that prefix in instead of decoding it again (mtp_cli.memory.borrowed):
from a sequence that finished or one still generating, without changing what either generates.
One thread (see tests/parity.py).
"""

from __future__ import annotations

import pytest

from mtp_cli.memory import COPY_GAIN
from tests.parity import greedy
from tests.test_slots import _kinds, _load, run_batched

SHARED = "the quick brown fox jumps over the lazy dog and the cat sat on the mat while "


def _alone(kinds, kind, cfg, prompts) -> list[list[int]]:
    with _load(kinds, kind, 1) as rt:
        return [[ev.token for ev in rt.generate(p, cfg)] for p in prompts]


def _prompts(kinds, kind) -> tuple[list[int], list[int], int]:
    """Two prompts sharing a long prefix, and the prefix's length in tokens."""
    with _load(kinds, kind, 1) as rt:
        a, b = rt.tokenize(SHARED + "hello world"), rt.tokenize(SHARED + "a b c d")
    n = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert n >= COPY_GAIN + 8
    return a, b, n


@pytest.mark.parametrize("kind", ["glm4moe", "lookup,mtp", "gemma4"])
def test_a_prefix_another_sequence_held_is_copied_in(tiny_models, tmp_path, kind):
    """Sequence 0 generated from A; sequence 1, empty, then generates from B sharing A's first n
    tokens: it keeps those (n_cached) and gives B's tokens as alone; sequence 0's memory is untouched
    (a follow-up of A there still keeps all of it)."""
    kinds = _kinds(tiny_models, tmp_path)
    spec = "mtp" if kind == "gemma4" else kinds[kind][1]["spec_type"]
    cfg = greedy(spec_type=spec, draft_n_max=3, n_ctx=1024)
    a, b, n = _prompts(kinds, kind)
    alone_a, alone_b = _alone(kinds, kind, cfg, [a, b])
    with _load(kinds, kind, 3) as rt:
        first = rt.generate(a, cfg, seq=0, reuse=True)
        assert [ev.token for ev in first] == alone_a
        second = rt.generate(b, cfg, seq=1, reuse=True)
        assert [ev.token for ev in second] == alone_b
        assert second.stats.n_cached == n
        again = rt.generate(a + alone_a, cfg, seq=0, reuse=True)
        list(again)
        assert again.stats.n_cached == len(a) + len(alone_a) - 1


def test_a_prefix_is_copied_from_a_sequence_still_generating(tiny_models, tmp_path):
    """Batched: sequence 1 joins once sequence 0 has read its prompt, copies the shared prefix from
    it (the copy lands at the next decode, before either writes), and both give what they give alone."""
    from mtp_cli.slots import BatchRunner

    kinds = _kinds(tiny_models, tmp_path)
    cfg = greedy(spec_type="mtp", draft_n_max=3, n_ctx=1024)
    a, b, n = _prompts(kinds, "glm4moe")
    alone = _alone(kinds, "glm4moe", cfg, [a, b])
    with _load(kinds, "glm4moe", 2) as rt:
        runner = BatchRunner(rt)
        stats = {0: runner.add(rt.prepare(a, cfg, seq=0, reuse=True))}
        toks, _ = run_batched(runner, {2: lambda: stats.update({1: runner.add(rt.prepare(b, cfg, seq=1, reuse=True))})})
        assert [toks[0], toks[1]] == alone
        assert stats[1].n_cached == n


@pytest.mark.parametrize("gap", [False, True])
def test_the_borrowers_head_starts_from_the_lenders_memory_where_it_holds_the_prefix(tiny_models, tmp_path, gap):
    """The MTP head of the sequence that borrows a prefix takes the lender head's memory of it (its
    cells start at 0, as alone), not a cold restart at the prefix's end; a lender whose memory
    does not hold the whole prefix (its first cells gone, as after a sleep) lends nothing, and the
    borrower restarts cold. Either way the tokens are the prompt's alone."""
    from mtp_cli import llama_ext as lx

    kinds = _kinds(tiny_models, tmp_path)
    cfg = greedy(spec_type="lookup,mtp", draft_n_max=3, n_ctx=1024)
    a, b, n = _prompts(kinds, "lookup,mtp")
    with _load(kinds, "lookup,mtp", 2) as rt:
        list(rt.generate(a, cfg, seq=0, reuse=True))
        lender = rt._ctx.drafters[("mtp", 0)]
        if gap:
            lx.memory_seq_rm(lender.ctx, 0, 0, 3)
        g = rt.generate(b, cfg, seq=1, reuse=True)
        assert [ev.token for ev in g] == _alone(kinds, "lookup,mtp", cfg, [b])[0]
        assert g.stats.n_cached == n
        assert lx.memory_seq_span(rt._ctx.drafters[("mtp", 1)].ctx, 1)[0] == (n if gap else 0)


def test_a_short_or_unshareable_prefix_is_not_copied(tiny_models, tmp_path):
    """Nothing is copied for fewer than COPY_GAIN tokens beyond what the sequence keeps of its own, nor
    on a recurrent target (its state cannot drop the donor's tail): the prompt is read as before."""
    kinds = _kinds(tiny_models, tmp_path)
    cfg = greedy(spec_type="mtp", draft_n_max=3, n_ctx=1024)
    with _load(kinds, "glm4moe", 2) as rt:
        a = rt.tokenize("one two three four five six seven eight nine ten")
        list(rt.generate(a, cfg, seq=0, reuse=True))
        g = rt.generate(a[: COPY_GAIN - 1] + rt.tokenize("zebra", add_special=False), cfg, seq=1, reuse=True)
        list(g)
        assert g.stats.n_cached == 0
    a, b, n = _prompts(kinds, "qwen35")
    with _load(kinds, "qwen35", 2) as rt:
        list(rt.generate(a, cfg, seq=0, reuse=True))
        g = rt.generate(b, cfg, seq=1, reuse=True)
        assert [ev.token for ev in g] == _alone(kinds, "qwen35", cfg, [b])[0]
        assert g.stats.n_cached == 0


def test_a_generation_stopped_while_reading_its_prompt_lends_only_what_it_read(tiny_models, tmp_path):
    """Cancelled after its first prompt chunk, a sequence's memory holds that chunk only: a prompt
    sharing the whole of its prompt borrows no more than that, and gives its tokens as alone."""
    from mtp_cli.slots import BatchRunner

    kinds = _kinds(tiny_models, tmp_path)
    cfg = greedy(spec_type="mtp", draft_n_max=3, n_ctx=1024, n_batch=16)
    a, b, n = _prompts(kinds, "glm4moe")
    with _load(kinds, "glm4moe", 2) as rt:
        runner = BatchRunner(rt)
        runner.add(rt.prepare(a, cfg, seq=0, reuse=True))
        runner.step()
        runner.cancel(0)
        assert rt.held(0) == a[:16]
        g = rt.generate(b, cfg, seq=1, reuse=True)
        assert [ev.token for ev in g] == _alone(kinds, "glm4moe", cfg, [b])[0]
        assert g.stats.n_cached == 16


def test_a_donor_that_ran_again_since_prepare_lends_nothing(tiny_models, tmp_path):
    """A generation prepared to borrow from sequence 0 starts after sequence 0 ran another prompt:
    the prefix is gone, so its prompt is read whole (n_cached 0), and its tokens are its own."""
    kinds = _kinds(tiny_models, tmp_path)
    cfg = greedy(spec_type="mtp", draft_n_max=3, n_ctx=1024)
    a, b, n = _prompts(kinds, "glm4moe")
    with _load(kinds, "glm4moe", 2) as rt:
        list(rt.generate(a, cfg, seq=0, reuse=True))
        g = rt.generate(b, cfg, seq=1, reuse=True)  # (prepared: sequence 0 holds the prefix now)
        list(rt.generate(rt.tokenize("something else entirely"), cfg, seq=0, reuse=True))
        assert [ev.token for ev in g] == _alone(kinds, "glm4moe", cfg, [b])[0]
        assert g.stats.n_cached == 0


def test_a_copy_that_lands_short_is_dropped_and_the_head_restarts_cold(tiny_models, tmp_path, monkeypatch):
    """Where the copied state does not hold every position below the prefix's end (a sliding-window
    cache writes only its window), the borrower's head does not keep it: it restarts cold."""
    from mtp_cli import llama_ext as lx

    real = lx.copy_seq_state

    def windowed(src, s, dst, t):  # (the first cells left out, as a window's cache leaves them)
        real(src, s, dst, t)
        lx.memory_seq_rm(dst, t, 0, 4)

    monkeypatch.setattr(lx, "copy_seq_state", windowed)
    kinds = _kinds(tiny_models, tmp_path)
    cfg = greedy(spec_type="mtp", draft_n_max=3, n_ctx=1024)
    a, b, n = _prompts(kinds, "glm4moe")
    with _load(kinds, "glm4moe", 2) as rt:
        list(rt.generate(a, cfg, seq=0, reuse=True))
        g = rt.generate(b, cfg, seq=1, reuse=True)
        assert [ev.token for ev in g] == _alone(kinds, "glm4moe", cfg, [b])[0]
        assert lx.memory_seq_span(rt._ctx.drafters[("mtp", 1)].ctx, 1)[0] == n


@pytest.mark.parametrize("n_batch", [256, 64])
def test_a_running_lender_gives_the_borrower_the_h_row_before_the_prefix_end(tiny_models, tmp_path, n_batch):
    """A lender still catching up holds the target's h row of keep-1: in its queued row at keep (the
    prompt read in one chunk), or as its pending h row when keep is its frontier (the first of two
    chunks read, keep at its end). The borrower's head pairs its first row with it, not with zeros."""
    import numpy as np

    from mtp_cli.slots import BatchRunner

    kinds = _kinds(tiny_models, tmp_path)
    cfg = greedy(spec_type="mtp", draft_n_max=3, n_ctx=1024, n_batch=n_batch)
    a, b, n = _prompts(kinds, "glm4moe")
    with _load(kinds, "glm4moe", 2) as rt:
        runner = BatchRunner(rt)
        runner.add(rt.prepare(a, cfg, seq=0, reuse=True))
        runner.step()
        lender = rt._ctx.drafters[("mtp", 0)]
        q = lender.rows.batch
        at = np.flatnonzero(q.pos[: q.n_tokens] == min(n, n_batch))
        assert len(at) == (1 if n_batch > n else 0)
        want = (q.h[at[0]] if len(at) else lender.pending_h).copy()
        stats = runner.add(rt.prepare(b, cfg, seq=1, reuse=True))
        assert stats.n_cached == min(n, n_batch)
        got = rt._ctx.drafters[("mtp", 1)].pending_h
        assert np.abs(want).sum() > 0 and np.array_equal(got, want)
        runner.close()


def test_a_borrowers_head_forgets_the_prompt_rows_of_its_own_last_text(tiny_models, tmp_path):
    """Sequence 1 last read a prompt exactly as long as the prefix it now borrows: its head's recalled
    rows (drafters.recall) were that other text's and end where the borrowed prefix ends, so kept
    they would read as the new prompt's own. They are dropped; it recalls the new prompt's tail only."""
    kinds = _kinds(tiny_models, tmp_path)
    cfg = greedy(spec_type="mtp", draft_n_max=3, n_ctx=1024)
    a, b, n = _prompts(kinds, "glm4moe")
    with _load(kinds, "glm4moe", 2) as rt:
        other = (rt.tokenize("zebra yak xylophone walrus " * 12))[:n]
        assert len(other) == n and other[1:4] != a[1:4]
        list(rt.generate(other, cfg, seq=1, reuse=True))
        head = rt._ctx.drafters[("mtp", 1)]
        assert head.recall.end == n
        list(rt.generate(a, cfg, seq=0, reuse=True))
        g = rt.generate(b, cfg, seq=1, reuse=True)
        list(g)
        assert g.stats.n_cached == n
        toks, _ = head.recall.below(len(b))
        assert [int(t) for t in toks] == b[n:]
