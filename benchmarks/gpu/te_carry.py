"""Transformer Engine's core wheel cut to the GPU architectures a device loads, repacked as a valid wheel.

The CUDA 13 core wheel (`transformer-engine-cu13`, 279 MB for 2.18.0) holds `libtransformer_engine.so` with
ELF cubins for seven SM architectures in its `.nv_fatbin` section; a device run carries at most 64 MiB. An
H100/H200 (sm_90) loads only its own entries (the wheel has no PTX), so the others can go:

  python3 benchmarks/gpu/te_carry.py cut LIB.so 90         keep the sm_90 entries, in place
  python3 benchmarks/gpu/te_carry.py repack TREE OUT.whl   a wheel from an unpacked tree, fresh RECORD

Fatbin layout (as CUDA's `cuobjdump` reads it; the fields this script touches): a container is a 16-byte
header (magic 0xBA55ED50 u32, version u16, header size u16, body size u64) and a body of entries; an entry
is its own header (kind u16, flags u16, header size u32, payload size u64, ..., SM arch u32 at byte 28)
and its payload. Each container keeps its start address (the `.nvFatBinSegment` registration records point
there): its kept entries move together right after its header, its body size shrinks to them and the freed
tail is zeroed. A container with none of the kept architectures is left whole. Zeroing dropped payloads in
place instead leaves entries `cuobjdump` rejects ("Invalid ELF").

Licence: Transformer Engine is Apache-2.0 (its wheels' `*.dist-info/licenses/LICENSE`). Section 4 allows
modified copies to be redistributed when the licence travels with them, modified files carry a notice
saying they were changed, and NOTICE files are kept: `repack` refuses a tree without its licence file and
writes `MODIFIED.txt` beside it (`cut` says what changed).
"""

from __future__ import annotations

import base64
import hashlib
import struct
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
_CONTAINER = struct.Struct("<IHHQ")  # magic, version, header size, body size
_ENTRY = struct.Struct("<HHIQ")  # kind, flags, header size, payload size
_ENTRY_ARCH_AT = 28
SECTION = ".nv_fatbin"


class CarryError(ValueError):
    """An input this script cannot cut or repack, with what was wrong."""


@dataclass(frozen=True)
class Entry:
    arch: int
    start: int  # offset in the section
    end: int


@dataclass(frozen=True)
class CutStats:
    containers: int = 0
    kept: int = 0  # payload bytes kept
    dropped: int = 0
    whole: int = 0  # containers without a kept entry, left as they were

    def describe(self) -> str:
        mib = 2**20
        return (
            f"{self.containers} containers: kept {self.kept / mib:.1f} MiB, dropped {self.dropped / mib:.1f} MiB,"
            f" {self.whole} left whole"
        )


def container_entries(data: bytes | bytearray, pos: int) -> tuple[int, int, list[Entry]]:
    """The header size, body size and entries of the container at `pos`."""
    magic, _ver, hsz, fsz = _CONTAINER.unpack_from(data, pos)
    if magic != FATBIN_MAGIC:
        raise CarryError(f"no fatbin container at offset {pos:#x}")
    end = pos + hsz + fsz
    if end > len(data):
        raise CarryError(
            f"the fatbin container at {pos:#x} runs past its section ({end:#x} > {len(data):#x})"
        )
    entries, e = [], pos + hsz
    while e < end:
        _kind, _flags, ehsz, psize = _ENTRY.unpack_from(data, e)
        arch = struct.unpack_from("<I", data, e + _ENTRY_ARCH_AT)[0]
        if ehsz == 0 or e + ehsz + psize > end:
            raise CarryError(f"a fatbin entry at {e:#x} runs past its container (ends {end:#x})")
        entries.append(Entry(arch, e, e + ehsz + psize))
        e += ehsz + psize
    return hsz, fsz, entries


