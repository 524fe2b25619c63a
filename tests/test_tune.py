"""tune and bench (mtp_cli.speed.tune, mtp_cli.speed.bench) and their commands: a small budget picks
and saves, every bench row, one-line errors. One thread.
"""

from __future__ import annotations

import json

import pytest

from mtp_cli.runtime import Runtime
from mtp_cli.speed import profiles
from mtp_cli.speed.auto import AutoDraft
from tests.speedkit import THREADS, greedy, run_cli


@pytest.fixture(scope="session")
def models(tiny_models):
    return lambda arch="glm4moe", **kw: tiny_models(arch, "structured", "q8_0", **kw)


def test_tune_small_budget_picks_and_saves(models, config_dir):
    from mtp_cli.speed.tune import tune

    path = models(head_noise=1.0)["full"]
    events = []
    res = tune(path, budget=4.0, n_threads=THREADS, n_max=4, progress=events.append)
    assert res.best is not None and res.best.tokens_per_second > 0
    assert {e.kind for e in events} >= {"start", "costs", "screen", "rung", "done"}
    measured = [c for c in res.candidates if c.runs]
    assert len(measured) >= 3 and res.baseline.runs
    cm = res.cost
    assert cm.t_ms > 0 and len(cm.verify) == 5 and cm.draft > 0
    assert res.profile_path == config_dir / profiles.PROFILE_FILE
    with Runtime.load(path, spec_type="mtp") as rt:
        prof = profiles.find(AutoDraft(rt).profile_key(greedy(spec_type="mtp")))
        assert prof is not None and prof.setting == ("off" if res.best.spec_type == "none" else res.best.name)
        assert prof.cost_model["break_even"] and prof.settings


def test_a_profile_is_found_only_where_the_weights_go_as_tuned(models, config_dir):
    """Tuned with a placement (here: no repacking; over RPC the servers and -ngld), `auto` finds
    the profile on a runtime placed the same way and not on one placed otherwise."""
    from mtp_cli.config import LoadConfig, Placement
    from mtp_cli.speed.tune import tune

    path = models(head_noise=1.0)["full"]
    where = Placement(repack=False)
    tune(path, LoadConfig(placement=where), budget=3.0, n_threads=THREADS, n_max=2)
    for placed, found in ((where, True), (Placement(), False)):
        with Runtime.load(path, spec_type="mtp", placement=placed) as rt:
            res = AutoDraft(rt).resolve(greedy(spec_type="mtp", draft_mode="auto"))
            assert (res.mode == "profile") is found


