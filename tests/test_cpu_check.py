"""Issue 28: a llama.cpp that runs on the CPUs people have.

The build choice (scripts/llama_build.py) with the CPU's features and the compiler injected; the
self-check (mtp_cli.cpu_check) with children made to die by a signal; the extra buffer types
really kept or dropped at load (llama.cpp's own log says where the weights went); the torch rule.
"""

from __future__ import annotations

import ctypes
import importlib.util
import signal
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from llama_cpp import llama_cpp as _C

from gguf_tools.probe_model import write_probe_model
from mtp_cli import cpu_check
from mtp_cli import llama_ext as lx
from mtp_cli.errors import LlamaError
from mtp_cli.llama_ext import buffers
from mtp_cli.llama_ext.build import build_info, compiler_of

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("llama_build", ROOT / "scripts" / "llama_build.py")
assert _spec is not None and _spec.loader is not None
llama_build = importlib.util.module_from_spec(_spec)
sys.modules["llama_build"] = llama_build
_spec.loader.exec_module(llama_build)

GCC12 = "cc (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.\n"
GCC13 = "gcc-13 (Ubuntu 13.1.0-8ubuntu1~22.04) 13.1.0\nCopyright (C) 2023 Free Software Foundation, Inc.\n"
CLANG19 = "Debian clang version 19.1.7 (3~deb12u1)\nTarget: x86_64-pc-linux-gnu\n"
SPR = "avx2 fma f16c avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8"
EPYC = "avx2 fma f16c avx512f avx512_vnni avx512_bf16"


# -- the build choice (item 1) ---------------------------------------------------------------------


def _compiler(text: str):
    c = llama_build.parse_version(text)
    assert c is not None
    return c


def test_compiler_versions_are_read_as_debian_prints_them():
    assert (_compiler(GCC12).family, _compiler(GCC12).major) == ("gcc", 12)
    assert (_compiler(GCC13).family, _compiler(GCC13).major) == ("gcc", 13)
    clang = _compiler(CLANG19)
    assert (clang.family, clang.major, clang.amx_ok) == ("clang", 19, True)
    assert not _compiler(GCC12).amx_ok and _compiler(GCC13).amx_ok
    assert llama_build.parse_version("") is None


ICX = "Intel(R) oneAPI DPC++/C++ Compiler 2025.0.4 (2025.0.4.20241205)\n"


@pytest.mark.parametrize(
    "flags, compiler, amx, extra",
    [
        (EPYC, GCC12, False, None),  # no AMX on the CPU: pip's build, untouched
        (SPR, GCC12, True, "-include"),  # the reporter's machine: GCC 12's intrinsics corrected
        (SPR, GCC13, True, None),
        (SPR, CLANG19, True, None),
        (SPR, ICX, False, "-mno-amx-int8"),  # a compiler we cannot vouch for: AMX compiled out
        (SPR, "", False, "-mno-amx-int8"),  # (none found: cmake's own pick)
    ],
)
def test_the_build_keeps_amx_only_where_it_builds_right(flags, compiler, amx, extra):
    cpu = llama_build.cpu_flags(f"processor\t: 0\nflags\t\t: {flags}\n")
    choice = llama_build.choose(cpu, llama_build.parse_version(compiler), Path("/cache/fix.h"))
    assert choice.amx is amx
    extras = [a for a in choice.cmake_args if a not in llama_build.BASE_ARGS]
    assert (extras[0] if extras else None) == (None if extra is None else extras[0])
    assert all(extra in a for a in extras) if extra else not extras
    assert "-DLLAVA_BUILD=OFF" in choice.cmake_args and "-DGGML_RPC=ON" in choice.cmake_args


def _preprocess(*flags: str) -> str:
    import shutil
    import subprocess

    cc = shutil.which("c++")
    if cc is None:
        pytest.skip("no C++ compiler")
    r = subprocess.run([cc, *flags, "-dM", "-E", "-x", "c++", "/dev/null"], capture_output=True, text=True)
    if r.returncode != 0 and "amx" in r.stderr:
        pytest.skip("this compiler has no AMX flags (not x86)")
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_compiled_out_build_really_has_no_amx_macros():
    """-mno-amx-* wins over the AMX that -march=native (here: -mamx-*) turns on."""
    import shlex

    assert "__AMX_INT8__" in _preprocess("-mamx-int8", "-mamx-tile")
    assert "__AMX_INT8__" not in _preprocess("-mamx-int8", "-mamx-tile", *shlex.split(llama_build.NO_AMX))


