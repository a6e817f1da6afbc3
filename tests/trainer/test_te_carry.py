"""Transformer Engine for a device run, prepared on the CPU (benchmarks/gpu/te_carry.py, prepare_te.sh,
te_smoke.sh): the fatbin cut and the wheel repack on small inputs made here (the 279 MB core wheel and a GPU
are not here), and the scripts' syntax and lint."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import shutil
import struct
import subprocess
import sys
import zipfile

import pytest

from helpers import REPO

CARRY = REPO / "benchmarks" / "gpu" / "te_carry.py"
MAGIC = 0xBA55ED50


def entry(arch: int, payload: bytes) -> bytes:
    """A fatbin entry: kind, flags, header size 64, payload size, SM arch at byte 28 (cuobjdump's layout)."""
    head = bytearray(64)
    struct.pack_into("<HHIQ", head, 0, 2, 0x11, 64, len(payload))
    struct.pack_into("<I", head, 28, arch)
    return bytes(head) + payload


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", MAGIC, 1, 16, len(body)) + body


def elf_with(section: bytes) -> bytes:
    """A minimal 64-bit little-endian ELF: a text-like prefix, the .nv_fatbin section, .shstrtab, headers."""
    names = b"\0.nv_fatbin\0.shstrtab\0"
    prefix = b"\x7fELF" + bytes([2, 1, 1]) + bytes(57) + b"code" * 8  # 64-byte ELF header + some bytes
    fat_off = len(prefix)
    str_off = fat_off + len(section)
    shoff = str_off + len(names)
    shdr = struct.Struct("<IIQQQQIIQQ")
    headers = (
        bytes(64)
        + shdr.pack(1, 1, 2, 0, fat_off, len(section), 0, 0, 8, 0)
        + shdr.pack(12, 3, 0, 0, str_off, len(names), 0, 0, 1, 0)
    )
    head = bytearray(prefix)
    struct.pack_into("<Q", head, 0x28, shoff)
    struct.pack_into("<HHH", head, 0x3A, 64, 3, 2)
    return bytes(head) + section + names + headers


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CARRY), *args], capture_output=True, text=True, timeout=120)


def test_the_cut_keeps_sm90_entries_in_place_and_leaves_the_rest_of_the_library(tmp_path):
    sm90 = entry(90, b"H" * 200)
    first = container(entry(75, b"a" * 120), sm90, entry(100, b"b" * 300))
    no_sm90 = container(entry(80, b"c" * 40))
    second = container(entry(90, b"d" * 24), entry(120, b"e" * 8))
    section = first + bytes(8) + no_sm90 + second  # 8 bytes of alignment padding between containers
    lib = tmp_path / "libtransformer_engine.so"
    lib.write_bytes(elf_with(section))
    before = lib.read_bytes()

    r = run("cut", str(lib), "90")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("3 containers: ") and r.stdout.strip().endswith("1 left whole")
    after = lib.read_bytes()
    assert len(after) == len(before)
    at = before.index(section)
    assert after[:at] == before[:at] and after[at + len(section) :] == before[at + len(section) :]

    cut = after[at : at + len(section)]
    # every container still starts where it did (the registration records point there)
    assert struct.unpack_from("<I", cut, 0)[0] == MAGIC
    assert struct.unpack_from("<Q", cut, 8)[0] == len(sm90)
    assert cut[16 : 16 + len(sm90)] == sm90 and not any(cut[16 + len(sm90) : len(first)])
    p2 = len(first) + 8
    assert cut[p2 : p2 + len(no_sm90)] == no_sm90  # no sm_90 entry: whole
    p3 = p2 + len(no_sm90)
    kept = entry(90, b"d" * 24)
    assert (
        struct.unpack_from("<Q", cut, p3 + 8)[0] == len(kept) and cut[p3 + 16 : p3 + 16 + len(kept)] == kept
    )


def test_the_cut_refuses_a_library_without_fatbins_or_a_broken_container(tmp_path):
    lib = tmp_path / "lib.so"
    lib.write_bytes(elf_with(bytes(64)))
    r = run("cut", str(lib), "90")
    assert r.returncode == 1 and "holds no fatbin container" in r.stderr
    broken = bytearray(container(entry(90, b"x" * 16)))
    struct.pack_into("<Q", broken, 16 + 8, 10_000)  # the entry claims more than its container holds
    lib.write_bytes(elf_with(bytes(broken)))
    r = run("cut", str(lib), "90")
    assert r.returncode == 1 and "runs past its container" in r.stderr
    (tmp_path / "not.so").write_bytes(b"MZ" + bytes(100))
    assert "not a 64-bit little-endian ELF" in run("cut", str(tmp_path / "not.so"), "90").stderr


