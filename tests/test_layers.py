"""The house rules (ARCHITECTURE §2): imports point down only, no cycle (function-local imports included),
llama.cpp only behind mtp_cli.llama_ext, click and rich only in the CLI; modules and functions small;
`mtp-cli --help` and the GGUF commands never load llama.cpp."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gguf_tools", "mtp_cli")
CORE = (
    "mtp_cli.runtime",
    "mtp_cli.loop",
    "mtp_cli.drafters",
    "mtp_cli.sampling",
    "mtp_cli.llama_ext",
    "mtp_cli.policy",
    "mtp_cli.config",
    "mtp_cli.stats",
    "mtp_cli.errors",
)
ABOVE_CORE = ("mtp_cli.speed", "mtp_cli.cli", "mtp_cli.train", "mtp_cli.demo", "mtp_cli.serve")
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60
CODE_DIRS = ("gguf_tools", "mtp_cli", "benchmarks", "scripts")


def project_modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def imports_of(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """Every module `path` imports, anywhere in it (function bodies and TYPE_CHECKING blocks too);
    `from a import b` counts as a.b when that is a module, else as a."""
    out: set[str] = set()
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
    return out


def graph() -> dict[str, set[str]]:
    mods = project_modules()
    return {m: imports_of(p, m, mods) for m, p in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle among the keys of `edges` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if n not in edges:
                continue
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (c := visit(n)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (c := visit(m)):
            return c
    return None


def reach(edges: dict[str, set[str]], start: str) -> set[str]:
    """Every project module `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for n in edges.get(todo.pop(), ()):
            if n in edges and n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_cycle_finder_finds_cycles():
    """(so that test_no_import_cycle can fail)"""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle():
    assert find_cycle(graph()) is None


def test_gguf_tools_imports_neither_mtp_cli_nor_llama_cpp():
    for m, deps in graph().items():
        if under(m, ("gguf_tools",)):
            bad = {d for d in deps if under(d, ("mtp_cli", "llama_cpp", "click", "rich"))}
            assert not bad, (m, bad)


def test_the_core_imports_nothing_above_it():
    g = graph()
    for m in g:
        if under(m, CORE):
            bad = {d for d in reach(g, m) if under(d, ABOVE_CORE)}
            assert not bad, (m, bad)


def test_llama_cpp_only_behind_llama_ext_click_rich_in_the_cli_and_fastapi_in_serve():
    for m, deps in graph().items():
        for d in deps:
            if under(d, ("llama_cpp.llama_cpp_ext",)):
                assert m == "mtp_cli.llama_ext.staging", (m, d)
            elif under(d, ("llama_cpp",)):
                assert under(m, ("mtp_cli.llama_ext",)) or d == "llama_cpp.llama_chat_format", (m, d)
            if under(d, ("click", "rich")):
                assert under(m, ("mtp_cli.cli",)), (m, d)
            if under(d, ("fastapi", "starlette", "uvicorn", "pydantic")):  # (the serve extra)
                assert under(m, ("mtp_cli.serve",)), (m, d)


def test_llama_cpp_handles_stay_inside_llama_ext():
    """Outside mtp_cli.llama_ext no module holds a raw llama.cpp pointer (it gets Model, Context and
    Sampler handles: no ctypes, no pointer aliases, no `_as_parameter_`), and the layers above the
    core import llama_ext's public package only (no submodule, no private name)."""
    mods = project_modules()
    for m, path in mods.items():
        if not under(m, ("mtp_cli",)) or under(m, ("mtp_cli.llama_ext",)):
            continue
        deps = imports_of(path, m, mods)
        assert not under_any(deps, ("ctypes",)), m
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
            assert name != "_as_parameter_" and not name.endswith("Ptr"), (m, name)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "lx":
                assert not node.attr.startswith("_"), (m, node.attr)
        if under(m, ABOVE_CORE):
            inner = {d for d in deps if under(d, ("mtp_cli.llama_ext",)) and d != "mtp_cli.llama_ext"}
            assert not inner, (m, inner)


def under_any(deps: set[str], prefixes: tuple[str, ...]) -> bool:
    return any(under(d, prefixes) for d in deps)


def code_files() -> list[Path]:
    """The project's own Python files (what git would take: not the ignored GPU-check build, say)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", *CODE_DIRS], cwd=ROOT, capture_output=True, text=True
    )
    if listed.returncode == 0:
        return sorted(ROOT / f for f in listed.stdout.split() if f.endswith(".py") and (ROOT / f).is_file())
    return [p for d in CODE_DIRS for p in sorted((ROOT / d).rglob("*.py"))]


def test_modules_and_functions_are_small():
    long_modules, long_functions = [], []
    for p in code_files():
        src = p.read_text()
        if len(src.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(f"{p.relative_to(ROOT)}: {len(src.splitlines())}")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name}: {n}")
    assert not long_modules and not long_functions, (long_modules, long_functions)


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_help_does_not_load_llama_cpp():
    mods = _loaded_after("from mtp_cli.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass")
    assert "mtp_cli.cli" in mods and "llama_cpp" not in mods


@pytest.mark.parametrize(
    "command", [["inspect", "{file}"], ["inspect", "{file}", "--json"], ["strip", "{file}", "-o", "{out}"]]
)
def test_gguf_commands_do_not_load_llama_cpp(tiny_models, tmp_path, command):
    f = tiny_models("glm4moe")["full"]
    args = [a.format(file=f, out=tmp_path / "o.gguf") for a in command]
    mods = _loaded_after(
        f"from mtp_cli.cli import main\ntry:\n    main({args!r})\nexcept SystemExit as e:\n"
        "    assert not e.code, e.code"
    )
    assert "gguf_tools.report" in mods and "llama_cpp" not in mods