def test_the_fix_header_declares_the_whole_tile_config(tmp_path):
    """With GCC 12 the header's macros replace the intrinsics; the corrected ldtilecfg keeps the
    stores that fill the config (compiled at -O2: the dead-store elimination that dropped them)."""
    import shutil
    import subprocess

    cc = shutil.which("c++")
    if cc is None or "Free Software" not in llama_build.version_text("c++"):
        pytest.skip("needs GCC")
    _preprocess("-mamx-tile")  # (skips where the compiler has no AMX flags)
    src = tmp_path / "t.cpp"
    src.write_text(
        "#include <immintrin.h>\n#include <cstdint>\n"
        "struct alignas(64) cfg { uint8_t palette_id, start_row, r[14]; uint16_t colsb[16]; uint8_t rows[16]; };\n"
        "void f() { cfg tc = {}; tc.palette_id = 1; tc.rows[0] = 8; tc.colsb[0] = 64; _tile_loadconfig(&tc); }\n"
    )
    flags = ["-O2", "-mamx-tile", "-mamx-int8", "-S", "-o", "-", str(src)]
    compile_ = lambda *pre: subprocess.run([cc, *pre, *flags], capture_output=True, text=True, check=True).stdout  # noqa: E731
    fixed = compile_("-include", str(llama_build.FIX_HEADER))
    assert "ldtilecfg" in fixed and "$8," in fixed and "$64," in fixed, fixed  # rows[0] = 8, colsb[0] = 64 stored
    gcc = llama_build.parse_version(llama_build.version_text("c++"))
    if gcc is not None and gcc.major < 13:  # the bug itself, as GCC 12 compiles it: the stores are gone
        assert "$8," not in compile_()


def test_the_wheel_key_changes_with_what_changes_the_binary():
    spr = set(SPR.split())
    a = llama_build.choose(spr, _compiler(GCC12), Path("/c/fix-1.h"))
    b = llama_build.choose(spr, _compiler(GCC12), Path("/c/fix-2.h"))
    k = lambda c, text: llama_build.wheel_key(c, spr, text)  # noqa: E731
    assert k(a, GCC12) != k(b, GCC12) and k(a, GCC12) != k(a, GCC13) and k(a, GCC12) == k(a, GCC12)
    assert k(a, GCC12) != llama_build.wheel_key(a, set(EPYC.split()), GCC12)


def test_version_names_the_compiler_and_the_amx_path():
    from mtp_cli.cli import main

    r = CliRunner().invoke(main, ["--version"])
    assert r.exit_code == 0, r.output
    info = build_info()
    assert f"llama.cpp built by: {info.compiler}; AMX path: " in r.output
    assert info.compiler != "unknown"  # the ELF .comment of libggml-cpu names it on Linux
    assert "CPU self-check: " in r.output


def test_compiler_of_prefers_clang_over_the_runtime_objects_gcc():
    assert compiler_of("GCC: (Debian 12.2.0-14) 12.2.0\nDebian clang version 19.1.7 (3~deb12u1)\n") == "clang 19.1.7"
    assert compiler_of("GCC: (Debian 12.2.0-14) 12.2.0\nGCC: (GNU) 13.1.0\n") == "GCC 13.1.0"
    assert compiler_of("") == "unknown"


# -- the extra buffer types, really kept or dropped (item 2) -----------------------------------------


@pytest.fixture
def load_log():
    """llama.cpp's log lines while a test loads models (the buffer each weight set went to)."""
    lines: list[str] = []
    before = buffers.in_use()

    @_C.llama_log_callback
    def keep(level, text, user_data):  # pragma: no cover (called from C)
        lines.append(text.decode("utf-8", "replace"))

    _C.llama_log_set(keep, ctypes.c_void_p(0))
    yield lines
    lx.quiet_logs()
    buffers.keep(before)


