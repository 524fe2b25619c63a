"""drafters.joint: drafting steps whose decodes are merged by context, as many rows as one batch takes,
each step sent where its rows sat."""

from __future__ import annotations

import pytest

from mtp_cli import llama_ext as lx
from mtp_cli.drafters.base import Drafter, Need, Placed
from mtp_cli.drafters.joint import Joint, alone


class _Ctx:
    """A stand-in context: n_batch rows, the batches decoded in it, and tokens it refuses."""

    def __init__(self, n_batch: int, bad: tuple[int, ...] = ()):
        self.n_batch, self.bad, self.decoded = n_batch, bad, []


@pytest.fixture
def fake_decode(monkeypatch):
    def decode(ctx, batch):
        n = batch.n_tokens
        if set(batch.tokens[:n].tolist()) & set(ctx.bad):
            raise lx.LlamaError("refused")
        ctx.decoded.append((batch.tokens[:n].tolist(), batch.seq_ids[:n].tolist(), batch.logits[:n].tolist()))

    monkeypatch.setattr(lx, "decode", decode)
    monkeypatch.setattr(lx, "n_batch", lambda ctx: ctx.n_batch)


def _step(ctx, seq: int, sizes: list[int], seen: list, closed: list, d: Drafter | None = None):
    """A drafting step of sequence `seq` that waits on decodes of sizes[i] rows (the last one an
    output row); it returns [seq] * len(sizes), and notes where each decode's rows sat."""
    d = d or Drafter()
    try:
        for i, n in enumerate(sizes):
            b = lx.Batch(8, seq_id=seq)
            b.add_many([100 * seq + 10 * i + j for j in range(n)], 0, logits_last=True)
            at = yield Need(d, ctx, b)
            seen.append((seq, i, at))
        return [seq] * len(sizes)
    finally:
        closed.append(seq)


def test_steps_of_one_context_share_the_decodes_that_fit_one_batch(fake_decode):
    ctx, seen, closed = _Ctx(4), [], []
    steps = {s: _step(ctx, s, sizes, seen, closed) for s, sizes in ((0, [3, 1]), (1, [2]), (2, [1, 1]))}
    got = Joint().run(steps)
    assert got == {0: [0, 0], 1: [1], 2: [2, 2]}
    # 0's three rows and 2's one fill four; 1's two wait for the next decode, beside the others' next
    assert ctx.decoded == [
        ([0, 1, 2, 200], [0, 0, 0, 2], [0, 0, 1, 1]),
        ([100, 101, 10, 210], [1, 1, 0, 2], [0, 1, 1, 1]),
    ]
    assert (0, 0, Placed(0, 0)) in seen and (2, 0, Placed(3, 1)) in seen  # (row 3, after 0's one output)
    assert (1, 0, Placed(0, 0)) in seen and (0, 1, Placed(2, 1)) in seen and (2, 1, Placed(3, 2)) in seen
    assert sorted(closed) == [0, 1, 2]


def test_without_merging_each_decode_is_its_own(fake_decode):
    ctx, seen, closed = _Ctx(4), [], []
    got = Joint(merge=False).run({s: _step(ctx, s, [1, 1], seen, closed) for s in (0, 1)})
    assert got == {0: [0, 0], 1: [1, 1]} and len(ctx.decoded) == 4
    assert all(at == Placed(0, 0) for _, _, at in seen)


def test_a_refused_shared_decode_is_retried_apart_so_only_the_step_at_fault_fails(fake_decode):
    ctx, other, seen, closed = _Ctx(4, bad=(100,)), _Ctx(4), [], []
    steps = {0: _step(ctx, 0, [1], seen, closed), 1: _step(ctx, 1, [1], seen, closed)}
    got = Joint().run({**steps, 2: _step(other, 2, [1], seen, closed)})
    assert isinstance(got[1], lx.LlamaError) and got[0] == [0] and got[2] == [2]
    assert ctx.decoded == [([0], [0], [1])]  # (0's row alone, after the merged batch was refused)
    assert sorted(closed) == [0, 1, 2]  # (the failed one closed: its cleanup ran)


