"""`mtp-cli generate`: the CLI over the runtime (parity itself is tested in test_runtime.py)."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from mtp_cli.cli import main
from tests.factory import tiny_model_set


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_set(tmp_path_factory.mktemp("gen"), "glm4moe", "structured", "q8_0", head_noise=1.5)


def run(*args: str):
    return CliRunner().invoke(main, ["generate", *args])


def gen_json(*args: str) -> dict:
    r = run(*args, "--json", "-t", "2", "--temp", "0")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_mtp_greedy_equals_plain_and_reports_stats(tiny):
    plain = gen_json("-m", str(tiny["full"]), "-p", "hello world", "-n", "40")
    mtp = gen_json(
        "-m", str(tiny["full"]), "-p", "hello world", "-n", "40", "--spec-type", "mtp", "--spec-draft-n-max", "3"
    )
    assert mtp["text"] == plain["text"] and plain["stats"]["n_tokens"] == 40
    s = mtp["stats"]
    assert s["spec_type"] == "mtp" and s["n_drafted"] > 0 and 0 < s["acceptance"] < 1
    assert s["n_verify"] < plain["stats"]["n_verify"]  # fewer target passes for the same tokens
    assert len(s["acceptance_by_pos"]) == 3 and s["stop_reason"] == "n_predict"


def test_sidecar_with_md_and_draft_spelling(tiny):
    # (a fixed N: under auto, adaptive's probes follow measured time, and so may the count of accepted drafts)
    n = ("-p", "the", "-n", "24", "--spec-draft-n-max", "3")
    a = gen_json("-m", str(tiny["full"]), *n, "--spec-type", "mtp")
    b = gen_json("-m", str(tiny["trunk"]), "-md", str(tiny["sidecar"]), *n, "--spec-type", "draft-mtp")
    assert a["text"] == b["text"] and a["stats"]["n_accepted"] == b["stats"]["n_accepted"]


def test_stream_and_summary(tiny, tmp_path, monkeypatch):
    from mtp_cli.cli import generate as gen_cli

    monkeypatch.setattr(gen_cli, "_terminal", lambda: True)  # as on a terminal
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello")
    r = run(
        "-m",
        str(tiny["full"]),
        "-f",
        str(prompt),
        "-n",
        "12",
        "--temp",
        "0",
        "--spec-type",
        "mtp",
        "--spec-draft-n-max",
        "3",
        "--show-draft",
        "-t",
        "2",
    )
    assert r.exit_code == 0, r.output
    assert "12 generated" in r.stderr and "verify passes" in r.stderr and "acceptance" in r.stderr
    assert "\x1b[32m" in r.stdout and "green: tokens from accepted drafts" in r.stderr  # coloured, with a legend
    monkeypatch.setenv("NO_COLOR", "1")
    r = run("-m", str(tiny["full"]), "-f", str(prompt), "-n", "12", "--temp", "0", "--spec-type", "mtp", "--show-draft")
    assert r.exit_code == 0 and "\x1b[" not in r.stdout


def test_context_full_is_said(tiny):
    r = run("-m", str(tiny["full"]), "-p", "hello", "-c", "16", "--temp", "0", "--spec-type", "mtp", "-t", "2")
    assert r.exit_code == 0, r.output
    assert "context full" in r.stderr


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--spec-type", "mtp"], "has no MTP head"),
        (["--spec-type", "mtp", "--spec-draft-n-max", "0"], "--spec-draft-n-max must be in"),
        (["--spec-type", "draft"], "needs a draft model"),
    ],
)
def test_bad_requests_one_line_exit_2(tiny, args, msg):
    r = run("-m", str(tiny["trunk"]), "-p", "hi", *args)
    assert r.exit_code == 2, r.output
    assert msg in r.output and len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_missing_model_and_prompt(tiny, tmp_path):
    r = run("-m", str(tmp_path / "nope.gguf"), "-p", "hi")
    assert r.exit_code == 2 and "no such file" in r.output
    (tmp_path / "x.gguf").write_text("not a model")
    r = run("-m", str(tmp_path / "x.gguf"), "-p", "hi")
    assert r.exit_code == 2 and "not a GGUF" in r.output
    r = run("-m", str(tiny["full"]))
    assert r.exit_code == 2 and "-p TEXT" in r.output


def test_chat_template_is_applied(tiny):
    out = gen_json("-m", str(tiny["full"]), "-p", "hello", "-n", "4", "--chat")
    assert out["prompt"] != "hello" and "hello" in out["prompt"]
    assert out["stats"]["n_prompt"] > gen_json("-m", str(tiny["full"]), "-p", "hello", "-n", "4")["stats"]["n_prompt"]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_adopted_trunk_with_head_slot_generates_like_plain(tmp_path, arch):
    """adopt --with-head-slot, then generate --spec-type mtp: the same tokens as plain decoding."""
    from tests.factory import TinySpec, write_tiny_model

    src = write_tiny_model(tmp_path / "src.gguf", TinySpec(arch=arch, kind="trunk", dtype="q8_0", seed=3))
    r = CliRunner().invoke(main, ["adopt", str(src), "-o", str(tmp_path / "a.gguf"), "--with-head-slot"])
    assert r.exit_code == 0, r.output
    plain = gen_json("-m", str(tmp_path / "a.gguf"), "-p", "hello world", "-n", "32")
    for n in (1, 3):
        mtp = gen_json(
            "-m",
            str(tmp_path / "a.gguf"),
            "-p",
            "hello world",
            "-n",
            "32",
            "--spec-type",
            "mtp",
            "--spec-draft-n-max",
            str(n),
        )
        assert mtp["text"] == plain["text"] and mtp["stats"]["n_drafted"] > 0


def test_each_file_is_prescanned_once(tiny, monkeypatch):
    """One generate (chat template, auto N: a profile key) reads each file's header once, and hands
    llama.cpp, the template and the profile key that one opened file."""
    import gguf_tools.gguf_file as gguf_file

    seen: list[str] = []
    real = gguf_file.prescan
    monkeypatch.setattr(gguf_file, "prescan", lambda p: seen.append(str(p)) or real(p))
    gen_json(
        "-m",
        str(tiny["trunk"]),
        "-md",
        str(tiny["sidecar"]),
        "-p",
        "hello",
        "-n",
        "8",
        "--chat",
        "--spec-type",
        "mtp",
        "--spec-draft-n-max",
        "auto",
    )
    assert sorted(seen) == sorted([str(tiny["trunk"]), str(tiny["sidecar"])]), seen


def test_library_settings_are_spelled_as_this_commands_flags(tiny):
    """The library names settings by parameter (`n_ctx`, `draft_n_min`); the CLI prints its own flags."""
    r = run("-m", str(tiny["full"]), "-p", "hello world the a", "-c", "4", "--temp", "0")
    assert r.exit_code == 2 and "the context holds" in r.output and "(-c)" in r.output, r.output
    r = run(
        "-m", str(tiny["full"]), "-p", "hi", "--spec-type", "mtp", "--spec-draft-n-max", "2", "--spec-draft-n-min", "3"
    )
    assert r.exit_code == 2 and "--spec-draft-n-min must be in 0..2 (--spec-draft-n-max)" in r.output, r.output
    assert "draft_n_min" not in r.output


def test_spec_types_and_their_help_come_from_the_drafter_registry(tiny):
    from mtp_cli import drafters

    r = CliRunner().invoke(main, ["generate", "--help"], terminal_width=400)
    assert r.exit_code == 0
    for cls in drafters.REGISTRY.values():
        assert cls.name in r.output and cls.summary.split("(")[0].strip() in r.output, cls.name
    for alias in drafters.names():  # every spelling parses (draft without -md is then refused by the library)
        r = run("-m", str(tiny["full"]), "-p", "hi", "-n", "2", "--spec-type", alias, "--temp", "0")
        assert r.exit_code == 0 or (alias.startswith("draft") and "needs a draft model" in r.output), (alias, r.output)
    bad = run("-m", str(tiny["full"]), "-p", "hi", "--spec-type", "medusa")
    assert bad.exit_code == 2 and "medusa" in bad.output


def test_a_setting_this_command_lacks_is_spelled_as_the_command_that_has_it(tmp_path):
    """pack has no -md; its refusal of an assistant drafter points at generate's -md."""
    from gguf_tools.gguf_file import open_gguf
    from gguf_tools.gguf_write import KV, WritePlan, write_gguf
    from gguf_tools.surgery import plan_extract
    from tests.factory import TinySpec, write_tiny_model

    trunk = write_tiny_model(tmp_path / "t.gguf", TinySpec(arch="glm4moe", kind="trunk"))
    plan = plan_extract(open_gguf(write_tiny_model(tmp_path / "f.gguf", TinySpec(arch="glm4moe", kind="full"))))
    arch = "gemma4-assistant"  # (only its architecture matters here)
    kvs = [KV(k.key, arch, k.type) if k.key == "general.architecture" else k for k in plan.kvs]
    drafter = tmp_path / "assistant.gguf"
    write_gguf(WritePlan(arch, plan.alignment, kvs, plan.tensors), drafter)
    r = CliRunner().invoke(main, ["pack", str(trunk), "--heads", str(drafter), "-o", str(tmp_path / "o.gguf")])
    assert r.exit_code == 2 and "as the draft model (-md) instead of packing it" in r.output, r.output


