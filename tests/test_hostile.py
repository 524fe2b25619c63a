"""Hostile headers (tests/hostile.py): each breaks a rule of gguf_tools.limits; llama.cpp, without
our check, refuses or crashes on each (so the check is needed); every command refuses each with one
line and exit 2, writing nothing and changing nothing."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFValueType as T

from gguf_tools.gguf_file import open_gguf
from gguf_tools.limits import RULES
from gguf_tools.loadable import problems
from gguf_tools.prescan import ArrayValue, Prescan
from mtp_cli.cli import main
from tests.factory import TinySpec, write_tiny_model
from tests.hostile import CASES, Case, build
from tests.test_gguf_file import CASES as STRUCTURAL

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bases(tiny_models, tmp_path_factory) -> dict[str, Path]:
    llama = write_tiny_model(tmp_path_factory.mktemp("hl") / "llama.gguf", TinySpec(arch="llama", kind="trunk"))
    return {"glm4moe": tiny_models("glm4moe")["full"], "qwen35": tiny_models("qwen35")["full"], "llama": llama}


@pytest.fixture(scope="module")
def corpus(bases, tmp_path_factory) -> dict[str, Path]:
    """Every hostile file: the rule cases and the structural ones (tests/test_gguf_file.py)."""
    root = tmp_path_factory.mktemp("corpus")
    out = {c.id: build(c, bases, root / f"case{i}.gguf") for i, c in enumerate(CASES)}
    for i, (name, (spec, _)) in enumerate(STRUCTURAL.items()):
        out[name] = root / f"structural{i}.gguf"
        out[name].write_bytes(spec if isinstance(spec, bytes) else spec.build())
    return out


def test_the_corpus_is_big_and_every_base_is_clean(corpus, bases):
    assert len(corpus) >= 60
    for p in bases.values():
        assert problems(open_gguf(p).scan) == [], p


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_case_breaks_its_rule_in_one_line_naming_the_key(corpus, case: Case):
    found = problems(open_gguf(corpus[case.id]).scan)
    assert case.rule in {p.rule.id for p in found}, [p.line() for p in found]
    p = next(p for p in found if p.rule.id == case.rule)
    assert "\n" not in p.line() and p.line().startswith("not loadable by llama.cpp: ") and p.rule.source in p.line()
    assert p.key.split(".")[-1].split("_")[0] in p.line() or p.key[:20] in p.line()


# ggml's abort forks a gdb to print a backtrace; forked from a process with OpenMP threads running,
# the child can deadlock and the parent wait for it (an "odd rope dims" abort once hung 120 s in CI)
PROBE_ENV = {**os.environ, "GGML_NO_BACKTRACE": "1"}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_without_the_check_llama_cpp_refuses_or_crashes(corpus, case: Case):
    cmd = [sys.executable, "-m", "tests.llama_probe", str(corpus[case.id]), *(["--mtp"] if case.mtp else [])]
    try:
        r = subprocess.run(
            cmd, capture_output=True, text=True, timeout=8 if case.hangs else 120, cwd=ROOT, env=PROBE_ENV
        )
    except subprocess.TimeoutExpired:
        assert case.hangs, "llama.cpp hung"
        return
    assert not case.hangs, "expected a hang"
    # 3: refused (a NULL model or context); a negative code: killed by SIGABRT or SIGFPE
    assert r.returncode == 3 or r.returncode < 0, (r.returncode, r.stdout[-500:], r.stderr[-500:])


def test_the_probe_runs_the_clean_bases(bases):
    for name, p in bases.items():
        cmd = [sys.executable, "-m", "tests.llama_probe", str(p), *(["--mtp"] if name != "llama" else [])]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=PROBE_ENV)
        assert (r.returncode, r.stdout.strip()) == (0, "ran"), (name, r.stdout, r.stderr[-500:])


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


COMMANDS = ("inspect", "generate", "tune", "pack-trunk", "pack-heads", "adopt")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_every_hostile_file_in_one_line(corpus, tiny_models, tmp_path, command):
    g = tiny_models("glm4moe")
    for name, src in corpus.items():
        work = tmp_path / f"w{abs(hash(name))}"
        work.mkdir()
        path = work / "hostile.gguf"
        shutil.copyfile(src, path)
        before, out = _digest(path), work / "out.gguf"
        args = {
            "inspect": ["inspect", str(path)],
            "generate": ["generate", "-m", str(path), "-p", "hi", "-n", "4", "--spec-type", "mtp", "--temp", "0"],
            "tune": ["tune", "-m", str(path), "--budget", "1", "--no-save"],
            "pack-trunk": ["pack", str(path), "--heads", str(g["sidecar"]), "-o", str(out)],
            "pack-heads": ["pack", str(g["trunk"]), "--heads", str(path), "-o", str(out)],
            "adopt": ["adopt", str(path), "-o", str(out)],
        }[command]
        res = CliRunner().invoke(main, args)
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(lines) == 1, (name, res.exit_code, res.output)
        assert "Traceback" not in res.output and str(path) in lines[0], (name, res.output)
        assert [p.name for p in work.iterdir()] == ["hostile.gguf"] and _digest(path) == before, name


# ---- rules no tiny model here carries: checked on crafted headers ------------------------------


def _scan(arch: str, kvs: dict, tensors: tuple = ()) -> Prescan:
    values, types = {"general.architecture": arch}, {"general.architecture": T.STRING}
    for k, v in kvs.items():
        key = k if k.startswith(("tokenizer.", "general.")) else f"{arch}.{k}"
        if isinstance(v, tuple) and isinstance(v[0], list):
            items, et = v
            data = [s.encode() for s in items] if et == T.STRING else np.asarray(items)
            values[key], types[key] = ArrayValue(len(items), et, data), T.ARRAY
        else:
            values[key] = v
            types[key] = T.STRING if isinstance(v, str) else T.FLOAT32 if isinstance(v, float) else T.UINT32
    return Prescan(3, "<", 32, 0, values, tensors, types, {})


_BASE = {"context_length": 4096, "embedding_length": 64, "block_count": 4, "attention.head_count": 4,
         "attention.layer_norm_rms_epsilon": 1e-6, "tokenizer.ggml.model": "llama",
         "tokenizer.ggml.tokens": ([f"t{i}" for i in range(8)], T.STRING)}  # fmt: skip
_DS = {"attention.kv_lora_rank": 32, "expert_feed_forward_length": 32, "expert_shared_count": 1,
       "attention.key_length_mla": 24, "attention.value_length_mla": 16, "rope.dimension_count": 8}  # fmt: skip
_SWA = {"attention.sliding_window": 128, "expert_feed_forward_length": 32,
        "attention.sliding_window_pattern": ([1, 0, 1, 0], T.INT32)}  # fmt: skip
_G4 = {"attention.sliding_window": 128, "attention.key_length_swa": 16, "attention.value_length_swa": 16,
       "embedding_length_per_layer_input": 0, "attention.sliding_window_pattern": ([1, 1, 1, 0], T.INT32)}  # fmt: skip
ARCH_BASE = {"deepseek2": _DS, "mimo2": _SWA, "step35": _SWA, "gemma4": _G4, "llama": {},
             "gemma4-assistant": {**_G4, "embedding_length_out": 128}}  # fmt: skip
CRAFTED = [
    ("deepseek2-rope", "deepseek2", {**_DS, "rope.dimension_count": 24}),
    ("deepseek2-temperature", "deepseek2", {**_DS, "attention.temperature_scale": 0.1}),
    ("swa-pattern", "mimo2", {**_SWA, "attention.sliding_window_pattern": ([0, 0, 0, 0], T.INT32)}),
    ("required-key", "mimo2", {k: v for k, v in _SWA.items() if k != "attention.sliding_window"}),
    ("step35-rope", "step35", {**_SWA, "rope.dimension_count": 6}),
    ("gemma4-swa", "gemma4", {**_G4, "attention.sliding_window_pattern": ([0, 0, 0, 0], T.INT32)}),
    ("gemma4-shared-kv", "gemma4", {**_G4, "attention.shared_kv_layers": 3}),
    ("rope-dims", "gemma4", {**_G4, "rope.dimension_count_swa": 0}),
    ("assistant-embd-out", "gemma4-assistant", {**_G4, "embedding_length_out": 64}),
    ("special-tokens", "llama", {"tokenizer.ggml.tokens": (["only"], T.STRING)}),
    ("architecture", "", {}),  # (a header without tensors: with them the prescan refuses it first)
    ("byte-token", "llama", {"tokenizer.ggml.model": "bert", "tokenizer.ggml.token_type": ([1] * 7 + [6], T.INT32)}),
]


@pytest.mark.parametrize("rule,arch,kvs", CRAFTED, ids=[f"{r}-{a}" for r, a, _ in CRAFTED])
def test_rules_of_archs_without_a_tiny_model(rule, arch, kvs):
    found = problems(_scan(arch, {**_BASE, **kvs}))
    assert rule in {p.rule.id for p in found}, [p.line() for p in found]
    if arch:
        clean = problems(_scan(arch, {**_BASE, **ARCH_BASE[arch]}))  # the same header without the damage
        assert clean == [], [p.line() for p in clean]


def test_every_rule_is_exercised():
    covered = {c.rule for c in CASES} | {r for r, _, _ in CRAFTED}
    unreachable = {"string-length", "array-length"}  # a string or array of 2**30: a test file of gigabytes
    assert {r.id for r in RULES} - covered == unreachable
    assert all(":" in r.source for r in RULES)  # each cites a source line


def test_inspect_json_reports_invalid_with_every_problem(corpus):
    r = CliRunner().invoke(main, ["inspect", "--json", str(corpus["block_count above the layer limit"])])
    assert r.exit_code == 2
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "invalid" and doc["problems"] and "glm4moe.block_count = 600" in doc["advice"]


def test_pack_refuses_to_publish_what_llama_cpp_would_not_load(tiny_models, tmp_path, monkeypatch):
    from gguf_tools import ops
    from gguf_tools.errors import BadFileError
    from gguf_tools.gguf_write import KV

    g = tiny_models("glm4moe")
    real = ops.plan_pack

    def two_heads(*a, **k):  # a planning bug that declares a second head block
        plan = real(*a, **k)
        kvs = [KV(kv.key, 2, kv.type) if kv.key.endswith("nextn_predict_layers") else kv for kv in plan.kvs]
        return type(plan)(plan.arch, plan.alignment, kvs, plan.tensors)

    monkeypatch.setattr(ops, "plan_pack", two_heads)
    out = tmp_path / "out.gguf"
    with pytest.raises(BadFileError, match="not written, it would be invalid .*nextn_predict_layers = 2"):
        ops.pack(g["trunk"], g["sidecar"], out)
    assert list(tmp_path.iterdir()) == []
