"""llama.cpp's own server test suite (tools/server/tests, from the vendored sources) run against
`mtp-cli serve`: the suite starts "llama-server" through a shim that translates the flags serve
knows, drops the ones for llama-server's model hub and features serve has not (a line per file
says which), and serves the demo model (or -m FILE) instead of the suite's downloaded tiny models.
Prints each file's passed / failed / skipped and every failure's first line, so a failure can be
judged: a model text the suite expects from llama.cpp's tiny models, or a gap.

    python benchmarks/llama_suite.py                      # the Responses and Anthropic files
    python benchmarks/llama_suite.py test_chat_completion.py test_tool_call.py -m model.gguf
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.vs_llama_cpp import _llama_build  # noqa: E402

DEFAULT_FILES = ["test_compat_oai_responses.py", "test_compat_anthropic.py"]
# llama-server's flags that serve takes as they are: with a value, and without
VALUED = {
    "--port",
    "--host",
    "--temp",
    "--seed",
    "-s",
    "--alias",
    "--tags",
    "--reasoning-format",
    "-a",
    "--ctx-size",
    "-c",
    "--parallel",
    "-np",
    "--n-predict",
    "-n",
    "--api-key",
    "--pooling",
    "--batch-size",
    "-b",
    "--ubatch-size",
    "-ub",
    "--threads",
    "-t",
    "--spec-type",
    "--spec-draft-n-max",
    "--spec-draft-n-min",
    "-ctk",
    "-ctv",
    "-fa",
    "--cors-origins",
    "--chat-template",
    "--chat-template-file",
}
FLAGS = {"--embedding", "--embeddings", "--metrics", "--slots", "--no-slots", "--props", "--no-ui", "--no-webui"}
# flags the shim drops, with a value (the rest dropped are bare flags)
DROPPED_VALUED = {
    "--model",
    "-m",
    "--hf-repo",
    "--hf-file",
    "--model-url",
    "--models-dir",
    "--models-max",
    "--models-preset",
    "--grp-attn-n",
    "--grp-attn-w",
    "--slot-save-path",
    "--lora",
    "--reasoning",
    "--mmproj-url",
    "--media-path",
    "--sleep-idle-seconds",
    "--cache-ram",
    "--tools",
    "--tools-runtime",
    "--mcp-servers-config",
    "--mcp-servers-json",
    "--model-draft",
    "-md",
    "--n-gpu-layers",
    "-ngl",
    "--spec-synth-len",
    "--spec-synth-rates",
}

SHIM = """#!{python}
import os, sys
valued, flags, dropped = {valued!r}, {flags!r}, {dropped!r}
args, out, i = sys.argv[1:], ["-m", os.environ["MTP_SUITE_MODEL"]], 0
while i < len(args):
    a = args[i]
    if a in valued:
        out += [a, args[i + 1]]; i += 2
    elif a in flags:
        out.append(a); i += 1
    else:
        with open(os.environ["MTP_SUITE_DROPPED"], "a") as f:
            f.write(a + "\\n")
        i += 2 if a in dropped else 1
os.execv(sys.executable, [sys.executable, "-m", "mtp_cli", "serve", *out])
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", default=DEFAULT_FILES, help="the suite's files under unit/")
    ap.add_argument("-m", "--model", help="the GGUF to serve [default: the demo model]")
    ap.add_argument("-k", help="pytest's -k, to run some tests only")
    args = ap.parse_args()
    model = args.model or str(_demo())
    from mtp_cli.user_cache import cache_dir

    tree = _llama_build().sdist_tree(cache_dir()) / "vendor" / "llama.cpp"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "tools" / "server" / "tests"  # (the suite reads ../../../models/templates)
        shutil.copytree(tree / "tools" / "server" / "tests", work)
        shutil.copytree(tree / "models" / "templates", Path(tmp) / "models" / "templates")
        _offline(work)
        shim = Path(tmp) / "llama-server"
        shim.write_text(SHIM.format(python=sys.executable, valued=VALUED, flags=FLAGS, dropped=DROPPED_VALUED))
        shim.chmod(0o755)
        dropped, report = Path(tmp) / "dropped.txt", Path(tmp) / "report.xml"
        env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(shim), "MTP_SUITE_MODEL": model}
        env |= {"MTP_SUITE_DROPPED": str(dropped), "PYTHONPATH": str(HERE.parent)}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
        cmd += [f"unit/{f}" for f in args.files] + (["-k", args.k] if args.k else [])
        subprocess.run(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _print(report, dropped)


def _demo() -> Path:
    from mtp_cli.cli.demo_model import demo_file

    return demo_file()


def _offline(work: Path) -> None:
    """No model downloads (the shim serves one file), no wget."""
    (work / "wget.py").write_text("def download(*a, **k):\n    raise RuntimeError('offline')\n")
    utils = work / "utils.py"
    utils.write_text(utils.read_text() + "\nServerPreset.load_all = staticmethod(lambda: None)  # (offline)\n")


def _print(report: Path, dropped: Path) -> None:
    if not report.exists():
        print("pytest wrote no report (collection failed?)")
        return
    files: dict[str, list[int]] = {}
    failures = []
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("classname", "").split(".")[-1]
        row = files.setdefault(name, [0, 0, 0])
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            row[1] += 1
            first = (bad.get("message") or bad.text or "").strip().splitlines()[:1]
            failures.append(f"{name}::{case.get('name')}: {textwrap.shorten(' '.join(first), 200)}")
        elif case.find("skipped") is not None:
            row[2] += 1
        else:
            row[0] += 1
    print(f"{'file':<36} passed failed skipped")
    for name, (p, f, s) in sorted(files.items()):
        print(f"{name:<36} {p:>6} {f:>6} {s:>7}")
    if failures:
        print("\nfailures:")
        print("\n".join(f"  {x}" for x in failures))
    if dropped.exists():
        print("\nllama-server flags the shim dropped:", ", ".join(sorted(set(dropped.read_text().split()))))


if __name__ == "__main__":
    main()
