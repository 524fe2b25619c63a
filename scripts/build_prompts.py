"""Regenerate prompts.txt: templated instructions written for this project (MIT, like the project).

    python scripts/build_prompts.py > mtp_cli/train/prompts/prompts.txt

The kinds live in scripts/prompt_kinds.json: for each, its templates and subjects (every subject of
a kind reads correctly in every template of that kind). Deterministic: every (template, subject)
pair of each kind, shuffled with the file's seed, duplicates dropped (first occurrence kept). The
count goes to stderr; stdout is only the prompts, one per line.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

KINDS_FILE = Path(__file__).resolve().parent / "prompt_kinds.json"


def prompts(path: Path = KINDS_FILE) -> tuple[list[str], int]:
    """(the prompts, the number of kinds)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    kinds = data["kinds"].values()
    out = [t.format(s=s) for k in kinds for t in k["templates"] for s in k["subjects"]]
    random.Random(data["seed"]).shuffle(out)
    return list(dict.fromkeys(out)), len(data["kinds"])


if __name__ == "__main__":
    ps, n_kinds = prompts()
    for p in ps:
        print(p)
    print(f"{len(ps)} prompts, {n_kinds} kinds", file=sys.stderr)
