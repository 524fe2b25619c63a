"""Tuned profiles: the fastest draft setting for one model on one machine, saved as JSON.

A profile is keyed by
- the model's identity, computed from what the file declares, not from its multi-GB data: the
  architecture, every scalar key-value (arrays count by length), every tensor's name, type, shape
  and offset, plus a 128-byte sample of each tensor's data (its first and last 64 bytes), so a
  retrained head with the same layout still gets a new key; the same for an -md sidecar;
- the machine: CPU model, threads, backend (CPU build or GPU offload), -ngl (0 on CPU builds,
  where llama.cpp ignores it), llama.cpp's feature line and the llama-cpp-python version, and where
  the weights go when that is not the default (--rpc servers, -dev, -ngld, -ot...: a link's costs,
  and the head's side of it, are the profile's).

The store is one JSON file, `profiles.json`, in the user config directory (platformdirs'
user_config_dir("mtp-cli"): ~/.config/mtp-cli on Linux; MTP_CLI_CONFIG_DIR overrides it), written
atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import struct
from dataclasses import asdict, dataclass, field, fields
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Optional

import platformdirs

from gguf_tools.atomic import write_text
from gguf_tools.gguf_file import GGUFFile
from gguf_tools.prescan import ArrayValue
from mtp_cli import llama_ext as lx
from mtp_cli.config import Placement
from mtp_cli.errors import ModelFileError, ProfileError
from mtp_cli.speed.runs import setting_name

PROFILE_FILE = "profiles.json"
PROFILE_VERSION = 1
SAMPLE_BYTES = 64  # from each end of each tensor's data
ENV_CONFIG_DIR = "MTP_CLI_CONFIG_DIR"


# ---------------------------------------------------------------------------------------------
# identities
# ---------------------------------------------------------------------------------------------


def _value_repr(v: Any) -> str:
    if isinstance(v, ArrayValue):
        return f"array[{v.count}]"
    if isinstance(v, float):
        return struct.pack("<d", v).hex()  # exact, locale-free
    return repr(v)


def model_identity(gf: GGUFFile) -> dict[str, Any]:
    """{"key", "arch", "name", "file_bytes", "tensors", "path"} of an opened GGUF, from its header and
    tensor table plus 2 x SAMPLE_BYTES of each tensor's data (never the whole file)."""
    h = hashlib.sha256()
    h.update(f"arch={gf.arch}\n".encode())
    for k in sorted(gf.scan.values):
        h.update(f"kv {k}={_value_repr(gf.scan.values[k])}\n".encode())
    for t in gf.scan.tensors:
        h.update(f"t {t.name} {int(t.type)} {list(t.shape)} {t.offset} {t.n_bytes}\n".encode())
    try:
        with open(gf.path, "rb") as f:
            for t in gf.scan.tensors:
                n = min(SAMPLE_BYTES, t.n_bytes)
                f.seek(t.offset)
                h.update(f.read(n))
                if t.n_bytes > n:
                    f.seek(t.offset + t.n_bytes - n)
                    h.update(f.read(n))
    except OSError as e:
        raise ModelFileError(f"{gf.path}: cannot read: {e.strerror or e}") from None
    return {
        "key": h.hexdigest()[:32],
        "arch": gf.arch,
        "name": gf.get("general.name") or "",
        "file_bytes": gf.size,
        "tensors": len(gf.scan.tensors),
        "path": str(gf.path.resolve()),
    }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def placement_identity(placement: Placement) -> dict[str, Any]:
    """The placement's settings that differ from the default (none: an empty dict, so the keys of
    profiles tuned without any stay as they were)."""
    default = Placement()
    return {
        f.name: json.loads(json.dumps(getattr(placement, f.name)))
        for f in fields(placement)
        if getattr(placement, f.name) != getattr(default, f.name)
    }


