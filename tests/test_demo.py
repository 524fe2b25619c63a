"""The embedded demo (issue 6): `mtp-cli generate` without -m builds SmolLM2-135M-Instruct adopted +
the shipped trained head into the user cache once, then runs it with MTP; the shipped head is small,
packs into the adopted trunk and drafts well enough to be accepted."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from gguf_tools.gguf_file import open_gguf
from mtp_cli import demo
from mtp_cli import llama_ext as lx
from mtp_cli.cli import main

pytestmark = pytest.mark.slow  # builds the demo model from the real SmolLM2 GGUF


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("MTP_CLI_CACHE", str(cache))
    seen: list[tuple[int, int]] = []
    path = demo.demo_model(lambda done, total: seen.append((done, total)))
    yield {"path": path, "cache": cache, "progress": seen}
    mp.undo()


def test_shipped_head_is_small_and_head_only():
    gf = open_gguf(demo.DEMO_HEAD)
    assert demo.DEMO_HEAD.stat().st_size < 12e6  # a few MB: the embedding and output come from the trunk
    assert gf.arch == "glm4moe" and gf.layout().nextn_layers == 1
    assert all(name.startswith(f"blk.{gf.layout().n_trunk}.") for name in gf.tensors)
    assert (demo.DATA / "README.md").is_file()  # the note: command, data, seed, measured figures


def test_demo_model_is_built_once_into_the_cache(built, monkeypatch):
    monkeypatch.setenv("MTP_CLI_CACHE", str(built["cache"]))
    path = built["path"]
    assert path.parent == built["cache"] and path.is_file()
    assert built["progress"] and built["progress"][-1][0] == built["progress"][-1][1]
    gf = open_gguf(path)
    assert gf.arch == "glm4moe" and gf.layout().nextn_layers == 1
    assert f"blk.{gf.layout().n_trunk}.nextn.shared_head_head.weight" in gf.tensors  # its own Q4_0 output
    assert [p.name for p in built["cache"].iterdir()] == [path.name]  # no temporaries left behind
    mtime = path.stat().st_mtime_ns
    assert demo.demo_model() == path and path.stat().st_mtime_ns == mtime  # cached: not rebuilt


def test_cli_generate_without_model_runs_the_demo_with_mtp(built, monkeypatch):
    monkeypatch.setenv("MTP_CLI_CACHE", str(built["cache"]))
    r = CliRunner().invoke(main, ["generate", "-n", "48", "-t", "1", "--spec-draft-n-max", "2", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output[r.output.index("{") :])
    st = doc["stats"]
    assert st["spec_type"] == "lookup,mtp" and st["n_tokens"] == 48  # (the default: lookup, then the head)
    assert st["acceptance"] > 0.3, st  # the trained head drafts tokens the trunk keeps
    lx.quiet_logs()
    none = CliRunner().invoke(main, ["generate", "-n", "48", "-t", "1", "--spec-type", "none", "--json"])
    assert none.exit_code == 0, none.output
    plain = json.loads(none.output[none.output.index("{") :])
    assert plain["stats"]["spec_type"] == "none"
    # greedy MTP output is plain decoding's, up to near-ties batched kernels can flip (ARCHITECTURE §3)
    a, b = doc["text"], plain["text"]
    common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert common >= 40, (a, b)


def test_on_the_real_model_drafted_greedy_text_is_plain_decodings_where_attention_is_batch_invariant(built):
    """The promise on a real quantized model, where near-ties abound: with flash attention on and
    under 512 KV cells, llama.cpp gives a row of a verify batch the logits it gets alone, so every
    drafter's greedy text (the head, the lookup, their chain; with the demo's own repeat penalty too)
    is plain decoding's token for token. (With it off, mtp-cli's default on a CPU, verified rows
    differ by up to ~1 logit and near-ties flip: ARCHITECTURE §3; that is the kernel's, not the
    loop's.)"""
    from mtp_cli.config import GenConfig
    from mtp_cli.prompts import read_prompts
    from mtp_cli.runtime import Runtime
    from mtp_cli.speed.runs import prompt_tokens

    # (the file, not mtp_cli.train: importing that marks the process as running torch, AMX off)
    texts = read_prompts(demo.DATA.parent / "train" / "prompts" / "eval_prompts.txt")[3:60:15]
    with Runtime.load(built["path"], spec_type="mtp") as rt:
        toks = prompt_tokens(rt, texts, True)
        assert max(map(len, toks)) + 64 < 512
        for penalty in (1.0, 1.1):
            base = GenConfig(n_predict=64, n_threads=2, temp=0.0, flash_attn=True, repeat_penalty=penalty)
            for pt in toks:
                plain = [e.token for e in rt.generate(pt, replace(base, spec_type="none"))]
                for spec, n in (("mtp", 3), ("lookup", 32), ("lookup,mtp", 2)):
                    got = [e.token for e in rt.generate(pt, replace(base, spec_type=spec, draft_n_max=n))]
                    assert got == plain, (spec, n, penalty)
                    assert spec == "lookup" or rt.stats.n_accepted > 0  # (it drafted, and was kept)


def test_missing_source_package_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("MTP_CLI_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == demo.SOURCE_PACKAGE else real(name, *a)
    )
    r = CliRunner().invoke(main, ["generate", "-n", "4"])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "mtp-cli[demo]" in lines[0], r.output
    assert list(tmp_path.iterdir()) == []


def test_a_built_demo_runs_without_its_source_package(built, monkeypatch):
    monkeypatch.setenv("MTP_CLI_CACHE", str(built["cache"]))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == demo.SOURCE_PACKAGE else real(name, *a)
    )
    assert demo.demo_model() == built["path"]  # it refused before: the cache key needed the source
    r = CliRunner().invoke(main, ["generate", "-n", "4", "-t", "1", "--json"])
    assert r.exit_code == 0, r.output