def test_prompt_bytes_stdin_and_bom(tiny, tmp_path):
    """A non-UTF-8 byte in -p is one line (it was a traceback), as in -f; -f - reads standard input; a BOM is dropped."""
    import os
    import subprocess
    import sys

    bad = os.fsdecode(b"caf\xe9")  # what Python makes of a Latin-1 argv byte
    r = run("-m", str(tiny["full"]), "-p", bad, "-n", "2")
    assert r.exit_code == 2 and "-p: the prompt is not UTF-8 (byte 0xe9 at offset 3)" in r.output, r.output
    f = tmp_path / "p.txt"
    f.write_bytes(b"caf\xe9")
    r = run("-m", str(tiny["full"]), "-f", str(f), "-n", "2")
    assert r.exit_code == 2 and "not UTF-8 (byte 0xe9 at offset 3)" in r.output
    f.write_bytes("\ufeffhello world".encode())
    from_file = gen_json("-m", str(tiny["full"]), "-f", str(f), "-n", "8")
    assert from_file["prompt"] == "hello world"
    from_stdin = CliRunner().invoke(
        main,
        ["generate", "-m", str(tiny["full"]), "-f", "-", "-n", "8", "--json", "-t", "2", "--temp", "0"],
        input="\ufeffhello world".encode(),
    )
    assert from_stdin.exit_code == 0 and json.loads(from_stdin.stdout)["text"] == from_file["text"]
    # and a real argv byte, through the console script
    r2 = subprocess.run(
        [sys.executable, "-m", "mtp_cli", "generate", "-m", str(tiny["full"]), "-p", b"caf\xe9", "-n", "2"],
        capture_output=True,
    )
    assert r2.returncode == 2 and b"Traceback" not in r2.stderr and b"not UTF-8" in r2.stderr


