"""tune / bench / auto / adaptive: profile keys and store, the adaptive controller's decisions,
parity of adaptive decoding, and the CLI. Decisions are asserted with injected costs (never on
wall time); one thread (see test_runtime.py)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from gguf_tools.gguf_file import open_gguf
from mtp_cli import llama_ext as lx
from mtp_cli.speed import profiles
from mtp_cli.speed.adaptive import AdaptiveController
from mtp_cli.speed.auto import NO_PROFILE_NOTE, AutoDraft
from mtp_cli.cli import main
from mtp_cli.speed.costs import CostModel, expected_tokens, solve_alpha
from mtp_cli.config import GenConfig
from mtp_cli.runtime import Runtime
from tests.factory import tiny_model_set

THREADS = 1
FLAT = [1.0 + 0.05 * n for n in range(9)]  # a machine where verifying more tokens is nearly free


@pytest.fixture(scope="module", autouse=True)
def _quiet():
    lx.quiet_logs()


@pytest.fixture(autouse=True)
def config_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "config"
    monkeypatch.setenv(profiles.ENV_CONFIG_DIR, str(d))
    return d


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune")
    cache: dict = {}

    def get(arch: str = "glm4moe", **kw) -> dict[str, Path]:
        key = (arch, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = tiny_model_set(root / f"s{len(cache)}", arch, "structured", "q8_0", **kw)
        return cache[key]

    return get


def greedy(**kw) -> GenConfig:
    base = dict(n_predict=48, n_ctx=512, n_batch=64, n_threads=THREADS, temp=0.0)
    base.update(kw)
    return GenConfig(**base)


def tokens(rt: Runtime, prompt, cfg: GenConfig, draft_n=None, controller=None, auto: AutoDraft | None = None):
    """The tokens of one generation; draft_n "auto" / "adaptive" resolved as the CLI does (by `auto`)."""
    if draft_n is None:
        return [ev.token for ev in rt.generate(prompt, cfg)]
    res = (auto or AutoDraft(rt)).resolve(cfg, draft_n, controller)
    tokens.last = res  # type: ignore[attr-defined]
    return [ev.token for ev in rt.generate(prompt, res.config, policy=res.policy)]


# ---------------------------------------------------------------------------------------------
# profile keys and the store
# ---------------------------------------------------------------------------------------------


def test_model_key_is_stable_and_content_based(models, tmp_path):
    a = models(head_noise=1.0)["full"]
    k1 = profiles.model_identity(open_gguf(a))["key"]
    assert profiles.model_identity(open_gguf(a))["key"] == k1
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(a, copy)
    assert profiles.model_identity(open_gguf(copy))["key"] == k1  # the path is not part of the key
    # same layout, other head weights (a retrained head): the data samples differ
    b = models(head_noise=2.0)["full"]
    assert profiles.model_identity(open_gguf(b))["key"] != k1
    # one byte inside one tensor's sampled data
    gf = open_gguf(copy)
    t = gf.tensors["blk.2.nextn.eh_proj.weight"]
    with open(copy, "r+b") as f:
        f.seek(t.offset)
        byte = f.read(1)
        f.seek(t.offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert profiles.model_identity(open_gguf(copy))["key"] != k1
    # another layout (trunk only)
    assert profiles.model_identity(open_gguf(models(head_noise=1.0)["trunk"]))["key"] != k1


def test_model_key_reads_only_samples(models, monkeypatch):
    path = models(head_noise=1.0)["full"]
    read = []
    real_open = open

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def seek(self, *a):
            return self.f.seek(*a)

        def read(self, n=-1):
            assert n >= 0, "a read to the end of the file"
            data = self.f.read(n)
            read.append(len(data))
            return data

    monkeypatch.setattr(profiles, "open", lambda p, mode="r", *a, **k: Counting(real_open(p, mode, *a, **k)),
                        raising=False)
    ident = profiles.model_identity(open_gguf(path))
    n_tensors = ident["tensors"]
    assert sum(read) <= 2 * profiles.SAMPLE_BYTES * n_tensors < path.stat().st_size // 4


def test_profile_key_depends_on_machine_and_sidecar(models):
    s = models(head_noise=1.0)
    full, trunk, side = (open_gguf(s[k]) for k in ("full", "trunk", "sidecar"))
    a = profiles.identify(full, n_threads=1)
    assert a.key == profiles.identify(full, n_threads=1).key
    assert a.key != profiles.identify(full, n_threads=2).key
    assert a.key != profiles.identify(trunk, side, n_threads=1).key
    assert a.machine["cpu"] and a.machine["backend"] in ("cpu", "gpu")


def _profile(key: str, spec: str = "mtp", n: int = 2, p: float = 0.0) -> profiles.Profile:
    return profiles.Profile(key=key, model={"key": "m"}, draft=None, machine={}, spec_type=spec, draft_n_max=n,
                            draft_p_min=p, tokens_per_second=100.0, ratio_vs_none=1.2)


def test_store_save_load_replace(config_dir):
    assert profiles.config_dir() == config_dir
    assert profiles.find("k1") is None
    path = profiles.save(_profile("k1"))
    assert path == config_dir / profiles.PROFILE_FILE
    profiles.save(_profile("k2", "none"))
    profiles.save(_profile("k1", n=3, p=0.5))  # replaces
    got = profiles.find("k1")
    assert got is not None and got.draft_n_max == 3 and got.draft_p_min == 0.5 and got.setting == "mtp N=3 p>=0.5"
    assert profiles.find("k2").setting == "off"
    assert set(json.loads(path.read_text())["profiles"]) == {"k1", "k2"}


def test_corrupt_store_is_one_clear_error(config_dir):
    config_dir.mkdir(parents=True)
    (config_dir / profiles.PROFILE_FILE).write_text("{not json")
    with pytest.raises(profiles.ProfileError, match="corrupt"):
        profiles.find("k")


# ---------------------------------------------------------------------------------------------
# the cost model's arithmetic
# ---------------------------------------------------------------------------------------------


def test_break_even():
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert solve_alpha(1.75, 2) == pytest.approx(0.5, abs=1e-6)
    assert solve_alpha(0.9, 3) == 0.0 and solve_alpha(4.5, 3) is None
    cm = CostModel(t_ms=10.0, verify=[1.0, 1.8, 2.0], draft=0.3, draft_rows=[0.3, 0.35, 0.4], overhead_plain=0.0,
                   overhead={2: 0.1})
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

    with Runtime(models(arch, head_noise=1.0)["full"], spec_type="mtp") as rt:
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


# ---------------------------------------------------------------------------------------------
# the controller on its own (synthetic steps, injected costs)
# ---------------------------------------------------------------------------------------------


def simulate(ctl: AdaptiveController, alpha: float, steps: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    k = a = -1
    ctl.begin(0.0)
    for done in range(steps):
        n = ctl.step(k, a, 0.0, done)  # (answered without looking while drafting is off)
        if ctl.shadow:  # the runtime drafts one token, verifies none, reports the comparison
            ctl.shadow_result(rng.random() < alpha)
            k = a = 0
            continue
        k = n
        a = 0
        while a < k and rng.random() < alpha:
            a += 1
    ctl.end(steps)


def test_controller_off_for_a_useless_head_and_probes_rarely():
    ctl = AdaptiveController(8, costs=FLAT, measure=False)
    simulate(ctl, 0.0, 2000)
    assert ctl.best == 0 and ctl.sleep
    assert ctl.steps_at[0] > 0.98 * sum(ctl.steps_at)
    assert ctl.n_probes == 0 and ctl.n_shadow <= 15  # shadow steps only; gaps double to GAP_MAX


def test_controller_climbs_for_a_good_head():
    ctl = AdaptiveController(8, costs=FLAT, measure=False)
    simulate(ctl, 0.95, 600)
    assert ctl.best >= 4 and not ctl.sleep
    assert sum(ctl.steps_at[3:]) > 0.7 * sum(ctl.steps_at)


def test_controller_stops_when_drafting_cannot_pay():
    # a compute-bound machine: one draft costs more than the best case gains (cost(1) > 2 cost(0), ...)
    costs = [1.0] + [1.0 + 1.2 * n for n in range(1, 9)]
    ctl = AdaptiveController(8, costs=costs, measure=False)
    simulate(ctl, 1.0, 1000)
    assert ctl.best == 0 and ctl.n_probes <= 2


def test_controller_follows_a_change_in_the_text():
    ctl = AdaptiveController(4, costs=FLAT[:5], measure=False)
    simulate(ctl, 0.0, 300)
    assert ctl.best == 0
    simulate(ctl, 0.97, 1500, seed=1)  # the text became predictable: found again by probing
    assert ctl.best >= 2
    simulate(ctl, 0.0, 500, seed=2)  # and unpredictable again (evidence halves every ~69 steps)
    assert ctl.best == 0


# ---------------------------------------------------------------------------------------------
# adaptive and auto in the runtime
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["glm4moe", "qwen35"])
def test_adaptive_greedy_equals_plain(models, arch):
    """Switching N every few steps, sleeping and restarting the head: still plain decoding's tokens."""
    s = models(arch, head_noise=1.0, trunk_mix=2.0)
    with Runtime(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize("hello world")
        ref = tokens(rt, prompt, greedy(n_predict=120))
        ctl = AdaptiveController(4, costs=FLAT[:5], measure=False, start=2)
        out = tokens(rt, prompt, greedy(n_predict=120, spec_type="mtp"), "adaptive", ctl)
        assert out == ref
        assert rt.stats.n_drafted > 0 and 0 < rt.stats.n_accepted < rt.stats.n_drafted
        assert ctl.n_switches >= 1 and len([n for n in ctl.steps_at if n]) >= 2  # it did change N
        # off most of the time on a useless head (sleep / restart on every probe), same tokens
        u = models(arch, head_noise=8.0, trunk_mix=2.0)
    with Runtime(u["full"], spec_type="mtp") as rt:
        ref = tokens(rt, prompt, greedy(n_predict=120))
        ctl = AdaptiveController(4, costs=FLAT[:5], measure=False)
        assert tokens(rt, prompt, greedy(n_predict=120, spec_type="mtp"), "adaptive", ctl) == ref
        assert ctl.n_shadow >= 2 and ctl.n_probes == 0 and ctl.best == 0  # shadow probes only
        # off but kept in step (what longer plain steps get): same tokens
        ctl = AdaptiveController(4, costs=FLAT[:5], measure=False, may_sleep=False)
        assert tokens(rt, prompt, greedy(n_predict=120, spec_type="mtp"), "adaptive", ctl) == ref
        assert ctl.n_shadow >= 2 and not ctl.sleep


def test_adaptive_decisions_useless_vs_perfect_head(models):
    for noise, expect_on in ((8.0, False), (0.0, True)):
        with Runtime(models(head_noise=noise)["full"], spec_type="mtp") as rt:
            ctl = AdaptiveController(8, costs=FLAT, measure=False)
            for p in ("hello world", "the cat", "one two three"):
                tokens(rt, rt.tokenize(p), greedy(n_predict=100, spec_type="mtp"), "adaptive", ctl)
            st = ctl.steps_at
            if expect_on:  # (each step emits up to 9 tokens here: few steps)
                assert ctl.best >= 2 and sum(st[1:]) > 0.6 * sum(st)
                assert rt.stats.acceptance > 0.9 and rt.stats.tokens_per_pass > 3
            else:
                assert ctl.best == 0 and st[0] > 0.9 * sum(st)


def test_adaptive_with_measured_costs_runs_and_keeps_one_controller(models):
    with Runtime(models(head_noise=8.0)["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize("hello")
        cfg = greedy(spec_type="mtp")
        auto = AutoDraft(rt)
        ref = tokens(rt, prompt, greedy())
        assert tokens(rt, prompt, cfg, "adaptive", auto=auto) == ref
        first = tokens.last.policy
        assert tokens(rt, prompt, cfg, "adaptive", auto=auto) == ref and tokens.last.policy is first  # learning carries over
        assert first.n_max == rt.stats.n_max == 8


def test_auto_without_and_with_a_profile(models, config_dir):
    s = models(head_noise=1.0)
    with Runtime(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize("hello")
        cfg = greedy(spec_type="mtp")
        auto = AutoDraft(rt)
        ref = tokens(rt, prompt, greedy())
        assert tokens(rt, prompt, cfg, "auto", auto=auto) == ref
        assert tokens.last.note == NO_PROFILE_NOTE and tokens.last.policy is not None  # no profile: adaptive
        key = auto.profile_key(cfg)
        profiles.save(_profile(key, "mtp", 2, 0.0))
        assert tokens(rt, prompt, cfg, "auto", auto=auto) == ref
        assert rt.stats.spec_type == "mtp" and rt.stats.n_max == 2 and tokens.last.policy is None
        assert "tuned profile: mtp N=2" in tokens.last.note
        profiles.save(_profile(key, "none"))
        assert tokens(rt, prompt, cfg, "auto", auto=auto) == ref
        assert rt.stats.spec_type == "none" and rt.stats.n_drafted == 0
        # another thread count is another machine setting: no profile
        tokens(rt, prompt, greedy(spec_type="mtp", n_threads=2, n_predict=4), "auto", auto=auto)
        assert tokens.last.note == NO_PROFILE_NOTE


# ---------------------------------------------------------------------------------------------
# tune and bench
# ---------------------------------------------------------------------------------------------


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
    with Runtime(path, spec_type="mtp") as rt:
        prof = profiles.find(AutoDraft(rt).profile_key(greedy(spec_type="mtp")))
        assert prof is not None and prof.setting == ("off" if res.best.spec_type == "none" else res.best.name)
        assert prof.cost_model["break_even"] and prof.settings


def run_cli(*args: str):
    return CliRunner().invoke(main, list(args))


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
    for name in ("none", "ngram N=3", "mtp N=1", "mtp N=2", "mtp N=3", "mtp N=4", "auto", "adaptive"):
        assert f"\n {name} " in "\n" + r.stdout or r.stdout.startswith(f" {name}"), name
    assert "no profile: adaptive" in r.stdout
    r = run_cli("bench", "-m", path, "-n", "8", "--repeats", "1", "-t", "1", "--json")
    rows = json.loads(r.stdout)["rows"]
    assert [x["name"] for x in rows] == ["none", "ngram N=3", "mtp N=1", "mtp N=2", "mtp N=3", "mtp N=4",
                                         "auto", "adaptive"]
    assert rows[0]["ratio_vs_none"] == 1.0 and all(x["tokens_per_second"] > 0 for x in rows)


def test_cli_bench_without_a_head_skips_mtp_rows(models):
    r = run_cli("bench", "-m", str(models(head_noise=1.0)["trunk"]), "-n", "4", "--repeats", "1", "-t", "1", "--json")
    assert r.exit_code == 0, r.output
    rows = {x["name"]: x for x in json.loads(r.stdout)["rows"]}
    assert rows["none"]["tokens_per_second"] > 0 and rows["adaptive"].get("skipped")


def test_cli_generate_auto_and_adaptive(models):
    path = str(models(head_noise=1.0)["full"])
    r = run_cli("generate", "-m", path, "-p", "hello", "-n", "12", "--temp", "0", "-t", "1",
                "--spec-draft-n-max", "auto")
    assert r.exit_code == 0, r.output
    assert "no tuned profile" in r.stderr and "adaptive: now N=" in r.stderr
    r = run_cli("generate", "-m", path, "-p", "hello", "-n", "12", "--temp", "0", "-t", "1",
                "--spec-draft-n-max", "adaptive", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["stats"]["spec_type"] == "mtp" and "steps_at" in doc["adaptive"]


@pytest.mark.parametrize("args,msg", [
    (["tune", "-m", "{trunk}", "--budget", "2"], "has no MTP head"),
    (["tune", "-m", "{full}", "--budget", "0"], "--budget must be positive"),
    (["tune", "-m", "{full}", "--prompts", "{empty}"], "no prompts"),
    (["bench", "-m", "{missing}"], "no such file"),
    (["generate", "-m", "{full}", "-p", "hi", "--spec-draft-n-max", "often"], "a number, auto or adaptive"),
    (["generate", "-m", "{full}", "-p", "hi", "--spec-draft-n-max", "auto"], "profile store is corrupt"),
])
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
