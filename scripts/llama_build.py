"""Build (once, cached) and install the llama-cpp-python wheel this machine can run.

Run by the Makefile with the venv's Python before the project is installed. It picks the compiler
and flags (`choose`), builds the pinned sdist into a wheel under the user cache keyed by everything
that changes the binary, and installs it; a second run on the same machine reuses the wheel.

Why not plain `pip install`: llama.cpp is built with -march=native, and on Intel CPUs with AMX
(Sapphire Rapids and later) that compiles ggml's AMX path. GCC 12 and older miscompile it
(`_tile_loadconfig` declares a pointer-sized read, so the 64-byte tile config is never stored:
every batched decode of a Q4_0/Q4_1/Q8_0 file dies at `ldtilecfg`, llama.cpp #20824). The AMX
path is worth keeping (plain decoding about 2x faster on 2 vCPUs: benchmarks/cpu_buffers.py), so
with such a GCC the build force-includes mtp_cli/data/gcc12_amx_fix.h, which declares the whole 64-byte
operand; clang and GCC 13+ need nothing; a compiler we cannot name gets the AMX path compiled out
(the repack kernels stay). The default compiler (CC, else cc) builds, as with pip. pip also caches
a built wheel by the sdist alone, whatever CMAKE_ARGS said, which is why the wheel is built here
without pip's cache, under a key of our own.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

PIN = "llama-cpp-python==0.3.36"
AMX_FLAGS = ("amx_tile", "amx_int8")
# GCC 12 and older: a force-included header that declares ldtilecfg's 64-byte operand (it says why)
FIX_HEADER = Path(__file__).resolve().parent.parent / "mtp_cli" / "data" / "gcc12_amx_fix.h"
# AMX out of a native build: explicit -mno-* flags win over -march=native in GCC and clang alike
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
# mtp-cli never loads llava/mtmd (imported lazily by llama-cpp-python): a third of the build time;
# the RPC backend (small) spreads a model over other machines (--rpc)
BASE_ARGS = ("-DLLAVA_BUILD=OFF", "-DGGML_RPC=ON")


@dataclass(frozen=True)
class Compiler:
    family: str  # "gcc" | "clang" | "other"
    major: int

    @property
    def amx_ok(self) -> bool:
        """Whether its AMX intrinsics are right (GCC 12's _tile_loadconfig is not)."""
        return self.family == "clang" or (self.family == "gcc" and self.major >= 13)


@dataclass(frozen=True)
class BuildChoice:
    cmake_args: tuple[str, ...]
    amx: bool  # the AMX path is in the build
    why: str


def cpu_flags(cpuinfo: str) -> set[str]:
    """The `flags` of /proc/cpuinfo's first processor (empty where there is none, e.g. macOS)."""
    m = re.search(r"^flags\s*:\s*(.*)$", cpuinfo, re.M)
    return set(m.group(1).split()) if m else set()


def version_text(cc: str) -> str:
    """What `cc --version` prints ("" if it does not run)."""
    path = shutil.which(cc)
    if path is None:
        return ""
    try:
        return subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def parse_version(text: str) -> Compiler | None:
    """The family and major version in what `cc --version` printed (None: no version there)."""
    first = text.splitlines()[0] if text else ""
    m = re.search(r"(\d+)\.\d+", first)
    if not m:
        return None
    # `cc --version` names neither on Debian; GCC's notice does
    family = "clang" if "clang" in first else "gcc" if ("GCC" in first or "Free Software" in text) else "other"
    return Compiler(family, int(m.group(1)))


def choose(flags: set[str], compiler: Compiler | None, fix_header: Path = FIX_HEADER) -> BuildChoice:
    """The CMake arguments for a native build by `compiler` on a CPU with these flags."""
    if not all(f in flags for f in AMX_FLAGS):
        return BuildChoice(BASE_ARGS, False, "no AMX on this CPU: built as pip would")
    if compiler is not None and compiler.amx_ok:
        return BuildChoice(BASE_ARGS, True, f"{compiler.family} {compiler.major} builds the AMX path right")
    if compiler is not None and compiler.family == "gcc":
        fix = (f"-DCMAKE_CXX_FLAGS=-include {fix_header}",)
        why = f"gcc {compiler.major}'s AMX intrinsics are wrong (llama.cpp #20824): corrected by {FIX_HEADER.name}"
        return BuildChoice(BASE_ARGS + fix, True, why)
    no_amx = (f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}")
    why = "a compiler whose AMX intrinsics are unknown here: the AMX path compiled out, repack kept"
    return BuildChoice(BASE_ARGS + no_amx, False, why)


def wheel_key(choice: BuildChoice, flags: set[str], compiler_text: str) -> str:
    """Everything that changes the binary: the pin, Python, the arguments (the fix header's copy is
    named by its text), the compiler, the CPU's flags (-march=native)."""
    text = "\n".join([PIN, sys.version, *choice.cmake_args, compiler_text, " ".join(sorted(flags))])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_fix_header() -> Path:
    """The fix header copied into the cache under its text's hash: every checkout (CI clones anew)
    names the same path, so builds share one wheel."""
    text = FIX_HEADER.read_bytes()
    path = cache_dir() / f"gcc12_amx_fix-{hashlib.sha256(text).hexdigest()[:12]}.h"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text)
    return path