@pytest.mark.parametrize(
    "cmd, flags",
    [
        ("tune", ["--presence-penalty", "0.5"]),
        ("bench", ["--grammar", "root ::= x"]),
        ("bench", ["-jf", "schema.json"]),
        ("tune", ["-ctk", "q8_0"]),
        ("bench", ["--ignore-eos"]),
        ("bench", ["-ub", "64"]),
    ],
)
def test_llama_cpp_flags_a_command_lacks_are_refused_by_name(tiny, cmd, flags):
    """`-ctk q8_0` was read as `-c tk` and `-ub 64` failed obscurely; now each is refused by name."""
    r = CliRunner().invoke(main, [cmd, "-m", str(tiny["full"]), *flags])
    assert r.exit_code == 2 and f"{flags[0]}: llama.cpp's option is not supported by `mtp-cli {cmd}`" in r.output, (
        r.output
    )


def test_kv_cache_loading_and_sampling_flags_as_llama_cpp_spells_them(tiny, monkeypatch):
    """-ctk/-ctv, -ub, -lm (and the old --no-mmap/--mlock), --repeat-penalty/--repeat-last-n and
    --ignore-eos were missing; each reaches llama.cpp (or the sampler), by flag or LLAMA_ARG_*."""
    from mtp_cli import llama_ext as lx

    made, loads = [], []
    real_ctx, real_load = lx.create_context, lx.load_model
    monkeypatch.setattr(lx, "create_context", lambda *a, **k: made.append(k) or real_ctx(*a, **k))
    monkeypatch.setattr(lx, "load_model", lambda *a, **k: loads.append(k) or real_load(*a, **k))
    base = ["-m", str(tiny["full"]), "-p", "hello world", "-n", "12", "--temp", "0", "--spec-type", "mtp"]
    plain = gen_json(*base)
    doc = gen_json(*base, "-ctk", "q8_0", "-fa", "off", "-ub", "4", "-lm", "none")
    assert {d["kv"] for d in made[-2:]} == {lx.KvOptions("q8_0", "f16", 4, False)}  # the target's and the head's
    assert loads[-1]["load_mode"] == "none" and doc["stats"]["n_tokens"] == 12
    for flags, mode in ((["--no-mmap"], "none"), (["--mlock"], "mmap+mlock"), (["--no-mmap", "--mlock"], "mlock")):
        gen_json(*base, *flags)
        assert loads[-1]["load_mode"] == mode, flags
    monkeypatch.setenv("LLAMA_ARG_CACHE_TYPE_K", "q4_0")
    monkeypatch.setenv("LLAMA_ARG_UBATCH", "8")
    monkeypatch.setenv("LLAMA_ARG_LOAD_MODE", "mmap")
    gen_json(*base, "-fa", "off")
    assert made[-1]["kv"] == lx.KvOptions("q4_0", "f16", 8, False) and loads[-1]["load_mode"] == "mmap"
    # the tiny model's heads are 16 wide: llama.cpp would refuse the context ("failed to create")
    r = run(*base)
    assert r.exit_code == 2 and "-ctk q4_0 stores blocks of 32, and this model's key heads are 16 wide" in r.output
    monkeypatch.delenv("LLAMA_ARG_CACHE_TYPE_K")
    from mtp_cli import sampling

    edits = []
    real_edits = sampling.RowEdits.__init__
    monkeypatch.setattr(
        sampling.RowEdits, "__init__", lambda self, cfg, eog: edits.append(cfg) or real_edits(self, cfg, eog)
    )
    gen_json(*base, "--repeat-penalty", "3", "--repeat-last-n", "16", "--ignore-eos")
    monkeypatch.setenv("LLAMA_ARG_REPEAT_PENALTY", "2.5")
    gen_json(*base)
    got = [(c.repeat_penalty, c.repeat_last_n, c.ignore_eos) for c in edits]
    assert got == [(3.0, 16, True), (2.5, 64, False)], got  # (exactness: tests/test_row_edits.py)
    r = run(*base, "-ctv", "q4_0", "-fa", "off")
    assert r.exit_code == 2 and "a quantized -ctv (q4_0) needs -fa (on or auto)" in r.output, r.output
    assert plain["stats"]["n_tokens"] == 12


