"""Chained drafters (drafters.chain, llama.cpp's `--spec-type draft-mtp,ngram-mod`): names and order,
refusals, output equal to plain decoding, and every member kept in step by the steps others draft."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from click.testing import CliRunner

from mtp_cli import drafters
from mtp_cli import llama_ext as lx
from mtp_cli.cli import main
from mtp_cli.drafters.base import Drafter
from mtp_cli.drafters.chain import Chain
from mtp_cli.drafters.joint import alone
from mtp_cli.drafters.lookup import LookupDrafter
from mtp_cli.drafters.mtp import MtpDrafter
from mtp_cli.drafters.ngram import NgramDrafter
from mtp_cli.errors import ConfigError
from mtp_cli.loop import VerifyLoop
from mtp_cli.policy import UNTIMED_AFTER_LOOKUP, UNTIMED_AFTER_PROMPT, DraftPolicy
from mtp_cli.runtime import Runtime
from tests.factory import TinySpec, token_permutation
from tests.parity import SENSITIVE, greedy, run


def test_chains_are_named_and_ordered_as_llama_cpp_tries_them():
    c = drafters.get("draft-mtp,ngram-mod")
    assert issubclass(c, Chain) and c.members == (LookupDrafter, MtpDrafter) and c.name == "lookup,mtp"
    assert drafters.get(" MTP , ngram ").members == (NgramDrafter, MtpDrafter)  # (lookups first, as llama.cpp)
    assert drafters.get("ngram,lookup").members == (NgramDrafter, LookupDrafter)  # (otherwise the order given)
    assert drafters.get("lookup,ngram-mod") is LookupDrafter  # (one member twice: itself)
    assert drafters.get("draft-mtp,ngram-mod") is c  # (one class per chain)
    assert c.draft_file == "optional" and c.drafts_with_model and c.target_h and c.can_resume and c.can_sleep
    with pytest.raises(ConfigError, match="none cannot be chained"):
        drafters.get("none,ngram")
    with pytest.raises(ConfigError, match="one drafter that drafts with a model, got mtp and draft"):
        drafters.get("mtp,draft")
    with pytest.raises(ConfigError, match="unknown spec type 'medusa' in 'mtp,medusa'"):
        drafters.get("mtp,medusa")


def _cycle_prompt(rt: Runtime) -> list[int]:
    """A stretch of the structured model's greedy cycle, then its start again: the continuation repeats
    it (the lookup's), then goes on past it (the head's)."""
    perm = token_permutation(TinySpec(arch="glm4moe"))
    x = int(np.nonzero(perm >= 0)[0][10])
    cyc = [x]
    for _ in range(12):
        cyc.append(int(perm[cyc[-1]]))
    return [1, *cyc, 200, 201, *cyc[:2]]


def _proposers(monkeypatch) -> list[tuple[str, int, int]]:
    """(member, drafted, kept) of every step a chain drafted."""
    seen: list[tuple[str, int, int]] = []
    real = Chain.accept

    def accept(self, n_accepted, drafts):
        if drafts and self.proposer is not None:
            seen.append((self.proposer.name, len(drafts), n_accepted))
        real(self, n_accepted, drafts)

    monkeypatch.setattr(Chain, "accept", accept)
    return seen


@pytest.mark.parametrize("arch", ["glm4moe", "qwen35"])
def test_a_chain_keeps_every_member_in_step(tiny_models, arch, monkeypatch):
    """A head that always agrees with the target (no noise) and a lookup that drafts past where the
    text stops repeating: the lookup's steps (rejected tails included, rolled back on the recurrent
    target too) leave the head in step, so every one of the head's drafts is still kept; the output
    is plain decoding's."""
    s = tiny_models(arch, head_noise=0.0)
    seen = _proposers(monkeypatch)
    with Runtime.load(s["full"], spec_type="lookup,mtp") as rt:
        prompt = _cycle_prompt(rt)
        ref = run(rt, prompt, greedy(n_predict=40))
        assert run(rt, prompt, greedy(spec_type="draft-mtp,ngram-mod", draft_n_max=16, n_predict=40)) == ref
    by = {name: [(k, a) for n, k, a in seen if n == name] for name in ("lookup", "mtp")}
    assert by["lookup"] and by["mtp"], seen
    assert any(a < k for k, a in by["lookup"])  # (the lookup overshot at least once)
    assert all(a == k for k, a in by["mtp"]), by["mtp"]