def cut(data: bytearray, keep: set[int]) -> CutStats:
    """Keep only the entries of the architectures in `keep`, container by container, in place. Bytes between
    containers (alignment padding) are skipped 8 at a time, as the section aligns containers to 8."""
    pos, n, kept, dropped, whole = 0, 0, 0, 0, 0
    while pos + _CONTAINER.size <= len(data):
        if _CONTAINER.unpack_from(data, pos)[0] != FATBIN_MAGIC:
            pos += 8
            continue
        hsz, fsz, entries = container_entries(data, pos)
        n += 1
        body_at, end = pos + hsz, pos + hsz + fsz
        mine = b"".join(bytes(data[e.start : e.end]) for e in entries if e.arch in keep)
        if not mine:
            whole += 1
        else:
            data[body_at:end] = mine + bytes(fsz - len(mine))
            struct.pack_into("<Q", data, pos + 8, len(mine))
            kept += len(mine)
            dropped += fsz - len(mine)
        pos = end
    return CutStats(n, kept, dropped, whole)


def elf_section(elf: bytes, name: str) -> tuple[int, int]:
    """(file offset, size) of a 64-bit little-endian ELF's section `name`."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise CarryError("not a 64-bit little-endian ELF file")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab_off = headers[shstrndx][4]
    for sh_name, _type, _flags, _addr, off, size in headers:
        at = strtab_off + sh_name
        if elf[at : elf.index(b"\0", at)].decode() == name:
            return off, size
    raise CarryError(f"the ELF file has no {name} section")


def cut_file(path: Path, keep: set[int]) -> CutStats:
    """`cut` on a shared library's .nv_fatbin section, written back in place (same size, same layout)."""
    raw = bytearray(path.read_bytes())
    off, size = elf_section(raw, SECTION)
    section = raw[off : off + size]
    stats = cut(section, keep)
    if stats.containers == 0:
        raise CarryError(f"{path}: its {SECTION} section holds no fatbin container")
    raw[off : off + size] = section
    path.write_bytes(raw)
    return stats


def record_line(rel: str, body: bytes) -> str:
    """A wheel RECORD row (the wheel spec's urlsafe-base64 sha256 without padding, then the size)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{len(body)}"


def repack(tree: Path, out: Path, change: str) -> Path:
    """A wheel from the unpacked `tree`: a modification notice beside its licence (`change` says what was
    modified), then a fresh RECORD of every file, the RECORD last."""
    records = sorted(tree.glob("*.dist-info/RECORD"))
    if len(records) != 1:
        raise CarryError(f"{tree}: expected one *.dist-info/RECORD, found {len(records)}")
    dist_info = records[0].parent
    licences = sorted(p for p in dist_info.rglob("*") if p.is_file() and p.name.upper().startswith("LICEN"))
    if not licences:
        raise CarryError(
            f"{dist_info.name} holds no licence file: a modified copy must carry it (Apache-2.0 s. 4)"
        )
    (licences[0].parent / "MODIFIED.txt").write_text(
        f"Modified from the published wheel (Apache-2.0, section 4(b)): {change}\n"
    )
    files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file())
    rec = records[0].relative_to(tree).as_posix()
    body = [record_line(f, (tree / f).read_bytes()) for f in files if f != rec]
    records[0].write_text("\n".join([*body, f"{rec},,"]) + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for f in [*(f for f in files if f != rec), rec]:
            z.write(tree / f, f)
    return out


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "cut":
        keep = {int(a) for a in argv[2].split(",")}
        print(cut_file(Path(argv[1]), keep).describe())
        return 0
    if len(argv) == 3 and argv[0] == "repack":
        change = "libtransformer_engine.so's .nv_fatbin cut to the sm_90 entries (benchmarks/gpu/te_carry.py)"
        out = repack(Path(argv[1]), Path(argv[2]), change)
        print(out, out.stat().st_size)
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except CarryError as e:
        print(f"te_carry: {e}", file=sys.stderr)
        sys.exit(1)