def cache_dir() -> Path:
    root = os.environ.get("MTP_CLI_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mtp-cli"
    )
    return Path(root) / "wheels"


def sdist_tree(cache: Path) -> Path:
    """The pinned sdist, downloaded and unpacked once under `cache`."""
    src = cache / "sdist"
    src.mkdir(parents=True, exist_ok=True)
    tgz = sorted(src.glob("llama_cpp_python-*.tar.gz"))
    if not tgz:
        download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", PIN]
        subprocess.run([*download, "-d", str(src)], check=True)
        tgz = sorted(src.glob("llama_cpp_python-*.tar.gz"))
    tree = src / tgz[-1].name.removesuffix(".tar.gz")
    if not tree.exists():
        with tarfile.open(tgz[-1]) as tf:
            tf.extractall(src, filter="data")
    return tree


def build_tools(targets: tuple[str, ...], cache: Path) -> Path:
    """The folder of llama.cpp's own programs `targets` (llama-completion, ggml-rpc-server...),
    built once from the pinned sdist's vendored tree with the wheel's compiler choice."""
    cc = os.environ.get("CC", "cc")
    text = version_text(cc)
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    choice = choose(cpu_flags(cpuinfo), parse_version(text), cached_fix_header())
    key = wheel_key(choice, set(), text + "tools" + " ".join(targets))
    out = cache / f"llama.cpp-{key}"
    if all((out / "bin" / t).exists() for t in targets):
        return out / "bin"
    tree = sdist_tree(cache)
    args = [a for a in choice.cmake_args if not a.startswith("-DLLAVA")]
    print(f"building {', '.join(targets)} ({choice.why}; a few minutes, once) ...", file=sys.stderr, flush=True)
    build = out / "build"
    cmake = ["cmake", "-S", str(tree / "vendor" / "llama.cpp"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"]
    flags = ["-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", *args]
    jobs = str(os.cpu_count() or 2)
    for step in ([*cmake, *flags], ["cmake", "--build", str(build), "-j", jobs, "--target", *targets]):
        r = subprocess.run(step, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode:  # (the compiler's warnings are many: only a failure's tail is shown)
            raise SystemExit(f"{shlex.join(step)} failed:\n{r.stderr[-3000:]}")
    (out / "bin").mkdir(exist_ok=True)
    for t in targets:
        (out / "bin" / t).write_bytes((build / "bin" / t).read_bytes())
        (out / "bin" / t).chmod(0o755)
    return out / "bin"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--print", action="store_true", help="print the choice and exit")
    args = ap.parse_args(argv)
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = cpu_flags(cpuinfo)
    cc = os.environ.get("CC", "cc")
    text = version_text(cc)
    choice = choose(flags, parse_version(text), cached_fix_header())
    print(f"llama-cpp-python build: {choice.why}; CMAKE_ARGS {shlex.join(choice.cmake_args)}")
    if args.print:
        return 0
    env = dict(os.environ)
    # scikit-build-core splits CMAKE_ARGS like a shell: the flag lists are quoted
    env["CMAKE_ARGS"] = " ".join([env.get("CMAKE_ARGS", ""), shlex.join(choice.cmake_args)]).strip()
    folder = cache_dir() / wheel_key(choice, flags, env["CMAKE_ARGS"] + text)
    wheels = sorted(folder.glob("llama_cpp_python-*.whl"))
    pip = [sys.executable, "-m", "pip"]
    if not wheels:
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        print("building llama-cpp-python from source (about 5 minutes on 2 cores) ...", flush=True)
        wheel = [*pip, "wheel", "-q", "--no-deps", "--no-cache-dir", "--no-binary", "llama-cpp-python"]
        subprocess.run([*wheel, "-w", str(tmp), PIN], env=env, check=True)
        tmp.replace(folder)  # whole or not at all: a killed build leaves no wheel to reuse
        wheels = sorted(folder.glob("llama_cpp_python-*.whl"))
    subprocess.run([*pip, "install", "-q", "--force-reinstall", "--no-deps", str(wheels[-1])], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