class _Nap(DraftPolicy):
    """Drafting off (asleep) for steps 1..3 (where the text still repeats the prompt), then on again."""

    def step(self, drafted: int, accepted: int, t_consumer: float, done: int) -> int:
        self.sleep = 1 <= done < 4
        return 0 if self.sleep else self.n_max


def test_while_the_head_sleeps_the_lookup_drafts_and_the_head_wakes_in_step(tiny_models, monkeypatch):
    """Drafting off (a policy's sleep): the head is not called and the target computes no h rows,
    while the lookup, which needs every token, goes on drafting; woken, the head restarts at the
    current position and every one of its drafts is kept again (it agrees with the target)."""
    s = tiny_models("glm4moe", head_noise=0.0)
    seen = _proposers(monkeypatch)
    with Runtime.load(s["full"], spec_type="lookup,mtp") as rt:
        prompt = _cycle_prompt(rt)
        ref = run(rt, prompt, greedy(n_predict=40))
        cfg = greedy(spec_type="lookup,mtp", draft_n_max=4, n_predict=40)
        steps: list[tuple[int, bool]] = []
        real = Chain.drafting_each

        def spy(self, id_last, pos, n_for, n_min=1):
            out = yield from real(self, id_last, pos, n_for, n_min)
            steps.append((len(out), self.sleeping))
            return out

        monkeypatch.setattr(Chain, "drafting_each", spy)
        assert run(rt, prompt, cfg) == ref
        nap = _Nap(4)
        assert [ev.token for ev in rt.generate(prompt, cfg, policy=nap)] == ref
    assert any(k and asleep for k, asleep in steps), str(steps)  # the lookup drafted while the head slept
    heads = [(k, a) for n, k, a in seen if n == "mtp"]
    assert heads and all(a == k for k, a in heads), heads


class _Blink(DraftPolicy):
    """Drafting off for step 1 only: the lookup drafts on the last step the head sleeps through."""

    def step(self, drafted: int, accepted: int, t_consumer: float, done: int) -> int:
        self.sleep = done == 1
        return 0 if self.sleep else self.n_max


def test_a_head_woken_after_a_lookup_step_pairs_with_the_kept_draft_row(tiny_models, monkeypatch):
    """The target's last decode before the head wakes held the lookup's drafts: the head's first row
    pairs with the h row of the last kept one (row a), not of the step's first token (row 0)."""
    s = tiny_models("glm4moe", head_noise=0.0)
    last: dict = {}
    settle, restart = VerifyLoop._settle, MtpDrafter.restart

    def spy_settle(self, drafts, a, nxt):
        if self.h_on:
            h = lx.get_embeddings_nextn(self.tgt, a + 1, copy=True, n_embd=self.drafter.parts[-1].E)
            last.update(a=a, rows=h)
        settle(self, drafts, a, nxt)

    def spy_restart(self, pos, h=True, row=0):
        restart(self, pos, h, row)
        woke.append((last["a"], np.array_equal(self.pending_h, last["rows"][last["a"]])))

    woke: list[tuple[int, bool]] = []
    monkeypatch.setattr(VerifyLoop, "_settle", spy_settle)
    monkeypatch.setattr(MtpDrafter, "restart", spy_restart)
    with Runtime.load(s["full"], spec_type="lookup,mtp") as rt:
        prompt = _cycle_prompt(rt)
        cfg = greedy(spec_type="lookup,mtp", draft_n_max=4, n_predict=40)
        assert [ev.token for ev in rt.generate(prompt, cfg, policy=_Blink(4))] == run(rt, prompt, greedy(n_predict=40))
    assert woke and woke[0][0] >= 1 and woke[0][1], woke


class _Told(DraftPolicy):
    """Drafting on throughout; what the loop tells it, in order."""

    def __init__(self, n_max: int):
        super().__init__(n_max)
        self.log: list[tuple[str, float]] = []

    def step(self, drafted: int, accepted: int, t_consumer: float, done: int) -> int:
        self.log.append(("step", done))
        return self.n_max

    def foreign(self, seconds: float) -> None:
        self.log.append(("foreign", seconds))

    def end(self, done: int) -> None:
        self.log.append(("end", done))


