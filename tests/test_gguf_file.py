"""Hostile and broken inputs: one clear line naming the file, exit 2, no traceback, nothing written."""

from __future__ import annotations

import hashlib
import shutil
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from gguf_tools.errors import BadFileError
from gguf_tools.gguf_file import open_gguf
from mtp_cli.cli import main
from tests.gguf_craft import ARRAY, F32, Q8_0, STRING, UINT32, Crafted, kv_str, kv_u32, s


def _nested_bomb() -> bytes:
    # array of arrays of arrays ... deeper than any real file
    body = s("deep") + struct.pack("<I", ARRAY)
    for _ in range(8):
        body += struct.pack("<IQ", ARRAY, 1)
    return body + struct.pack("<IQ", UINT32, 1) + struct.pack("<I", 7)


def _big_endian() -> bytes:
    """A well-formed GGUF written big-endian (gguf-py can write them): its tensor bytes would be
    copied or loaded as if little-endian."""
    be = lambda fmt, *v: struct.pack(">" + fmt, *v)  # noqa: E731
    bs = lambda t: be("Q", len(t)) + t  # noqa: E731
    head = b"GGUF" + be("I", 3) + be("QQ", 1, 1)
    head += bs(b"general.architecture") + be("I", STRING) + bs(b"llama")
    head += bs(b"a.weight") + be("I", 1) + be("Q", 8) + be("IQ", F32, 0)
    head += b"\0" * (-len(head) % 32)
    return head + struct.pack(">8f", *range(8))


CASES: dict[str, tuple[Crafted | bytes, str]] = {
    "big-endian": (_big_endian(), "big-endian"),
    "empty": (b"", "only 0 bytes"),
    "text file": (b"hello, this is not a model at all\n" * 3, "bad magic"),
    "gguf v1": (Crafted(version=1), "unsupported GGUF version 1"),
    "gguf v99": (Crafted(version=99), "unsupported GGUF version 99"),
    "absurd kv count": (Crafted(n_kv=2**62), "more than the file can hold"),
    "absurd tensor count": (Crafted(n_tensors=2**61), "more than the file can hold"),
    "string length past end": (
        Crafted(kvs=[s("general.architecture") + struct.pack("<I", STRING) + s("llama", 2**40)]),
        "runs past the end",
    ),
    "array count past end": (
        Crafted(kvs=[kv_str("general.architecture", "llama"), s("x") + struct.pack("<IIQ", ARRAY, UINT32, 2**60)]),
        "runs past the end",
    ),
    "string array count past end": (
        Crafted(kvs=[kv_str("general.architecture", "llama"), s("x") + struct.pack("<IIQ", ARRAY, STRING, 2**59)]),
        "more than the file can hold",
    ),
    "unknown value type": (
        Crafted(kvs=[kv_str("general.architecture", "llama"), s("x") + struct.pack("<I", 99)]),
        "unknown value type 99",
    ),
    "nested arrays": (Crafted(kvs=[kv_str("general.architecture", "llama"), _nested_bomb()]), "nests arrays"),
    "non-utf8 key": (
        Crafted(kvs=[kv_str("general.architecture", "llama"), kv_str(b"bad\xff\xfekey", "v")]),
        "not valid UTF-8",
    ),
    "non-utf8 value": (Crafted(kvs=[kv_str("general.architecture", b"lla\xc3ma")]), "not valid UTF-8"),
    "duplicate key": (
        Crafted(kvs=[kv_str("general.architecture", "llama"), kv_u32("a", 1), kv_u32("a", 2)]),
        "appears twice",
    ),
    "bad alignment": (
        Crafted(kvs=[kv_str("general.architecture", "llama"), kv_u32("general.alignment", 24)]),
        "power-of-two",
    ),
    "unknown tensor type": (Crafted(tensors=[("a.weight", [8], 200, 0)]), "unknown type 200"),
    "zero rank": (Crafted(tensors=[("a.weight", [], F32, 0)]), "0 dimensions"),
    "rank 9": (Crafted(tensors=[("a.weight", [1] * 9, F32, 0)]), "9 dimensions"),
    "zero dimension": (Crafted(tensors=[("a.weight", [8, 0], F32, 0)]), "zero dimension"),
    "partial quant block": (Crafted(tensors=[("a.weight", [33], Q8_0, 0)]), "not a multiple"),
    "offset past end": (Crafted(tensors=[("a.weight", [8], F32, 2**40)]), "past the end of the file"),
    "huge dims": (Crafted(tensors=[("a.weight", [2**31, 2**31, 2**31, 2**31], F32, 0)]), "past the end of the file"),
    "misaligned offset": (Crafted(tensors=[("a.weight", [8], F32, 4)]), "not aligned"),
    "overlapping tensors": (Crafted(tensors=[("a.weight", [16], F32, 0), ("b.weight", [8], F32, 32)]), "overlap"),
    "duplicate tensor": (Crafted(tensors=[("a.weight", [8], F32, 0), ("a.weight", [8], F32, 32)]), "appears twice"),
    "non-utf8 tensor name": (Crafted(tensors=[(b"\xffname", [8], F32, 0)]), "not valid UTF-8"),
    "truncated data": (Crafted(cut=-40), "past the end of the file"),
    "truncated header": (Crafted(cut=70), "more than the file can hold"),
    "no architecture": (Crafted(kvs=[kv_u32("llama.block_count", 1)]), "general.architecture is missing"),
}


