"""`mtp-cli train`: give a frozen glm4moe trunk (adopted or native), or a step35 one adopted from Llama
3.x, an MTP head (issue 5).

Optional extra: torch is imported only by the modules that need it (head, trainer) and only when
training runs; `require_torch()` turns a missing torch into one line.

Modules, one concept each:

    trunk.py     the frozen trunk tensors the head reuses, read from the GGUF (numpy)
    data.py      data collection through llama.cpp with the trunk frozen, stored as memmaps (numpy)
    head.py      the glm4moe MTP head block in torch, exactly llama.cpp's graph_mtp
    trainer.py   the training loop: losses, unrolled second draft step, checkpoints, progress
    export.py    head weights -> glm4moe head block tensors -> sidecar GGUF / packed model
    pipeline.py  adopt if needed -> collect -> train -> export (what the CLI calls)
"""

from __future__ import annotations

from mtp_cli import cpu_check
from mtp_cli.errors import MissingTorchError

cpu_check.torch_in_process()  # training runs torch beside llama.cpp: ggml's AMX path must not run

TORCH_HINT = "training needs torch: pip install 'mtp-cli[train]'"


def require_torch():
    """Import torch or raise MissingTorchError with the one-line install hint."""
    try:
        import torch
    except ImportError:
        raise MissingTorchError(TORCH_HINT) from None
    return torch


__all__ = ["TORCH_HINT", "MissingTorchError", "require_torch"]
