"""Tuned profiles (mtp_cli.speed.profiles): content-based model keys read from samples, machine keys,
the store.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from gguf_tools.gguf_file import open_gguf
from mtp_cli.config import Placement
from mtp_cli.speed import profiles
from tests.speedkit import _profile


@pytest.fixture(scope="session")
def models(tiny_models):
    return lambda arch="glm4moe", **kw: tiny_models(arch, "structured", "q8_0", **kw)


def test_model_key_is_stable_and_content_based(models, tmp_path):
    a = models(head_noise=1.0)["full"]
    k1 = profiles.model_identity(open_gguf(a))["key"]
    assert profiles.model_identity(open_gguf(a))["key"] == k1
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(a, copy)
    assert profiles.model_identity(open_gguf(copy))["key"] == k1  # the path is not part of the key
    # same layout, other head weights (a retrained head): the data samples differ
    b = models(head_noise=2.0)["full"]
    assert profiles.model_identity(open_gguf(b))["key"] != k1
    # one byte inside one tensor's sampled data
    gf = open_gguf(copy)
    t = gf.tensors["blk.2.nextn.eh_proj.weight"]
    with open(copy, "r+b") as f:
        f.seek(t.offset)
        byte = f.read(1)
        f.seek(t.offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert profiles.model_identity(open_gguf(copy))["key"] != k1
    # another layout (trunk only)
    assert profiles.model_identity(open_gguf(models(head_noise=1.0)["trunk"]))["key"] != k1


def test_model_key_reads_only_samples(models, monkeypatch):
    path = models(head_noise=1.0)["full"]
    read = []
    real_open = open

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def seek(self, *a):
            return self.f.seek(*a)

        def read(self, n=-1):
            assert n >= 0, "a read to the end of the file"
            data = self.f.read(n)
            read.append(len(data))
            return data

    monkeypatch.setattr(
        profiles, "open", lambda p, mode="r", *a, **k: Counting(real_open(p, mode, *a, **k)), raising=False
    )
    ident = profiles.model_identity(open_gguf(path))
    n_tensors = ident["tensors"]
    assert sum(read) <= 2 * profiles.SAMPLE_BYTES * n_tensors < path.stat().st_size // 4


def test_profile_key_depends_on_machine_and_sidecar(models):
    s = models(head_noise=1.0)
    full, trunk, side = (open_gguf(s[k]) for k in ("full", "trunk", "sidecar"))
    a = profiles.identify(full, n_threads=1)
    assert a.key == profiles.identify(full, n_threads=1).key
    assert a.key != profiles.identify(full, n_threads=2).key
    assert a.key != profiles.identify(trunk, side, n_threads=1).key
    # where the weights go: RPC servers, the head's side of the link (a default placement keys as none)
    rpc = Placement(rpc=("10.0.0.2:50052",))
    assert profiles.identify(full, n_threads=1, placement=Placement()).key == a.key and "placement" not in a.machine
    # the flash attention the contexts get changes every cost on a CPU: a profile tuned one way is not the other's
    on, off = (profiles.identify(full, n_threads=1, flash_attn=f).key for f in (True, False))
    assert len({a.key, on, off}) == 3
    assert (
        len(
            {
                a.key,
                *(
                    profiles.identify(full, n_threads=1, placement=p).key
                    for p in (rpc, replace(rpc, n_gpu_layers_draft=0))
                ),
            }
        )
        == 3
    )
    assert a.machine["cpu"] and a.machine["backend"] in ("cpu", "gpu")


def test_store_save_load_replace(config_dir):
    assert profiles.config_dir() == config_dir
    assert profiles.find("k1") is None
    path = profiles.save(_profile("k1"))
    assert path == config_dir / profiles.PROFILE_FILE
    profiles.save(_profile("k2", "none"))
    profiles.save(_profile("k1", n=3, p=0.5))  # replaces
    got = profiles.find("k1")
    assert got is not None and got.draft_n_max == 3 and got.draft_p_min == 0.5 and got.setting == "mtp N=3 p>=0.5"
    assert profiles.find("k2").setting == "off"
    assert set(json.loads(path.read_text())["profiles"]) == {"k1", "k2"}


def test_corrupt_store_is_one_clear_error(config_dir):
    config_dir.mkdir(parents=True)
    (config_dir / profiles.PROFILE_FILE).write_text("{not json")
    with pytest.raises(profiles.ProfileError, match="corrupt"):
        profiles.find("k")
