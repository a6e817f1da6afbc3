"""The checkpoint directory format, read without torch: names, manifest.json, discovery, compatibility.

  <checkpoint_dir>/
    latest                      text: "iter_0000012" (replaced atomically: write latest.tmp, os.replace)
    iter_0000012/
      manifest.json             provenance + the list of files with their sizes (written last, by rank 0)
      run.yaml                  the resolved run config (run.yaml document) this checkpoint was taken with
      rank/rank-00003.pt        per rank: RNG states, data-provider state, iteration, consumed samples, extras
      <module>/optim-00003.pt   per rank and module: optimizer + scheduler state, how the rank's tensors are
                                cut from the full ones and its optimizer state in model space (resharding)
      <module>/model-00002.pt   dense weights of one TP/EP shard (DP rank 0 of each DP group only)
      <module>/experts-00002.pt expert weights (expert-DP rank 0 only; MoE)
    iter_0000014.tmp/           a save in progress (or a crashed one): never read

A directory is a complete checkpoint once it has its final iter_N name and a manifest.json. How the files are
written is checkpoint.py's business; this module only reads them, so `mimo-jobs status` can list
checkpoints without importing torch.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mimo_jobs.errors import MimoJobsError

FORMAT_VERSION = 1
LATEST = "latest"
MANIFEST = "manifest.json"
_ITER_RE = re.compile(r"^iter_(\d{7,})\Z")
# Layout fields that decide how a checkpoint's files are cut, with each encoder module's sizes (cut_keys):
# when they all match, a rank loads its own files (the fast path); otherwise the checkpoint is resharded
# (trainer/checkpoint/reshard.py).
LAYOUT_KEYS = (
    "nodes",
    "gpus_per_node",
    "llm_tp",
    "llm_pp",
    "llm_dp",
    "llm_ep",
    "llm_etp",
    "llm_cp",
    "num_experts",
    "gbs",
    "mbs",
)


class CheckpointError(MimoJobsError, RuntimeError):
    """A checkpoint cannot be written or read (names the directory/file and what is wrong)."""


class CheckpointMismatch(CheckpointError):
    """The checkpoint belongs to another run or another layout: refused."""


def iter_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def parse_iter_name(name: str) -> int | None:
    """The iteration of a checkpoint directory name ("iter_0000012" -> 12), None for any other name."""
    m = _ITER_RE.match(name)
    return int(m.group(1)) if m else None


def rank_file(rank: int) -> str:
    """Path, relative to the checkpoint directory, of one rank's own state file."""
    return f"rank/rank-{rank:05d}.pt"


@dataclass(frozen=True)
class Provenance:
    """Who wrote a checkpoint. run_id + layout decide whether another launch may load it."""

    run_id: str
    study: str
    run_name: str
    layout: dict  # asdict(topology.Layout)
    world: int
    git_sha: str | None = None
    job_id: str | None = None
    attempt: int = 0
    started_from: str | None = None  # the run's trainer.init.checkpoint (lineage), if any
    # how the layers name their parameters ("te": Transformer Engine's fused norms and grouped experts;
    # "local": megatron-core's local layers); None: not recorded (written before the field existed)
    layers: str | None = None