def test_a_step_that_raises_ends_alone(fake_decode):
    ctx, seen, closed = _Ctx(4), [], []

    def broken():
        yield Need(Drafter(), ctx, lx.Batch(1))
        raise ValueError("no rows")

    got = Joint().run({0: broken(), 1: _step(ctx, 1, [1, 1], seen, closed)})
    assert isinstance(got[0], ValueError) and got[1] == [1, 1]


def test_alone_decodes_each_need_as_its_drafters_own(fake_decode):
    ctx, seen, closed, d = _Ctx(4), [], [], Drafter()
    assert alone(_step(ctx, 3, [2, 1], seen, closed, d)) == [3, 3]
    assert len(ctx.decoded) == 2 and d.n_decode == 2 and all(at == Placed(0, 0) for _, _, at in seen)


def test_a_shared_decode_is_charged_in_equal_shares(fake_decode):
    ctx, seen, closed, ds = _Ctx(4), [], [], [Drafter(), Drafter()]
    Joint().run({s: _step(ctx, s, [1], seen, closed, ds[s]) for s in (0, 1)})
    assert [d.n_decode for d in ds] == [1, 1] and ds[0].t_decode == ds[1].t_decode > 0


def test_alone_closes_a_step_whose_decode_fails(fake_decode):
    """Its cleanup (the loop's: the steer and grammar copy it lent the drafter) runs at once, not
    whenever the generator is collected."""
    ctx, seen, closed = _Ctx(4, bad=(300,)), [], []
    with pytest.raises(lx.LlamaError):
        alone(_step(ctx, 3, [1], seen, closed))
    assert closed == [3]


def test_needs_of_different_head_layers_do_not_share_a_decode(fake_decode, monkeypatch):
    """Chained heads switch the head for the whole context: only needs of one layer merge, and the
    layer is set before each decode."""
    layers: list[int] = []
    monkeypatch.setattr(lx, "set_nextn_layer_offset", lambda ctx, layer: layers.append(layer))
    ctx = _Ctx(8)

    def chained(seq: int, order: list[int]):
        d = Drafter()
        for i, layer in enumerate(order):
            b = lx.Batch(2, seq_id=seq)
            b.add(10 * seq + i, 0, logits=True)
            yield Need(d, ctx, b, layer=layer)
        return [seq]

    got = Joint().run({0: chained(0, [0, 1]), 1: chained(1, [1, 0]), 2: chained(2, [0, 1])})
    assert got == {0: [0], 1: [1], 2: [2]}
    # 0's and 2's layer-0 rows together; 1's layer 1 waits: merged with 0's and 2's layer 1 next
    assert ctx.decoded[0][0] == [0, 20] and ctx.decoded[1][0] == [10, 1, 21] and ctx.decoded[2][0] == [11]
    assert layers == [0, 1, 0]


def test_a_need_marked_alone_shares_no_decode(fake_decode):
    """Rows without outputs where h rows are extracted by output (chained heads of an unknown graph:
    their catch-up) would hand the next need their h: such a need decodes by itself."""
    ctx = _Ctx(8)

    def step(seq: int, alone_first: bool):
        d = Drafter()
        for i, solo in enumerate((alone_first, False)):
            b = lx.Batch(2, seq_id=seq)
            b.add(10 * seq + i, 0, logits=not solo)
            yield Need(d, ctx, b, alone=solo)
        return [seq]

    got = Joint().run({0: step(0, True), 1: step(1, False), 2: step(2, False)})
    assert got == {0: [0], 1: [1], 2: [2]}
    assert [toks for toks, _, _ in ctx.decoded] == [[0], [10, 20, 1], [11, 21]]  # (its next need merges)


def test_an_interrupted_shared_decode_is_not_retried(fake_decode, monkeypatch):
    ctx, seen, closed = _Ctx(4), [], []

    real, calls = lx.decode, []

    def interrupted(ctx, batch):  # (the merged decode is interrupted; a retry would succeed)
        calls.append(batch.n_tokens)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real(ctx, batch)

    monkeypatch.setattr(lx, "decode", interrupted)
    got = Joint().run({s: _step(ctx, s, [1], seen, closed) for s in (0, 1)})
    assert all(isinstance(g, KeyboardInterrupt) for g in got.values()) and sorted(closed) == [0, 1]
    assert calls == [2]
