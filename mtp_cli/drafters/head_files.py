"""What an MTP head needs of the files before and as they load: a head in the target, or an MTP
sidecar (`-md`) of the same vocabulary and width, or an assistant that fits the target."""

from __future__ import annotations

from typing import Optional

from gguf_tools.gguf_file import GGUFFile
from gguf_tools.loadable.assistant import assistant_problem
from gguf_tools.names import ASSISTANT_ARCHS
from mtp_cli import llama_ext as lx
from mtp_cli.drafters.base import Loader, Models, check_same_vocab
from mtp_cli.errors import ModelFileError, NoMtpHeadError


def check_head_files(target: GGUFFile, draft: Optional[GGUFFile]) -> None:
    """Refuse a target without a head (no sidecar given), a sidecar without one, an assistant that
    does not fit the target."""
    if draft is None and target.layout().nextn_layers == 0:
        raise NoMtpHeadError(
            f"{target.path.name} has no MTP head (nextn_predict_layers = 0): graft one with `mtp-cli pack`, "
            "give an MTP sidecar as `draft_model`, or use `spec_type` ngram"
        )
    if draft is not None and draft.layout().nextn_layers == 0:
        raise NoMtpHeadError(
            f"`draft_model` {draft.path.name} has no MTP head (nextn_predict_layers = 0): for `spec_type` mtp "
            "it must be an MTP sidecar (`mtp-cli extract`); a plain small model drafts with `spec_type` draft"
        )
    if draft is not None and draft.arch in ASSISTANT_ARCHS:
        why = assistant_problem(target.scan, draft.scan)
        if why:
            raise ModelFileError(f"`draft_model` {draft.path.name} does not fit {target.path.name}: {why}")


def load_head(models: Models, load: Loader) -> None:
    """models.drafting: the target itself (its own head), or the sidecar, checked against it."""
    if models.draft_file is None:
        models.drafting = models.target
        return
    dm = models.drafting = load(models.draft_file, "draft model", True)
    check_same_vocab(models.target, dm, models.target_file, models.draft_file)
    if lx.n_embd_out(dm) != lx.n_embd_out(models.target):
        raise ModelFileError(
            f"`draft_model` {models.draft_file.path.name}: MTP head width {lx.n_embd_out(dm)} "
            f"does not match the target's hidden size {lx.n_embd_out(models.target)}"
        )


__all__ = ["check_head_files", "load_head"]