def test_the_policy_times_neither_a_lookups_step_nor_the_first_after_another_decode(tiny_models, monkeypatch):
    """A lookup's step is not the head's policy's to time, nor are the first steps after it or after
    the prompt (a plain step right after a big batch runs slow): those are told as foreign steps,
    without the time the consumer took over their tokens."""
    s = tiny_models("glm4moe", head_noise=0.0)
    by_lookup: list[bool] = []
    real = Chain.drafting_each

    def spy(self, id_last, pos, n_for, n_min=1):
        out = yield from real(self, id_last, pos, n_for, n_min)
        by_lookup.append(bool(out) and isinstance(self.proposer, LookupDrafter))
        return out

    monkeypatch.setattr(Chain, "drafting_each", spy)
    pol = _Told(4)
    cfg = greedy(spec_type="lookup,mtp", draft_n_max=4, n_predict=40)
    with Runtime.load(s["full"], spec_type="lookup,mtp") as rt:
        for _ in rt.generate(_cycle_prompt(rt), cfg, policy=pol):
            time.sleep(0.1)  # (a slow consumer: none of its time is a step's)
    told, seconds = set(), []
    for i, (kind, x) in enumerate(pol.log):  # (a step's report comes before the next step's call, or end's)
        if kind == "foreign":
            told.add(int(pol.log[i + 1][1]) - 1)
            seconds.append(x)
    n = len(by_lookup)
    assert pol.log[-1] == ("end", n) and any(by_lookup)
    lookups = {j for j, b in enumerate(by_lookup) if b}
    after = {j + i for j in lookups for i in range(1, UNTIMED_AFTER_LOOKUP + 1)}
    assert told == (set(range(UNTIMED_AFTER_PROMPT)) | lookups | after) & set(range(n)) and len(told) < n
    assert max(seconds) < 0.1


@pytest.mark.parametrize("spec", ["lookup,mtp", "ngram,mtp", "ngram,lookup"])
def test_chains_decode_as_plain_decoding_greedy_and_sampled(tiny_models, spec):
    s = tiny_models("glm4moe", head_noise=1.0, **SENSITIVE)
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize(" ".join(["hello world the a"] * 4))
        for n in (1, 3, 8):
            assert run(rt, prompt, greedy(spec_type=spec, draft_n_max=n)) == run(rt, prompt, greedy()), (spec, n)
        sampled = greedy(temp=0.9, seed=3, n_predict=30)
        out = run(rt, prompt, greedy(spec_type=spec, draft_n_max=4, temp=0.9, seed=3, n_predict=30))
        assert out == run(rt, prompt, sampled)


def test_the_command_line_takes_a_chain_and_its_environment_variable(tiny_models, monkeypatch):
    s = tiny_models("glm4moe", head_noise=0.0)
    args = ["generate", "-m", str(s["full"]), "-p", "hello world", "-n", "12", "--temp", "0", "-t", "1", "--json"]
    plain = json.loads(CliRunner().invoke(main, args).stdout)
    r = CliRunner().invoke(main, [*args, "--spec-type", "draft-mtp,ngram-mod", "--spec-draft-n-max", "4"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["text"] == plain["text"] and doc["stats"]["spec_type"] == "lookup,mtp" and doc["stats"]["n_accepted"]
    monkeypatch.setenv("LLAMA_ARG_SPEC_TYPE", "mtp,ngram")
    doc = json.loads(CliRunner().invoke(main, args).stdout)
    assert doc["text"] == plain["text"] and doc["stats"]["spec_type"] == "ngram,mtp"
    r = CliRunner().invoke(main, [*args, "--spec-type", "mtp,medusa"])
    assert r.exit_code == 2 and "unknown spec type 'medusa' in 'mtp,medusa'" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, [*args, "--spec-type", "none,ngram"])
    assert r.exit_code == 2 and "none cannot be chained" in r.output


class _Fixed(Drafter):
    """A member that always drafts the same tokens (as many as asked, up to its own)."""

    n_max_limit = None
    can_sleep = False
    rows = n_ctx = None

    def __init__(self, toks: list[int]):
        super().__init__()
        self.toks, self.asked = toks, []

    def draft(self, id_last: int, pos: int, n_max: int) -> list[int]:
        self.asked.append(n_max)
        return self.toks[: max(n_max, 0)]


def test_drafts_too_short_for_n_min_leave_the_step_to_the_next_member():
    """--spec-draft-n-min discards shorter drafts: a lookup's 2 tokens must not stop the head's 4."""
    short, head = _Fixed([5, 6]), _Fixed([7, 8, 9, 10])
    chain = Chain([short, head])  # type: ignore[list-item]
    assert alone(chain.drafting_each(1, 0, lambda m: 4, n_min=3)) == [7, 8, 9, 10] and chain.proposer is head
    assert alone(chain.drafting_each(1, 0, lambda m: 4)) == [5, 6] and chain.proposer is short and head.asked[-1] == 0
