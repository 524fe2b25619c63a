"""Drafting steps run alone, or several sequences' together: one drafter decode (an MTP head's, a
draft model's) per draft position for every sequence whose drafter decodes in the same context
(llama.cpp's one speculative context for all slots), not one per sequence.

    drafts = alone(d.drafting(id_last, pos, n))      # one drafter: each decode its own
    got = Joint().run({seq: drafting, ...})           # several: their decodes merged by context

A drafting step (drafters.base.Drafting) yields the decodes it waits on. `run` advances every step
to its next yield, merges the waiting batches of one context into one (as many as fit its n_batch),
decodes it once, sends each step where its rows sat and goes on until every step has returned. Each
drafter is charged an equal share of a decode it shared.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import TypeVar, Union

from mtp_cli import llama_ext as lx
from mtp_cli.drafters.base import Drafting, Need, Placed

_now = time.perf_counter

K = TypeVar("K", bound=Hashable)
ALONE = Placed(0, 0)


def alone(step: Drafting) -> list[int]:
    """Run a drafting step by itself: each decode it waits on is its drafter's own."""
    try:
        need = next(step)
        while True:
            try:
                _decode_alone(need)
            except BaseException:
                step.close()  # (its cleanup now: the steer and grammar copy it holds are the drafter's)
                raise
            need = step.send(ALONE)
    except StopIteration as e:
        return list(e.value)


def _decode_alone(need: Need) -> None:
    """The need's decode as its drafter's own (its head layer set first)."""
    if need.layer is not None:
        lx.set_nextn_layer_offset(need.ctx, need.layer)
    need.drafter._decode(need.ctx, need.batch)


def _fail(step: Drafting, e: BaseException, key: K, done: dict[K, Union[list[int], BaseException]]) -> None:
    """The step ends with e, its cleanup run now."""
    try:
        step.close()
    except BaseException as e2:  # (a cleanup that fails: the step's error is still e)
        e.__context__ = e.__context__ or e2
    done[key] = e


class Joint:
    """Runs several sequences' drafting steps with their decodes merged (a batch per context, kept)."""

    def __init__(self, merge: bool = True) -> None:
        self.merge = merge  # (False: each decode alone, as if every step ran by itself)
        self._batches: dict[int, lx.Batch] = {}  # by id(ctx): the merged batch

    def run(self, steps: dict[K, Drafting]) -> dict[K, Union[list[int], BaseException]]:
        """Every step's drafts, or what it raised (a merged decode llama.cpp refuses is retried need by
        need, so only a step at fault fails; an interrupt fails every step that shared it)."""
        done: dict[K, Union[list[int], BaseException]] = {}
        waiting: dict[K, Need] = {}
        for key, step in steps.items():
            self._advance(key, step, None, waiting, done)
        while waiting:
            group = self._group(waiting)
            needs = [waiting.pop(k) for k in group]
            try:
                placed = self._decode(needs)
            except BaseException as e:
                if len(group) == 1 or not isinstance(e, Exception):  # (Ctrl-C: nothing to retry)
                    for k in group:
                        _fail(steps[k], e, k, done)
                    continue
                # (llama.cpp refused the merged batch: each alone, so only a step at fault fails)
                for k, need in zip(group, needs):
                    try:
                        _decode_alone(need)
                    except BaseException as e1:
                        _fail(steps[k], e1, k, done)
                        continue
                    self._advance(k, steps[k], ALONE, waiting, done)
                continue
            for k, at in zip(group, placed):
                self._advance(k, steps[k], at, waiting, done)
        return done

    @staticmethod
    def _advance(key: K, step: Drafting, at: Placed | None, waiting: dict[K, Need], done: dict) -> None:
        try:
            waiting[key] = step.send(at)  # type: ignore[arg-type]  # (None starts it)
        except StopIteration as e:
            done[key] = list(e.value)
        except BaseException as e:
            done[key] = e

    def _group(self, waiting: dict[K, Need]) -> list[K]:
        """The waiting steps of the first one's context whose rows fit one batch together, in order."""
        first = next(iter(waiting.values()))
        if not self.merge or first.alone:
            return [next(iter(waiting))]
        room = lx.n_batch(first.ctx)
        group: list[K] = []
        for k, need in waiting.items():  # (the first always: alone, a batch too big fails at its decode)
            same = need.ctx is first.ctx and need.layer == first.layer and not need.alone
            if same and (not group or need.batch.n_tokens <= room):
                group.append(k)
                room -= need.batch.n_tokens
        return group

    def _decode(self, needs: list[Need]) -> list[Placed]:
        """Decode the needs' rows as one batch (alone: its own batch); where each one's rows sat."""
        if len(needs) == 1:
            _decode_alone(needs[0])
            return [ALONE]
        ctx = needs[0].ctx
        if needs[0].layer is not None:
            lx.set_nextn_layer_offset(ctx, needs[0].layer)
        b = self._batch(ctx, needs[0].batch.n_embd)
        b.clear()
        placed = []
        for need in needs:
            out0 = int(b.logits[: b.n_tokens].sum())
            placed.append(Placed(b.extend(need.batch), out0))
        t = _now()
        lx.decode(ctx, b)
        share = (_now() - t) / len(needs)
        for need in needs:
            need.drafter.charge(share)
        return placed

    def _batch(self, ctx: lx.Context, n_embd: int) -> lx.Batch:
        b = self._batches.get(id(ctx))
        cap = lx.n_batch(ctx)
        if b is None or b.capacity != cap or b.n_embd != n_embd:
            b = self._batches[id(ctx)] = lx.Batch(cap, n_embd)
        return b


__all__ = ["ALONE", "Joint", "alone"]