def _load_and_decode(path: Path) -> None:
    model = lx.load_model(path)
    ctx = lx.create_context(model, n_ctx=64, n_batch=8, n_threads=1)
    try:
        b = lx.Batch(8)
        b.add_many([1, 40, 41, 42], 0, logits_last=True)
        lx.decode(ctx, b)
    finally:
        ctx.close()
        model.close()


def _placed(log: list[str], buft: str) -> bool:
    return any(f"{buft} model buffer size" in line for line in log)


def test_kept_buffer_types_are_where_the_weights_go(tmp_path, load_log):
    safe = tuple(b for b in buffers.offered() if b != buffers.AMX)  # (torch runs in this process)
    if not safe:
        pytest.skip("this build's CPU backend offers no extra buffer type but AMX")
    path = write_probe_model(tmp_path / "q4_0.gguf", "q4_0")
    assert buffers.keep(()) == () and buffers.in_use() == ()
    _load_and_decode(path)
    assert not any(_placed(load_log, b) for b in buffers.offered()), load_log
    load_log.clear()
    assert buffers.keep(safe) == safe
    _load_and_decode(path)
    assert _placed(load_log, safe[0]), "".join(load_log)
    load_log.clear()
    with buffers.without(safe[0]):  # one load without it, then it is back
        assert safe[0] not in buffers.in_use()
        _load_and_decode(path)
    assert buffers.in_use() == safe and not _placed(load_log, safe[0])