@pytest.fixture
def hostile(tmp_path: Path, request) -> tuple[Path, str]:
    spec, expected = CASES[request.param]
    p = tmp_path / "hostile.gguf"
    p.write_bytes(spec if isinstance(spec, bytes) else spec.build())
    return p, expected


def test_there_are_enough_cases():
    assert len(CASES) >= 15


def test_crafted_baseline_is_valid(tmp_path: Path):
    """The untouched crafted file opens: each case fails because of its one change."""
    p = tmp_path / "ok.gguf"
    p.write_bytes(Crafted().build())
    gf = open_gguf(p)
    assert gf.arch == "llama" and list(gf.tensors) == ["a.weight", "b.weight"]


@pytest.mark.parametrize("hostile", list(CASES), indirect=True)
def test_open_rejects(hostile):
    path, expected = hostile
    with pytest.raises(BadFileError) as e:
        open_gguf(path)
    assert expected in str(e.value)
    assert str(path) in str(e.value)


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("hostile", list(CASES), indirect=True)
@pytest.mark.parametrize("command", ["inspect", "strip", "extract", "pack-trunk", "pack-heads"])
def test_cli_one_line_exit_2_nothing_written(hostile, command, tmp_path: Path, tiny_models):
    path, expected = hostile
    before = _digest(path)
    out = tmp_path / "out.gguf"
    ok = tmp_path / "ok.gguf"  # a loadable trunk of an MTP arch, so that pack gets as far as reading the heads file
    shutil.copyfile(tiny_models("glm4moe")["trunk"], ok)
    args = {
        "inspect": ["inspect", str(path)],
        "strip": ["strip", str(path), "-o", str(out)],
        "extract": ["extract", str(path), "-o", str(out)],
        "pack-trunk": ["pack", str(path), "--heads", str(ok), "-o", str(out)],
        "pack-heads": ["pack", str(ok), "--heads", str(path), "-o", str(out)],
    }[command]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert "Traceback" not in res.output
    assert str(path) in lines[0]
    assert expected in lines[0] or (command == "pack-heads" and "neither a GGUF" in lines[0])
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["hostile.gguf", "ok.gguf"])
    assert _digest(path) == before


def test_missing_and_folder(tmp_path: Path):
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "nope.gguf")])
    assert r.exit_code == 2 and "no such file" in r.output
    r = CliRunner().invoke(main, ["inspect", str(tmp_path)])
    assert r.exit_code == 2 and "not a regular file" in r.output


def test_a_big_endian_file_is_well_formed_but_refused(tmp_path: Path):
    """The prescan reads it (so the refusal is about byte order, not structure); opening refuses it."""
    from gguf_tools.prescan import prescan

    p = tmp_path / "be.gguf"
    p.write_bytes(_big_endian())
    scan = prescan(p)
    assert scan.byteorder == ">" and [t.name for t in scan.tensors] == ["a.weight"]
    with pytest.raises(BadFileError, match="big-endian.*gguf_convert_endian"):
        open_gguf(p)