@dataclass
class CheckpointInfo:
    """A complete checkpoint on disk (read from its manifest)."""

    path: Path
    iteration: int
    consumed_samples: int
    run_id: str
    study: str
    run_name: str
    git_sha: str | None
    layout: dict
    world: int
    time: str
    job_id: str | None = None
    attempt: int = 0
    bytes: int = 0
    files: dict = field(default_factory=dict)  # relative path -> size in bytes
    rank_modules: dict = field(default_factory=dict)  # str(rank) -> the modules that rank held
    layers: str | None = None  # Provenance.layers of the launch that wrote it

    def to_dict(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def manifest_doc(
    *,
    iteration: int,
    consumed_samples: int,
    provenance: Provenance,
    files: dict[str, int],
    rank_modules: dict[str, list[str]],
    save_s: float,
) -> dict:
    """The manifest.json document of a checkpoint whose files (relative path -> bytes) are all written."""
    return {
        "format": FORMAT_VERSION,
        "iteration": iteration,
        "consumed_samples": consumed_samples,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "provenance": asdict(provenance),
        "bytes": sum(files.values()),
        "rank_modules": rank_modules,
        "files": files,
        "save_s": round(save_s, 4),
    }


def read_manifest(d: Path) -> CheckpointInfo:
    try:
        m = json.loads((d / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{d}: no {MANIFEST} (not a complete checkpoint)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{d}/{MANIFEST}: unreadable: {e}") from None
    if not isinstance(m, dict):
        raise CheckpointError(
            f"{d}/{MANIFEST}: a JSON {type(m).__name__}, not a checkpoint manifest (an object)"
        )
    if m.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"{d}/{MANIFEST}: format {m.get('format')!r}, this mimo-jobs reads format {FORMAT_VERSION}"
        )
    try:
        return _info(d, m)
    except KeyError as e:
        why = f"no field {e.args[0]!r}"
    except (TypeError, ValueError, AttributeError) as e:
        why = str(e)
    raise CheckpointError(f"{d}/{MANIFEST}: not the manifest mimo-jobs writes ({why})")


def _info(d: Path, m: dict) -> CheckpointInfo:
    """The manifest's fields, each of the type the writer gives it (TypeError/ValueError/KeyError else)."""
    p = _typed(m, "provenance", dict)
    files = _typed(m, "files", dict, {})
    if not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in files.items()):
        raise TypeError("files must map each part's name to its size in bytes")
    return CheckpointInfo(
        path=d,
        iteration=int(m["iteration"]),
        consumed_samples=int(m["consumed_samples"]),
        run_id=str(p["run_id"]),
        study=str(p["study"]),
        run_name=str(p["run_name"]),
        git_sha=p.get("git_sha"),
        layout=_typed(p, "layout", dict),
        world=int(p["world"]),
        time=str(m.get("time", "")),
        job_id=p.get("job_id"),
        attempt=int(p.get("attempt", 0)),
        bytes=int(m.get("bytes", 0)),
        files=files,
        rank_modules=_typed(m, "rank_modules", dict, {}),
        layers=p.get("layers") if isinstance(p.get("layers"), str) else None,
    )


def _typed(m: dict, key: str, kind: type, default=None):
    v = m[key] if default is None else m.get(key, default)
    if not isinstance(v, kind):
        raise TypeError(f"{key} is a {type(v).__name__}, not a {kind.__name__}")
    return v


def list_checkpoints(directory: str | Path) -> list[CheckpointInfo]:
    """Complete checkpoints (with a manifest), oldest first. Temporary/partial directories are ignored."""
    d = Path(directory)
    if not d.is_dir():
        return []
    out = []
    for c in d.iterdir():
        if c.is_dir() and _ITER_RE.match(c.name) and (c / MANIFEST).is_file():
            try:
                out.append(read_manifest(c))
            except CheckpointError:
                continue
    return sorted(out, key=lambda i: i.iteration)


def latest_checkpoint(directory: str | Path) -> CheckpointInfo | None:
    """The checkpoint `latest` names; if the marker is missing or names nothing complete, the newest complete
    checkpoint (a crash between the rename and the marker update leaves exactly that state)."""
    d = Path(directory)
    marker = d / LATEST
    if marker.is_file():
        name = marker.read_text().strip()
        if _ITER_RE.match(name) and (d / name / MANIFEST).is_file():
            return read_manifest(d / name)
    all_ = list_checkpoints(d)
    return all_[-1] if all_ else None


def cut_keys(layout: dict) -> dict:
    """A layout record's fields that decide how a checkpoint's files are cut: LAYOUT_KEYS and each encoder
    module's sizes, `encoders.<name>.tp` (and pp, dp) of a record's `encoders`; a record of one encoder
    named vision keeps them as its enc_tp/enc_pp/enc_dp (the older form, which Layout.to_dict still writes
    for it), read as they are."""
    out = {k: layout.get(k) for k in LAYOUT_KEYS}
    if "encoders" in layout:
        for m in layout["encoders"]:
            out |= {f"encoders.{m.get('name')}.{k}": m.get(k) for k in ("tp", "pp", "dp")}
    else:
        out |= {k: layout.get(k) for k in ("enc_tp", "enc_pp", "enc_dp")}
    return out


def layout_diff(saved: dict, now: dict) -> list[tuple[str, object, object]]:
    """(field, saved, now) of every cut_keys field that differs (a module only one side has: None on the
    other)."""
    a, b = cut_keys(saved), cut_keys(now)
    return [(k, a.get(k), b.get(k)) for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]


def same_layout(info: CheckpointInfo, prov: Provenance) -> bool:
    """Whether this launch cuts its tensors as `info` did (every rank can read its own files)."""
    return info.world == prov.world and not layout_diff(info.layout, prov.layout)


def same_names(info: CheckpointInfo, prov: Provenance) -> bool:
    """Whether this launch's layers name their parameters as `info`'s did (a same-layout load then reads
    state_dict keys and the optimizer's parameter order as saved); otherwise the tensors move by canonical
    name (reshard). Not recorded on either side: assumed equal (a different naming then fails loudly on the
    first key)."""
    return info.layers is None or prov.layers is None or info.layers == prov.layers


def check_compatible(info: CheckpointInfo, prov: Provenance) -> list[str]:
    """Why `prov` (this launch) may not resume its own run from `info` (empty = compatible). A run id hashes
    the layout, so a checkpoint of this run has this run's layout; another run's checkpoint (any layout) is
    a start point, given as trainer.init.checkpoint."""
    problems = []
    if info.run_id != prov.run_id:
        problems.append(
            f"it belongs to run {info.run_id} ({info.study}/{info.run_name}), this is run "
            f"{prov.run_id} ({prov.study}/{prov.run_name}); the run id hashes the resolved study "
            "config, so a changed config is a new run: give it its own trainer.checkpoint_dir, or start it "
            f"from that checkpoint with trainer.init.checkpoint: {info.path}"
        )
    if not same_layout(info, prov):
        problems.append(
            "it was saved with a different layout ("
            + ", ".join(f"{k}={a} vs now {b}" for k, a, b in layout_diff(info.layout, prov.layout))
            + f"; {info.world} ranks vs now {prov.world}): a run resumes with its own layout; to continue "
            f"under another one, start a run of that layout with trainer.init.checkpoint: {info.path}"
        )
    return problems


def resolve_source(path: str | Path) -> CheckpointInfo:
    """The complete checkpoint `path` names (a checkpoints directory: its `latest`; or one iter_N directory),
    checked without torch: every file the manifest lists is there with its size. Raises CheckpointError with
    one line naming the directory or file (an unfinished save has no manifest, or is an iter_N.tmp)."""
    p = Path(path)
    if p.name.endswith(".tmp") and parse_iter_name(p.name[:-4]) is not None:
        raise CheckpointError(f"{p}: an unfinished save (a .tmp directory is never a checkpoint)")
    if not p.is_dir():
        raise CheckpointError(f"{p}: no such checkpoint directory")
    if parse_iter_name(p.name) is not None:
        info = read_manifest(p)
    else:
        info = latest_checkpoint(p)
        if info is None:
            unfinished = sorted(c.name for c in p.iterdir() if c.is_dir() and c.name.startswith("iter_"))
            raise CheckpointError(
                f"{p}: no complete checkpoint"
                + (f" ({', '.join(unfinished)}: unfinished saves, without {MANIFEST})" if unfinished else "")
            )
    for rel, size in sorted(info.files.items()):
        f = info.path / rel
        if not f.is_file():
            raise CheckpointError(f"{f}: missing (listed in {info.path / MANIFEST})")
        if f.stat().st_size != size:
            raise CheckpointError(
                f"{f}: {f.stat().st_size} bytes, {info.path / MANIFEST} says {size} (truncated?)"
            )
    return info