def test_llama_arg_environment_variables_under_the_flags(tiny, monkeypatch):
    monkeypatch.setenv("LLAMA_ARG_N_PREDICT", "5")
    monkeypatch.setenv("LLAMA_ARG_TEMPERATURE", "0")
    assert gen_json("-m", str(tiny["full"]), "-p", "hello")["stats"]["n_tokens"] == 5
    assert gen_json("-m", str(tiny["full"]), "-p", "hello", "-n", "3")["stats"]["n_tokens"] == 3  # flag first
    monkeypatch.setenv("LLAMA_ARG_MODEL", str(tiny["full"]))
    r = run("-p", "hello", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["stats"]["n_tokens"] == 5, r.output


def test_system_prompt_seed_show_draft_verbose_and_version(tiny):
    doc = gen_json("-m", str(tiny["full"]), "-p", "hello", "-n", "2", "--chat", "-sys", "be brief")
    assert "<|system|>\nbe brief" in doc["prompt"] and doc["seed"] is None  # greedy: no seed to report
    r = run("-m", str(tiny["full"]), "-p", "hello", "-n", "2", "-sys", "be brief")
    assert r.exit_code == 2 and "add --chat" in r.output
    sampled = CliRunner().invoke(main, ["generate", "-m", str(tiny["full"]), "-p", "hello", "-n", "12", "--json"])
    seed = json.loads(sampled.stdout)["seed"]
    assert isinstance(seed, int) and seed >= 0  # a random run says its seed ...
    again = CliRunner().invoke(
        main, ["generate", "-m", str(tiny["full"]), "-p", "hello", "-n", "12", "--json", "-s", str(seed)]
    )
    assert json.loads(again.stdout)["text"] == json.loads(sampled.stdout)["text"]  # ... and it repeats the run
    r = run(
        "-m", str(tiny["full"]), "-p", "hello", "-n", "8", "--temp", "0", "--spec-type", "mtp", "--show-draft", "-v"
    )
    assert r.exit_code == 0 and "\x1b[" not in r.stdout and "no colours (not a terminal" in r.stderr, r.output
    assert "INFO" in r.stderr and "loaded" in r.stderr  # -v after the subcommand
    v = CliRunner().invoke(main, ["--version"])
    assert (
        v.exit_code == 0
        and "mtp-cli " in v.output
        and "llama-cpp-python 0.3.36" in v.output
        and "GPU offload" in v.output
        and "devices: CPU (" in v.output
    )


def test_batch_size_and_flash_attention_as_llama_cpp_spells_them(tiny, monkeypatch):
    """`-fa on` was read as `-f a` (a prompt file named "a"); `-b` did not exist."""
    from mtp_cli import llama_ext as lx

    made = []
    real = lx.create_context
    monkeypatch.setattr(lx, "create_context", lambda *a, **k: made.append(k) or real(*a, **k))
    plain = gen_json("-m", str(tiny["full"]), "-p", "hello world", "-n", "12")
    for flags in (["-fa", "off"], ["-fa", "on"], ["-b", "2"]):
        made.clear()
        doc = gen_json("-m", str(tiny["full"]), "-p", "hello world", "-n", "12", *flags)
        target = made[0]
        assert (target["kv"].flash_attn, target["n_batch"]) == {
            "-fa off": (False, 512),
            "-fa on": (True, 512),
            "-b 2": (False, 34),  # (n_batch: at least N+2; the default lookup drafts up to 32; auto: off on a CPU)
        }[" ".join(flags)]
        assert doc["text"] == plain["text"]
    monkeypatch.setenv("LLAMA_ARG_FLASH_ATTN", "on")  # (not off: that is what auto gives on a CPU)
    made.clear()
    gen_json("-m", str(tiny["full"]), "-p", "hello", "-n", "2")
    assert made[0]["kv"].flash_attn is True


def test_tune_and_bench_without_a_model_run_the_demo_as_generate_does(tiny, monkeypatch):
    """`mtp-cli tune` without -m was "Missing option -m" where `generate` runs the demo model."""
    from mtp_cli.cli import speed

    monkeypatch.setattr(speed, "demo_file", lambda: tiny["full"])
    r = CliRunner().invoke(main, ["bench", "-n", "4", "--repeats", "1", "-t", "1", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["model"] == str(tiny["full"]), r.output
    r = CliRunner().invoke(main, ["tune", "--budget", "3", "--n-max", "2", "--no-save", "-t", "1", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["model"] == str(tiny["full"]), r.output


def test_demo_defaults_fill_only_what_was_not_given():
    """The demo's defaults (greedy, a repeat penalty of 1.1; drafting as any model's); a flag or a
    LLAMA_ARG_* variable the user gave wins."""
    import click

    from mtp_cli.cli import gen_options as go

    seen: dict = {}

    @click.command()
    @click.option("--spec-type", "spec_type", default=None)
    @click.option("--spec-draft-n-max", "draft_n_max", default=3)
    @click.option("--temp", default=0.8)
    @click.option("--repeat-penalty", "repeat_penalty", default=1.0, envvar="LLAMA_ARG_REPEAT_PENALTY")
    def cmd(**opts):
        given = dict(opts)
        seen.update(go.demo_settings(opts))
        assert opts == given  # (a new dict: what click parsed stays as it was)

    assert CliRunner().invoke(cmd, []).exit_code == 0
    assert seen == {"spec_type": None, "draft_n_max": 3, "temp": 0.0, "repeat_penalty": go.DEMO_REPEAT_PENALTY}
    assert CliRunner().invoke(cmd, ["--repeat-penalty", "1", "--temp", "0.5"]).exit_code == 0
    assert (seen["repeat_penalty"], seen["temp"]) == (1.0, 0.5)
    assert CliRunner().invoke(cmd, [], env={"LLAMA_ARG_REPEAT_PENALTY": "1.3"}).exit_code == 0
    assert seen["repeat_penalty"] == 1.3


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_flag_defaults_are_the_configs(command):
    """Every option that sets a GenConfig field defaults to that field's default (one place for each
    fact); the exceptions say why."""
    from dataclasses import fields

    from mtp_cli.config import GenConfig

    # flags whose "not given" differs from the field's default: -fa's "auto" is None; --spec-type
    # unset is the model's default drafting (speed.auto.default_spec), whose length is auto
    spelled_apart = {"flash_attn": "auto", "spec_type": None, "draft_n_max": "auto"}
    defaults = GenConfig()
    cmd = main.commands[command]
    names = {f.name for f in fields(GenConfig)}
    checked = 0
    for p in cmd.params:
        if p.name in names:
            want = spelled_apart.get(p.name, getattr(defaults, p.name))
            got = None if type(p.default).__name__ == "Sentinel" else p.default  # (click's "no default")
            assert got == want, (command, p.name, got, want)
            checked += 1
    assert checked >= 15, checked


def test_grammar_schema_bias_and_penalty_flags_as_llama_cpp_spells_them(tiny, tmp_path):
    """--grammar / --grammar-file / -j / -jf constrain the output (drafting changes nothing), -l biases
    a token, --presence-penalty / --frequency-penalty reach the sampler; bad values are one line."""
    base = ["-m", str(tiny["full"]), "-p", "hello world", "-n", "40", "--temp", "0", "-t", "1"]
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    (tmp_path / "g.gbnf").write_text('root ::= ("hello" | " world")+')
    outs = {}
    for flags in (
        ["-j", json.dumps(schema)],
        ["-jf", str(tmp_path / "s.json")],
        ["--grammar-file", str(tmp_path / "g.gbnf")],
    ):
        for spec in (["--spec-type", "none"], ["--spec-type", "mtp", "--spec-draft-n-max", "3"]):
            outs.setdefault(flags[0], set()).add(gen_json(*base, *flags, *spec)["text"])
    assert all(len(v) == 1 for v in outs.values()), outs
    assert json.loads(outs["-j"].pop()) in ({"ok": True}, {"ok": False}) and outs["-jf"]
    assert set(re.findall(r"hello| world", outs["--grammar-file"].pop())) <= {"hello", " world"}
    biased = gen_json(*base, "-l", "5+100", "--presence-penalty", "0.5", "--frequency-penalty", "0.5")
    assert biased["text"] and biased["stats"]["n_tokens"] == 40
    for flags, says in (
        (["-l", "5*2"], "TOKEN_ID(+/-)BIAS"),
        (["-j", "{not json"], "-j"),
        (["--grammar", "root ::= ("], "does not parse"),
        (["--grammar", "root ::= x", "-j", "{}"], "give one of --grammar"),
        (["-jf", str(tmp_path / "missing.json")], "cannot read it"),
    ):
        r = run(*base, *flags)
        assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, (flags, r.output)