def test_cli_tune_json_and_report(models, config_dir):
    path = str(models(head_noise=1.0)["full"])
    r = run_cli("tune", "-m", path, "--budget", "3", "-t", "1", "--n-max", "3", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["best"]["name"] and doc["cost_model"]["verify"] and doc["profile_path"]
    r = run_cli("tune", "-m", path, "--budget", "3", "-t", "1", "--n-max", "2", "--no-save")
    assert r.exit_code == 0, r.output
    assert "tokens per second by setting" in r.stdout and "cost model" in r.stdout and "best:" in r.stdout
    assert "saved profile" not in r.stdout


def test_cli_bench_prints_every_row(models):
    path = str(models(head_noise=1.0)["full"])
    r = run_cli("bench", "-m", path, "-n", "8", "--repeats", "1", "-t", "1")
    assert r.exit_code == 0, r.output
    for name in ("none", "ngram N=3", "lookup", "mtp N=1", "mtp N=2", "mtp N=3", "mtp N=4", "auto", "adaptive"):
        assert f"\n {name} " in "\n" + r.stdout or r.stdout.startswith(f" {name}"), name
    r = run_cli("bench", "-m", path, "-n", "8", "--repeats", "1", "-t", "1", "--json")
    rows = json.loads(r.stdout)["rows"]
    auto = next(x for x in rows if x["name"] == "auto")
    assert auto["detail"].startswith("lookup,mtp; no profile: adaptive"), auto["detail"]
    assert [x["name"] for x in rows] == [
        "none",
        "ngram N=3",
        "lookup",
        "mtp N=1",
        "mtp N=2",
        "mtp N=3",
        "mtp N=4",
        "auto",
        "adaptive",
    ]
    assert rows[0]["ratio_vs_none"] == 1.0 and all(x["tokens_per_second"] > 0 for x in rows)


def test_cli_bench_without_a_head_skips_mtp_rows(models):
    r = run_cli("bench", "-m", str(models(head_noise=1.0)["trunk"]), "-n", "4", "--repeats", "1", "-t", "1", "--json")
    assert r.exit_code == 0, r.output
    rows = {x["name"]: x for x in json.loads(r.stdout)["rows"]}
    assert rows["none"]["tokens_per_second"] > 0 and rows["adaptive"].get("skipped")
    assert rows["auto"]["detail"].startswith("lookup;") and rows["lookup"]["tokens_per_second"] > 0


@pytest.mark.parametrize(
    "args,msg",
    [
        (["tune", "-m", "{trunk}", "--budget", "2"], "has no MTP head"),
        (["tune", "-m", "{full}", "--budget", "0"], "--budget must be positive"),
        (["tune", "-m", "{full}", "--prompts", "{empty}"], "no prompts"),
        (["bench", "-m", "{missing}"], "no such file"),
        (["generate", "-m", "{full}", "-p", "hi", "--spec-draft-n-max", "often"], "a number, auto or adaptive"),
        (["generate", "-m", "{full}", "-p", "hi", "--spec-draft-n-max", "auto"], "profile store is corrupt"),
    ],
)
def test_cli_errors_one_line_exit_2(models, tmp_path, config_dir, args, msg):
    s = models(head_noise=1.0)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    if "corrupt" in msg:
        config_dir.mkdir(parents=True)
        (config_dir / profiles.PROFILE_FILE).write_text("[]")
    args = [a.format(trunk=s["trunk"], full=s["full"], empty=empty, missing=tmp_path / "nope.gguf") for a in args]
    r = run_cli(*args)
    assert r.exit_code == 2, r.output
    assert msg in r.output and len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_bench_and_generate_report_no_rate_for_a_single_token(models):
    """-n 1: the token is the prompt pass's, with no generation time to divide by (it read 15,000+ tok/s)."""
    path = str(models(head_noise=1.0)["full"])
    r = run_cli("bench", "-m", path, "-n", "1", "--repeats", "1", "-t", "1", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    assert all(x.get("skipped") or (x["tokens_per_second"] == 0 and x["ratio_vs_none"] is None) for x in rows), rows
    r = run_cli("generate", "-m", path, "-p", "hello", "-n", "1", "--temp", "0", "-t", "1")
    assert r.exit_code == 0 and "1 generated (none after the prompt pass to time)" in r.stderr, r.output
    r = run_cli("generate", "-m", path, "-p", "hello", "-n", "1", "--temp", "0", "-t", "1", "--json")
    assert json.loads(r.stdout)["stats"]["tokens_per_second"] == 0.0


def test_prompts_the_model_ends_at_once_measure_nothing_and_save_nothing(models, config_dir, tmp_path):
    """It printed `best: off` and saved a 0.0 tok/s profile that `auto` then trusted."""
    from tests.factory import tiny_vocab

    world = tiny_vocab()[0].index("\u2581world")
    path = str(models(head_noise=1.0, eos_after=world)["full"])
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world\nthe world\n")  # each ends on the token after which the model stops
    for cmd in (["tune", "-m", path, "--budget", "3"], ["bench", "-m", path, "-n", "8", "--repeats", "1"]):
        r = run_cli(*cmd, "--prompts", str(prompts), "-t", "1")
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert r.exit_code == 2 and "nothing to measure" in lines[-1] and "--prompts" in lines[-1], r.output
    assert not (config_dir / profiles.PROFILE_FILE).exists()


def test_a_first_rung_over_the_budget_drops_p_min_variants_then_the_slowest_predicted():
    """Over a slow RPC link 13 settings did not fit 40 s: the first rung shrank to 16 tokens of one
    prompt and picked N=7 (1.85x there, 1.1x on the next prompts). Settings go first, tokens last."""
    from mtp_cli.speed.tune import Candidate, _Tuner

    t = _Tuner.__new__(_Tuner)
    t.off = Candidate("off", "none", 0, status="baseline")
    alive = [t.off, *(Candidate(f"mtp N={n}", "mtp", n, 0.0, p) for n, p in ((1, 1.1), (2, 1.3), (3, 1.25)))]
    alive.insert(2, Candidate("mtp N=2 p>=0.5", "mtp", 2, 0.5))
    before, order = list(alive), []
    while t._drop_least_promising(alive):
        order += [c.name for c in before if c not in alive and c.name not in order]
    assert order == ["mtp N=2 p>=0.5", "mtp N=1"] and [c.name for c in alive] == ["off", "mtp N=2", "mtp N=3"]
    assert all(c.status == "pruned" for c in before if c not in alive)


def test_off_and_fewer_drafts_win_unless_beaten_by_more_than_the_noise():
    from mtp_cli.speed.tune import Candidate, _Tuner

    def cand(name, spec, n, runs, acc=None):
        return Candidate(name, spec, n, runs=runs, acceptance=acc, rung=0)

    class T(_Tuner):
        def __init__(self, off):
            self.off = off

    off = cand("off", "none", 0, [99.0, 100.0, 101.0])
    noisy_win = cand("mtp N=2", "mtp", 2, [96.0, 101.0, 106.0], 0.4)  # 1% faster, 10% spread
    assert T(off)._pick([off, noisy_win]) is off
    never_kept = cand("mtp N=2 p>=0.8", "mtp", 2, [130.0, 131.0, 132.0], 0.0)  # faster, yet no draft kept
    assert T(off)._pick([off, never_kept]) is off
    n1 = cand("mtp N=1", "mtp", 1, [149.0, 150.0, 151.0], 0.6)
    n3 = cand("mtp N=3", "mtp", 3, [150.0, 151.0, 152.0], 0.5)  # within the noise of N=1: fewer drafts win
    assert T(off)._pick([off, n1, n3]) is n1
    clear = cand("mtp N=3", "mtp", 3, [170.0, 171.0, 172.0], 0.5)
    assert T(off)._pick([off, n1, clear]) is clear
    lookup = cand("lookup", "lookup", 0, [150.0, 151.0, 152.0], 0.8)  # (as fast as the head: no head decodes)
    assert T(off)._pick([off, n1, lookup]) is lookup
    chain = cand("lookup,mtp N=1", "lookup,mtp", 1, [149.0, 150.0, 151.0], 0.6)  # (the head, and copies too)
    assert T(off)._pick([off, n1, chain]) is chain


@pytest.mark.parametrize(
    "spec, n, kind",
    [
        ("none", 0, "off"),
        ("mtp", 2, "head"),
        ("draft-mtp", 1, "head"),
        ("lookup", 0, "lookup"),
        ("ngram-mod", 0, "lookup"),
        ("lookup,mtp", 2, "chain"),
        ("draft-mtp,ngram-mod", 3, "chain"),
        ("ngram", 0, "other"),  # (a fixed-N lookup: it drafts the policy's N, as a head does)
    ],
)
def test_a_candidates_kind_comes_from_its_drafters_traits_whatever_the_spelling(spec, n, kind):
    from mtp_cli.speed.tune import Candidate

    c = Candidate(spec, spec, n)
    got = (c.off, c.head_alone, c.lookup_alone, c.lookup and c.n > 0)
    want = {
        "off": (True, False, False, False),
        "head": (False, True, False, False),
        "lookup": (False, False, True, False),
        "chain": (False, False, False, True),
        "other": (False, False, False, False),
    }[kind]
    assert got == want


def test_tune_measures_the_lookup_and_the_chain_and_a_profile_holds_them(models, config_dir):
    """The lookup alone and chained before the head at the best-predicted N are measured beside the
    head; a profile of the chain gives the head its N beside the lookup, one of the lookup alone
    turns the head off and leaves the lookup."""
    from mtp_cli.speed.auto import LOOKUP_N_MAX
    from mtp_cli.speed.tune import tune

    path = models(head_noise=1.0)["full"]
    res = tune(path, budget=4.0, n_threads=THREADS, n_max=3, save=False)
    by = {c.name: c for c in res.candidates}
    assert "lookup" in by and any(n.startswith("lookup,mtp N=") for n in by), list(by)
    assert by["lookup"].rung >= 0 or by["lookup"].status == "pruned"
    with Runtime.load(path, spec_type="mtp") as rt:
        auto = AutoDraft(rt, config_dir)
        key = auto.profile_key(greedy(spec_type="mtp"))
        for spec, n, want in (("lookup,mtp", 2, ("lookup,mtp", 2)), ("lookup", 1, ("lookup", None))):
            prof = profiles.Profile(key, {}, None, {}, spec, n, 0.0, 100.0, 1.2)
            assert prof.setting == ("lookup" if spec == "lookup" else f"{spec} N={n}")
            profiles.save(prof, config_dir)
            r = auto.resolve(greedy(spec_type="lookup,mtp", draft_mode="auto"))
            assert r.mode == "profile" and r.config.draft_n_max == LOOKUP_N_MAX, r
            assert (r.config.spec_type, r.policy.n_max if r.policy else None) == want, r


def test_a_profile_with_the_head_off_leaves_the_rest_of_the_chain(models, config_dir):
    """Tuned off: `auto` drops the head from a chain; a lookup left alone sizes its own drafts (fixed
    at its cap), an ngram left beside it gets its N from adaptive, not the lookup's cap of 32."""
    from mtp_cli.speed.auto import LOOKUP_N_MAX

    path = models(head_noise=1.0)["full"]
    with Runtime.load(path, spec_type="mtp") as rt:
        auto = AutoDraft(rt)
        key = auto.profile_key(greedy(spec_type="mtp"))
        profiles.save(profiles.Profile(key, {}, None, {}, "none", 0, 0.0, 100.0, 1.0), config_dir)
        auto.config_dir = config_dir
        res = auto.resolve(greedy(spec_type="lookup,mtp", draft_mode="auto"))
        assert (res.config.spec_type, res.mode, res.config.draft_n_max) == ("lookup", "profile", LOOKUP_N_MAX)
        res = auto.resolve(greedy(spec_type="ngram,lookup,mtp", draft_mode="auto"))
        assert (res.config.spec_type, res.mode) == ("ngram,lookup", "adaptive") and res.controller is not None
        assert auto.resolve(greedy(spec_type="mtp", draft_mode="auto")).config.spec_type == "none"


def test_tuned_with_flash_attention_on_the_profile_is_what_slots_that_run_with_it_find(models, config_dir, monkeypatch):
    """`tune -fa on` keys its profile by flash attention on: a server of several slots whose probe
    turned it on finds it (and, without one, is told to tune so), one slot (off on a CPU) does not."""
    from mtp_cli import attention_probe
    from mtp_cli.config import LoadConfig
    from mtp_cli.speed.auto import NO_PROFILE_NOTE, NO_PROFILE_NOTE_FA

    monkeypatch.setattr(attention_probe, "measure", lambda *a: (1.0, 2.0))  # (this CPU: on for several)
    path = models(head_noise=1.0)["full"]
    cfg = greedy(spec_type="mtp", draft_mode="auto", n_threads=THREADS)
    with Runtime.load(path, LoadConfig(spec_type="mtp", n_parallel=2)) as rt:
        assert AutoDraft(rt).resolve(cfg).note == NO_PROFILE_NOTE_FA
    r = run_cli("tune", "-m", str(path), "--budget", "3", "-t", str(THREADS), "--n-max", "2", "-fa", "on")
    assert r.exit_code == 0, r.output
    for n_parallel, found in ((2, True), (1, False)):
        with Runtime.load(path, LoadConfig(spec_type="mtp", n_parallel=n_parallel)) as rt:
            res = AutoDraft(rt).resolve(cfg)
            assert (res.mode == "profile") is found, n_parallel
            assert found or res.note == NO_PROFILE_NOTE