def _tree(root, licence: bool = True):
    di = root / "tecore-2.18.0.dist-info"
    (root / "tecore").mkdir(parents=True)
    (root / "tecore" / "__init__.py").write_text("VERSION = '2.18.0'\n")
    (root / "tecore" / "lib.so").write_bytes(bytes(range(256)) * 40)
    (di / "licenses").mkdir(parents=True)
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: tecore\nVersion: 2.18.0\n")
    (di / "WHEEL").write_text(
        "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    (di / "RECORD").write_text("tecore/lib.so,sha256=stale,1\n")
    if licence:
        (di / "licenses" / "LICENSE").write_text("Apache License\nVersion 2.0, January 2004\n")
    return root


def test_the_repacked_wheel_records_every_file_and_says_it_was_modified(tmp_path):
    tree = _tree(tmp_path / "tree")
    whl = tmp_path / "out" / "tecore-2.18.0-py3-none-any.whl"
    r = run("repack", str(tree), str(whl))
    assert r.returncode == 0, r.stderr
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        assert names[-1] == "tecore-2.18.0.dist-info/RECORD"
        rows = list(csv.reader(io.StringIO(z.read(names[-1]).decode())))
        recorded = {row[0]: row for row in rows}
        assert set(recorded) == set(names)
        assert recorded[names[-1]] == [names[-1], "", ""]
        for name in names[:-1]:
            body = z.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
            assert recorded[name] == [name, f"sha256={want}", str(len(body))], name
        assert "Apache License" in z.read("tecore-2.18.0.dist-info/licenses/LICENSE").decode()
        assert "cut to the sm_90 entries" in z.read("tecore-2.18.0.dist-info/licenses/MODIFIED.txt").decode()
    # pip takes it offline, as the device does
    site = tmp_path / "site"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--target",
            str(site),
            str(whl),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert (site / "tecore" / "lib.so").read_bytes() == (tree / "tecore" / "lib.so").read_bytes()


def test_the_repack_refuses_a_tree_without_its_licence(tmp_path):
    tree = _tree(tmp_path / "tree", licence=False)
    r = run("repack", str(tree), str(tmp_path / "x.whl"))
    assert r.returncode == 1 and "holds no licence file" in r.stderr
    assert not (tmp_path / "x.whl").exists()


@pytest.mark.parametrize("script", ["prepare_te.sh", "te_smoke.sh", "smoke.sh"])
def test_the_device_scripts_parse_and_pass_shellcheck(script):
    path = REPO / "benchmarks" / "gpu" / script
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True).returncode == 0
    sc = shutil.which("shellcheck")
    assert sc, "shellcheck missing: tests/run.sh installs the Debian package"
    r = subprocess.run([sc, "--shell=bash", "--severity=warning", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_operator_tables_run_at_tiny_shapes_on_cpu(tmp_path):
    """benchmarks/gpu/ops.py --device cpu --quick: the table the device run writes, its FLOP rates recomputed
    here from each shape and time."""
    import yaml

    out = tmp_path / "ops.yaml"
    p = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "gpu" / "ops.py"),
            "--device",
            "cpu",
            "--quick",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    doc = yaml.safe_load(out.read_text())
    assert doc["device"] == "cpu" and doc["skipped"] == []
    assert [(r["m"], r["n"], r["k"], r["dtype"]) for r in doc["gemm"]] == [
        (64, 32, 48, "bf16"),
        (128, 64, 64, "bf16"),
    ]
    for r in doc["gemm"]:
        assert r["ms"] > 0
        assert r["tflops"] == pytest.approx(2 * r["m"] * r["n"] * r["k"] / (r["ms"] * 1e-3) / 1e12, rel=1e-3)
    assert [r["causal"] for r in doc["attention"]] == [True, False]
    for r in doc["attention"]:
        flops = 4 * r["b"] * r["h"] * r["s"] ** 2 * r["d"] * (0.5 if r["causal"] else 1)
        assert r["tflops"] == pytest.approx(flops / (r["ms"] * 1e-3) / 1e12, rel=1e-3)
