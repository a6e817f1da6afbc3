"""Hostile records and files to `data prepare`: symlinks out of the image folder, decompression bombs, a
truncated JPEG, JSON nested 100,000 deep, a 5,000-digit number, a 5,000-character path, a 2 GiB non-image,
lone surrogates, split shares that do not normalise, a symlinked OUT and another prepare's staging folder.
Each bad record is refused naming FILE:LINE and the rule (exit 2), and with `--skip-bad` is one skipped
record while the pass goes on. One line per case (see tests/helpers/hostile.py)."""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from pathlib import Path

import pytest

from helpers.hostile import Case, run_case


def png(w: int = 8, h: int = 8) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 40, 40)).save(buf, "PNG")
    return buf.getvalue()


def png_header_only(w: int, h: int) -> bytes:
    """A PNG that claims w x h one-bit pixels in a few dozen bytes: PIL reads the size from IHDR alone."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    )


def truncated_jpeg() -> bytes:
    """A real JPEG of noise cut at 60%: PIL's verify() passes it, decoding its pixels does not."""
    from PIL import Image

    buf = io.BytesIO()
    Image.frombytes("RGB", (96, 96), os.urandom(96 * 96 * 3)).save(buf, "JPEG", quality=95)
    data = buf.getvalue()
    return data[: len(data) * 6 // 10]


def record(image: object = "ok.png", question: str = "<image>\nWhat colour?") -> str:
    doc = {"id": "r", "image": image, "conversations": [{"from": "human", "value": question},
                                                        {"from": "gpt", "value": "Red."}]}  # fmt: skip
    return json.dumps(doc)


GOOD = record()
P = ["data", "prepare", "{tmp}/d.jsonl", "--images", "{tmp}/img", "-o", "{tmp}/out"]


def symlink_out(tmp: Path) -> None:
    (tmp / "secret.png").write_bytes(png())
    (tmp / "img" / "link.png").symlink_to(tmp / "secret.png")


def symlinked_dir(tmp: Path) -> None:
    (tmp / "elsewhere").mkdir()
    (tmp / "elsewhere" / "a.png").write_bytes(png())
    (tmp / "img" / "sub").symlink_to(tmp / "elsewhere")


def sparse_2gib(tmp: Path) -> None:
    with (tmp / "img" / "big.png").open("wb") as f:
        f.truncate(2 << 30)


def nothing_written(tmp: Path, out: str) -> None:
    assert not (tmp / "out").exists(), "a refused prepare wrote OUT"
    assert not list(tmp.glob(".out.prepare-staging*")), "a refused prepare left its staging folder"


# (id, the bad record's line, extra setup, files under img/, words the refusal holds)
BAD = [
    ("symlink-to-outside", record("link.png"), symlink_out, {}, "leads outside the image folder"),
    ("symlinked-folder", record("sub/a.png"), symlinked_dir, {}, "leads outside the image folder"),
    ("decompression-bomb", record("bomb.png"), None, {"bomb.png": png_header_only(100_000, 100_000)},
     "decompression bomb"),
    ("decompression-bomb-warning", record("warn.png"), None, {"warn.png": png_header_only(10_000, 10_000)},
     "decompression bomb (Image size (100000000 pixels) exceeds limit"),
    ("truncated-jpeg", record("cut.jpg"), None, {"cut.jpg": truncated_jpeg()}, "is damaged (OSError: image file is truncated"),
    ("json-100000-deep", "[" * 100_000 + "]" * 100_000, None, {}, "JSON nested too deep"),
    ("json-deep-object", '{"conversations": ' + "[" * 100_000 + "]" * 100_000 + "}", None, {},
     "JSON nested too deep"),
    ("number-5000-digits", '{"id": ' + "9" * 5000 + ', "conversations": []}', None, {},
     "a JSON integer of more than 4,300 digits"),
    ("path-5000-characters", record("a" * 5000 + ".png"), None, {}, "image path of 5,004 characters"),
    ("non-image-2gib", record("big.png"), sparse_2gib, {}, "is over 64 MiB"),
    ("lone-surrogate", record(question="<image>\nWhat \ud800?"), None, {},
     "a lone surrogate '\\ud800'"),
]  # fmt: skip


def _files(line: str, images: dict[str, bytes]) -> dict[str, bytes | str]:
    return {"d.jsonl": GOOD + "\n" + line + "\n", "img/ok.png": png()} | {
        f"img/{k}": v for k, v in images.items()
    }


CASES = [
    c
    for id, line, setup, images, says in BAD
    for c in (
        Case(id, P, 2, ("d.jsonl:2: ", says, "--skip-bad"), files=_files(line, images), setup=setup,
             check=nothing_written, timeout_s=60),
        Case(f"{id}-skip-bad", [*P, "--skip-bad"], 0, ("1 samples", "skipped 1 bad record(s)", says),
             files=_files(line, images), setup=setup, timeout_s=60),
    )
] + [
    Case("split-sum-overflows", [*P, "--split", "1e308,1e308,0"], 2, ("the shares' sum is not a finite number",),
         files=_files(GOOD, {}), check=nothing_written),
    Case("split-train-gets-nothing", [*P, "--split", "1e-300,1,0"], 2, ("the train split got none of the 2",),
         files=_files(GOOD, {}), check=nothing_written),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_prepare(case: Case, tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    run_case(case, tmp_path)


def test_a_symlinked_out_is_refused_before_any_record_is_read(tmp_path: Path) -> None:
    """The staging folder is renamed onto OUT at the end, which a symlink cannot take: refused up front,
    so a bad record after it is never reached (its error would come first if the pass ran)."""
    (tmp_path / "img").mkdir()
    (tmp_path / "target").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "target")
    case = Case("out-symlink", P, 2, ("--out", "a symlink (to", "give the directory itself"),
                files=_files("{not json", {}))  # fmt: skip
    out = run_case(case, tmp_path)
    assert "not JSON" not in out
    assert not list((tmp_path / "target").iterdir()) and not list(tmp_path.glob(".out.prepare-staging*"))


def test_a_prepare_leaves_another_prepares_staging_folder_alone(tmp_path: Path) -> None:
    """Two prepares into one OUT: each stages in its own folder, and neither deletes the other's (here the
    other is one still running, its staging folder holding what it has written so far)."""
    (tmp_path / "img").mkdir()
    others = [tmp_path / ".out.prepare-staging", tmp_path / ".out.prepare-staging-0123456789ab"]
    for other in others:
        other.mkdir()
        (other / "train-000000.tar").write_bytes(b"written by another prepare")
    run_case(Case("second-prepare", P, 0, ("2 samples",), files=_files(GOOD, {})), tmp_path)
    for other in others:
        assert (other / "train-000000.tar").read_bytes() == b"written by another prepare", other
    assert (tmp_path / "out" / "prepare.json").is_file()