def machine_identity(
    n_threads: Optional[int] = None,
    n_gpu_layers: int = -1,
    placement: Placement = Placement(),
    flash_attn: Optional[bool] = None,
) -> dict[str, Any]:
    """What a profile's speeds depend on beyond the model: this machine, its settings, where the
    weights go (the RPC servers the model is spread over, the head's side of the link) and the
    flash attention the contexts get (None: llama.cpp's auto; on a CPU it changes every cost)."""
    try:
        llama_version = version("llama-cpp-python")
    except PackageNotFoundError:  # pragma: no cover
        llama_version = "unknown"
    gpu = lx.supports_gpu_offload()
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count() or 1,
        "threads": int(n_threads) if n_threads else lx.default_threads(),
        "backend": "gpu" if gpu else "cpu",
        "n_gpu_layers": int(n_gpu_layers) if gpu else 0,
        "system_info": lx.system_info(),
        "llama_cpp_python": llama_version,
        **({"placement": where} if (where := placement_identity(placement)) else {}),
        **({"flash_attn": flash_attn} if flash_attn is not None else {}),
    }


def profile_key(model: dict[str, Any], draft: Optional[dict[str, Any]], machine: dict[str, Any]) -> str:
    blob = json.dumps(
        {"model": model["key"], "draft": draft["key"] if draft else None, "machine": machine}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


# ---------------------------------------------------------------------------------------------
# profiles and the store
# ---------------------------------------------------------------------------------------------


@dataclass
class Profile:
    key: str
    model: dict[str, Any]
    draft: Optional[dict[str, Any]]
    machine: dict[str, Any]
    spec_type: str  # "mtp", "lookup,mtp" (the head beside the lookup), "lookup" or "none": the head off
    draft_n_max: int
    draft_p_min: float
    tokens_per_second: float
    ratio_vs_none: float
    cost_model: dict[str, Any] = field(default_factory=dict)
    acceptance_by_pos: list[float] = field(default_factory=list)
    settings: list[dict[str, Any]] = field(default_factory=list)  # what tune measured
    created: str = ""

    @property
    def setting(self) -> str:
        return setting_name(self.spec_type, self.draft_n_max, self.draft_p_min)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


def config_dir() -> Path:
    env = os.environ.get(ENV_CONFIG_DIR)
    if env:
        return Path(env)
    return Path(platformdirs.user_config_dir("mtp-cli", appauthor=False, roaming=True))


def store_path(directory: Optional[Path] = None) -> Path:
    return (directory or config_dir()) / PROFILE_FILE


def load_all(directory: Optional[Path] = None) -> dict[str, dict[str, Any]]:
    """Every stored profile by key ({} when there is no store). A corrupt store is an error."""
    p = store_path(directory)
    try:
        raw = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ProfileError(f"{p}: cannot read the profile store: {e.strerror or e}") from None
    try:
        data = json.loads(raw)
        profiles = data["profiles"]
        if not isinstance(profiles, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise ProfileError(f"{p}: the profile store is corrupt; delete it and run `mtp-cli tune` again") from None
    return profiles


def find(key: str, directory: Optional[Path] = None) -> Optional[Profile]:
    d = load_all(directory).get(key)
    if d is None:
        return None
    try:
        return Profile.from_dict(d)
    except TypeError:
        return None  # written by another version: as if absent


def save(profile: Profile, directory: Optional[Path] = None) -> Path:
    """Add or replace `profile` in the store (atomic write). Returns the store's path."""
    p = store_path(directory)
    profiles = load_all(directory)
    profiles[profile.key] = profile.to_dict()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        write_text(p, json.dumps({"version": PROFILE_VERSION, "profiles": profiles}, indent=1, sort_keys=True))
    except OSError as e:
        raise ProfileError(f"{p}: cannot write the profile store: {e.strerror or e}") from None
    return p


@dataclass
class Identity:
    """Everything a profile is keyed by, for one (model, sidecar, threads, -ngl)."""

    model: dict[str, Any]
    draft: Optional[dict[str, Any]]
    machine: dict[str, Any]

    @property
    def key(self) -> str:
        return profile_key(self.model, self.draft, self.machine)


def identify(
    model: GGUFFile,
    draft: Optional[GGUFFile] = None,
    *,
    n_threads: Optional[int] = None,
    n_gpu_layers: int = -1,
    placement: Placement = Placement(),
    flash_attn: Optional[bool] = None,
) -> Identity:
    return Identity(
        model_identity(model),
        model_identity(draft) if draft is not None else None,
        machine_identity(n_threads, n_gpu_layers, placement, flash_attn),
    )


__all__ = [
    "Profile",
    "ProfileError",
    "Identity",
    "identify",
    "model_identity",
    "machine_identity",
    "profile_key",
    "config_dir",
    "store_path",
    "load_all",
    "find",
    "save",
    "cpu_model",
]