def write_mla_model(path: Path) -> Path:
    """A tiny deepseek2 (MLA: kv_lora_rank, 3-D k_b / v_b) in Q8_0, the kind that aborted with AMX."""
    import gguf
    import numpy as np

    from gguf_tools.probe_model import _vocab

    qt, rng = gguf.GGMLQuantizationType.Q8_0, np.random.default_rng(0)
    E, H, NOPE, ROPE, KVL, QL, V, FF, NV = 64, 2, 32, 32, 64, 64, 32, 128, 288
    w = gguf.GGUFWriter(path, "deepseek2")
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q8_0))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for add, v in (
        (w.add_context_length, 64),
        (w.add_embedding_length, E),
        (w.add_block_count, 1),
        (w.add_feed_forward_length, FF),
        (w.add_head_count, H),
        (w.add_head_count_kv, 1),
        (w.add_layer_norm_rms_eps, 1e-5),
        (w.add_leading_dense_block_count, 1),
        (w.add_kv_lora_rank, KVL),
        (w.add_q_lora_rank, QL),
        (w.add_key_length, KVL + ROPE),
        (w.add_value_length, KVL),
        (w.add_key_length_mla, NOPE + ROPE),
        (w.add_value_length_mla, V),
        (w.add_rope_dimension_count, ROPE),
        (w.add_expert_feed_forward_length, FF),
        (w.add_expert_shared_count, 1),
        (w.add_expert_count, 1),
        (w.add_expert_used_count, 1),
        (w.add_vocab_size, NV),
        (w.add_bos_token_id, 1),
        (w.add_eos_token_id, 2),
    ):
        add(v)  # type: ignore[operator]
    tokens, scores, types = _vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)

    def m(name, *shape):
        w.add_tensor(name, gguf.quants.quantize(rng.standard_normal(shape, dtype=np.float32) * 0.1, qt), raw_dtype=qt)

    def n(name, k):
        w.add_tensor(name, np.ones(k, dtype=np.float32))

    m("token_embd.weight", NV, E), n("output_norm.weight", E), m("output.weight", NV, E)
    n("blk.0.attn_norm.weight", E), n("blk.0.attn_kv_a_norm.weight", KVL), n("blk.0.attn_q_a_norm.weight", QL)
    m("blk.0.attn_q_a.weight", QL, E), m("blk.0.attn_q_b.weight", H * (NOPE + ROPE), QL)
    m("blk.0.attn_kv_a_mqa.weight", KVL + ROPE, E)
    m("blk.0.attn_k_b.weight", H, KVL, NOPE), m("blk.0.attn_v_b.weight", H, V, KVL)
    m("blk.0.attn_output.weight", E, H * V), n("blk.0.ffn_norm.weight", E)
    m("blk.0.ffn_gate.weight", FF, E), m("blk.0.ffn_up.weight", FF, E), m("blk.0.ffn_down.weight", E, FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_an_mla_file_never_gets_amx_weights(tmp_path):
    """deepseek2 files aborted at their first decode with AMX (GGML_ASSERT(*cur_backend_id != -1)):
    in a child with every buffer type this build offers (AMX too, where it is in the build), the
    tiny MLA model decodes a batch, and the other files keep AMX."""
    write_mla_model(tmp_path / "probe-mla.gguf")
    assert cpu_check.probe("all", tmp_path) is None


def test_the_mla_rule_is_decided_per_file(tmp_path, monkeypatch):
    """(The rule itself, where this build has no AMX to leave out.)"""
    import contextlib

    asked: list[str] = []

    @contextlib.contextmanager
    def spy(name):
        asked.append(name)
        yield

    monkeypatch.setattr(buffers, "without", spy)
    for path in (write_mla_model(tmp_path / "mla.gguf"), write_probe_model(tmp_path / "llama.gguf", "q8_0")):
        lx.load_model(path).close()
    assert asked == ["AMX"]


# -- the self-check (item 2) -------------------------------------------------------------------------

SEGV = (sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")


def test_a_child_that_dies_by_a_signal_is_named_by_it(tmp_path):
    assert cpu_check.probe("all", tmp_path, child=SEGV) == "SIGSEGV"
    abort = (sys.executable, "-c", "import os; os.abort()")
    assert cpu_check.probe("all", tmp_path, child=abort) == "SIGABRT"
    hang = (sys.executable, "-c", "import time; time.sleep(60)")
    assert cpu_check.probe("all", tmp_path, timeout=1, child=hang) == "hung for 1 s"


def test_the_real_probe_runs_here(tmp_path):
    """This machine's build (made by the project's own install) survives every setting."""
    for qtype in ("q4_0", "q8_0"):
        write_probe_model(tmp_path / f"probe-{qtype}.gguf", qtype)
    for setting in cpu_check.SETTINGS:
        assert cpu_check.probe(setting, tmp_path) is None, setting


def _dies_when(bad: set[str]):
    calls: list[str] = []

    def run(setting: str, folder: Path):
        calls.append(setting)
        assert sorted(p.name for p in folder.glob("*.gguf")) == ["probe-q4_0.gguf", "probe-q8_0.gguf"]
        return cpu_check.probe(setting, folder, child=SEGV) if setting in bad else None

    return run, calls


@pytest.mark.parametrize(
    "offered, bad, setting",
    [
        (("AMX", "CPU_REPACK"), set(), "all"),
        (("AMX", "CPU_REPACK"), {"all"}, "no-amx"),  # only AMX fails: repack is kept
        (("AMX", "CPU_REPACK"), {"all", "no-amx"}, "none"),
        (("AMX",), {"all"}, "none"),  # nothing between all and none to try
        (("CPU_REPACK",), {"all"}, "none"),
        (("AMX", "CPU_REPACK"), {"all", "no-amx", "none"}, cpu_check.BROKEN),
    ],
)
def test_the_check_takes_the_first_setting_that_survives(offered, bad, setting):
    run, calls = _dies_when(bad)
    got, failed = cpu_check.run_check(offered, run)
    assert got == setting
    assert failed == {s: "SIGSEGV" for s in bad if s in calls}
    assert calls == list(cpu_check.candidates(offered))[: len(calls)]


def test_torch_in_the_process_never_keeps_amx_whatever_was_said():
    both = ("AMX", "CPU_REPACK")
    assert cpu_check.decide(both, "all", None, torch=False) == ("all", "")
    assert cpu_check.decide(both, "all", None, torch=True)[0] == "no-amx"
    assert cpu_check.decide(both, "all", True, torch=True)[0] == "no-amx"  # not even with --repack
    assert cpu_check.decide(("AMX",), "all", None, torch=True)[0] == "none"
    assert cpu_check.decide(both, "no-amx", None, torch=True) == ("no-amx", "")
    assert cpu_check.decide(both, "none", True, torch=False) == ("all", "--repack")
    assert cpu_check.decide(both, "all", False, torch=False) == ("none", "--no-repack")


@pytest.fixture
def fresh_check(monkeypatch):
    """A process that has not decided yet (the session's decision is put back afterwards)."""
    decided, before = list(cpu_check._applied), buffers.in_use()
    cpu_check.forget()
    yield monkeypatch
    cpu_check._applied[:] = decided
    buffers.keep(before)


def test_the_verdict_is_kept_per_build_and_cpu_and_said_once(fresh_check, caplog, isolated_dirs):
    offered = buffers.offered()
    if not offered:
        pytest.skip("no extra buffer type here")
    run, calls = _dies_when({"all"})
    caplog.set_level("WARNING", logger="mtp_cli.cpu_check")
    v = cpu_check.ensure(run_probe=run)
    assert v.setting == ("no-amx" if "AMX" in offered and len(offered) > 1 else "none")
    assert v.kept == buffers.in_use() and "AMX" not in v.kept and v.failed == {"all": "SIGSEGV"}
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "SIGSEGV" in said[0] and "pip install" in said[0], said
    assert (isolated_dirs["cache"] / "cpu-check" / f"{v.key}.json").is_file()
    assert not list((isolated_dirs["cache"] / "cpu-check").glob("*.tmp"))  # (written whole, then renamed)
    # the next run (a new process: forget) reads the cache: no probe, no line
    cpu_check.forget()
    buffers.keep(None)
    caplog.clear()
    n = len(calls)
    assert cpu_check.ensure(run_probe=run).setting == v.setting and len(calls) == n
    assert caplog.records == [] and buffers.in_use() == v.kept
    # another CPU (or build) is another key: probed again
    cpu_check.forget()
    fresh_check.setattr(cpu_check, "cpu_features", lambda: "another cpu")
    cpu_check.ensure(run_probe=run)
    assert len(calls) > n


def test_a_build_that_dies_everywhere_is_one_error_not_a_crash(fresh_check):
    if not buffers.offered():
        pytest.skip("no extra buffer type here")
    run, _ = _dies_when(set(cpu_check.SETTINGS))
    with pytest.raises(LlamaError, match=r"dies on a 4-token decode.*SIGSEGV.*pip install"):
        cpu_check.ensure(run_probe=run)


def test_generate_says_the_line_once_and_keeps_plain_output(fresh_check, tiny_models, isolated_dirs):
    """The CLI end to end with the self-check's child made to die: the command runs, the line is
    printed on the first run only, and the greedy text equals a run with --no-repack."""
    from mtp_cli.cli import main

    if not buffers.offered():
        pytest.skip("no extra buffer type here")
    real = cpu_check.probe
    fresh_check.setattr(cpu_check, "probe", lambda s, f: real(s, f, child=SEGV) if s == "all" else real(s, f))
    model = str(tiny_models("glm4moe")["full"])
    args = ["generate", "-m", model, "-p", "hello world", "-n", "12", "--temp", "0", "--spec-type", "mtp"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert first.stderr.count("crash on this CPU") == 1 and "SIGSEGV" in first.stderr, first.stderr
    cpu_check.forget()
    second = CliRunner().invoke(main, args)
    assert second.exit_code == 0 and "crash on this CPU" not in second.stderr, second.stderr
    cpu_check.forget()
    plain = CliRunner().invoke(main, [*args, "--no-repack"])
    assert plain.exit_code == 0 and plain.stdout == first.stdout == second.stdout


def test_doctor_runs_the_check_and_shows_the_verdict(fresh_check):
    from mtp_cli.cli import main

    r = CliRunner().invoke(main, ["doctor"])
    assert r.exit_code == 0, r.output
    for line in (
        "llama.cpp built by: ",
        "CPU self-check: models load with",
        "verdict: models load with",
        "CPU features: ",
        "devices: ",
        "flash attention: -fa auto is off here for one sequence",  # (the tests' build offloads nothing)
    ):
        assert line in r.output, r.output


def test_the_backtrace_debugger_is_off_unless_the_user_set_it(monkeypatch):
    monkeypatch.delenv("GGML_NO_BACKTRACE", raising=False)
    lx.init_backend()
    import os

    assert os.environ["GGML_NO_BACKTRACE"] == "1"
    monkeypatch.setenv("GGML_NO_BACKTRACE", "0")
    lx.init_backend()
    assert os.environ["GGML_NO_BACKTRACE"] == "0"


def test_the_rebuild_command_reaches_cmake_as_one_flag():
    """The line's command, as a shell runs it and scikit-build-core splits CMAKE_ARGS (shlex)."""
    import shlex

    words = shlex.split(cpu_check.rebuild_command())
    assert words[0].startswith("CMAKE_ARGS=") and "llama-cpp-python==0.3.36" in words
    assert shlex.split(words[0].removeprefix("CMAKE_ARGS=")) == [f"-DCMAKE_CXX_FLAGS=-include {cpu_check.FIX_HEADER}"]
    assert cpu_check.FIX_HEADER.is_file()


def test_signal_names_for_exit_codes():
    assert cpu_check.died(-signal.SIGILL) == "SIGILL"
    assert cpu_check.died(3, "boom\nlast line") == "exit 3 (last line)"


# -- llama.cpp's placement flags (item 3) ------------------------------------------------------------


def _gen(*args: str, env: dict | None = None):
    from mtp_cli.cli import main

    return CliRunner().invoke(main, ["generate", *args, "-n", "10", "--temp", "0", "-t", "1"], env=env)


@pytest.fixture(scope="module")
def pair(tiny_models):
    return tiny_models("glm4moe", "structured", "q8_0", head_noise=1.5)


def test_placement_flags_run_with_plain_output(pair, fresh_check):
    m, side = str(pair["full"]), str(pair["sidecar"])
    plain = _gen("-m", m, "-p", "hello world")
    assert plain.exit_code == 0, plain.output
    for extra in (
        ["-ot", r"blk\.\d+\.ffn_.*=CPU,output=CPU"],
        ["-dev", "none"],
        ["--no-repack"],
        ["-nr"],
        ["--repack"],
        ["-m", str(pair["trunk"]), "-md", side, "--spec-type", "mtp", "-otd", "blk=CPU", "-devd", "none"],
    ):
        r = _gen("-m", m, "-p", "hello world", *extra)
        assert r.exit_code == 0 and r.stdout == plain.stdout, (extra, r.output)


def test_repack_flag_and_variable_force_the_setting(pair, fresh_check):
    m = str(pair["full"])
    assert _gen("-m", m, "-p", "hi", "--no-repack").exit_code == 0
    assert cpu_check._applied[-1].why == "--no-repack" and buffers.in_use() == ()
    cpu_check.forget()
    assert _gen("-m", m, "-p", "hi", env={"LLAMA_ARG_REPACK": "0"}).exit_code == 0
    assert cpu_check._applied[-1].why == "--no-repack"
    cpu_check.forget()
    assert _gen("-m", m, "-p", "hi", "--repack").exit_code == 0
    v = cpu_check._applied[-1]
    assert v.kept == tuple(b for b in v.offered if b != buffers.AMX)  # all but AMX: torch runs in this process


@pytest.mark.parametrize(
    "args, words",
    [
        (["-ot", "blk=NOPE"], ["buffer type 'NOPE'", "there are: CPU"]),
        (["-ot", "no-equals-sign"], ["-ot", "<tensor name pattern>=<buffer type>"]),
        (["-ot", "(=CPU"], ["-ot", "not a regular expression"]),
        (["-dev", "CUDA7"], ["device 'CUDA7'", "there are:"]),
        (["-dev", "CPU"], ["device 'CPU'"]),  # (llama.cpp's rule: the CPU is not a device to list)
        (["-dev", ","], ["-dev", "names no device"]),
    ],
)
def test_bad_placement_is_one_line_and_exit_2(pair, args, words):
    r = _gen("-m", str(pair["full"]), "-p", "hi", *args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


@pytest.mark.parametrize("command", ["generate", "serve", "tune", "bench"])
def test_every_model_loading_command_takes_the_placement_flags(command):
    from mtp_cli.cli import main

    r = CliRunner().invoke(main, [command, "--help"], terminal_width=200)
    for flag in ("--repack / -nr, --no-repack", "--override-tensor", "--device", "-otd", "-devd", "LLAMA_ARG_REPACK"):
        assert flag in r.output, (command, flag)


def test_train_takes_repack_with_its_variable():
    from mtp_cli.cli import main

    r = CliRunner().invoke(main, ["train", "--help"], terminal_width=200)
    assert "--repack / -nr, --no-repack" in r.output and "LLAMA_ARG_REPACK" in r.output
