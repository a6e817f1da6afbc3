"""`data prepare`: a LLaVA/ShareGPT-style JSONL file and its image folder -> an energon dataset the trainer
reads (imports energon: called inside the command only).

Each good record becomes one ConversationSample through samples.py's `conversation_images` loader: members
`<key>.json` ({"id": the record's id, "conversation": its turns}) and `<key>.0.<ext>`, `<key>.1.<ext>`, ...
(the image files' own bytes, in the record's order, which is the `<image>` markers' order). The key is the
record's line number (`l000000012`), unique and free of dots whatever the ids are. A record's videos
(`"video"`: its frames' image files, or a video file whose `video_frames` frames are sampled uniformly in
time: video_file.py) become `<key>.v0.0.<ext>`, `<key>.v0.1.<ext>`, ... (video 0's frames in time order,
then `v1`), each frame checked as an image is and all of one video's of one size.

The JSONL is read one line at a time and each sample is written as soon as it is read, so memory does not
grow with the file. Records are dealt to train/val/test so that after every record each split's count is
as close as can be to its share (exact to one sample, the same for the same file). A bad record (not JSON,
turns the task encoder would refuse, `<image>` markers that do not fit, an image that is missing, not a
file, unreadable, damaged or not PNG/JPEG/WebP: image_file.py) stops the command naming the file and
line, or with `skip_bad` is counted and listed in prepare.json. Everything is written into a staging folder
of this prepare's own beside OUT and renamed to OUT at the end: a failure leaves nothing at OUT.
"""

from __future__ import annotations

import json
import math
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DataError
from .image_file import image_member, video_members
from .llava import BadRecord, parse_record
from .shards import SPLITS, ShardWriter, prepare
from .synth import CONVERSATION
from .video_file import video_file_frames

MAX_LINE = 16 << 20  # bytes of one JSONL record: a record is text and image paths, never image data
MAX_VIDEO_FRAMES = 1024  # --video-frames: above Qwen2-VL's most (768 frames, qwen-vl-utils FPS_MAX_FRAMES)
LISTED_SKIPS = 100  # skipped records listed in prepare.json (all are counted)
MANIFEST = "prepare.json"


@dataclass(frozen=True)
class PrepareConfig:
    split: tuple[float, float, float] = (1.0, 0.0, 0.0)  # train, val, test shares (normalized)
    samples_per_shard: int = 1000
    skip_bad: bool = False
    n_mels: int = 80  # mel bins of the log-mel clips (the audio encoder's num_mel_bins; Whisper's 80 or 128)
    # frames sampled from each video file (video_file.py): 4 temporal groups at Qwen2-VL's temporal patch 2
    video_frames: int = 8

    def check(self) -> None:
        if len(self.split) != 3 or not all(math.isfinite(r) and r >= 0 for r in self.split):
            raise DataError(f"split {self.split}: three shares (train, val, test), each >= 0")
        if self.split[0] <= 0:
            raise DataError(f"split {self.split}: the train share must be above 0 (the trainer reads train)")
        total = sum(self.split)
        if not math.isfinite(total) or not all(math.isfinite(r / total) for r in self.split):
            raise DataError(f"split {self.split}: the shares' sum is not a finite number; give e.g. 8,1,1")
        if not 1 <= self.n_mels <= 512:
            raise DataError(f"--n-mels={self.n_mels}: mel bins from 1 to 512 (Whisper reads 80 or 128)")
        if not 1 <= self.video_frames <= MAX_VIDEO_FRAMES:
            raise DataError(
                f"--video-frames={self.video_frames}: frames sampled per video file, from 1 to "
                f"{MAX_VIDEO_FRAMES} (Qwen2-VL samples at most 768)"
            )
        if self.samples_per_shard < 1:
            raise DataError(f"samples per shard = {self.samples_per_shard}: need at least 1")

    @property
    def shares(self) -> tuple[float, ...]:
        total = sum(self.split)
        return tuple(r / total for r in self.split)


@dataclass
class PrepareResult:
    root: Path
    samples: dict[str, int]  # per split
    shards: dict[str, list[str]]
    images: int = 0
    audio: int = 0  # audio clips written
    videos: int = 0  # videos written (each its frames)
    unknown_keys: dict[str, int] = field(default_factory=dict)  # record keys nothing reads -> records
    skipped: int = 0
    skipped_lines: list[dict] = field(default_factory=list)  # the first LISTED_SKIPS: {line, reason}

    @property
    def total(self) -> int:
        return sum(self.samples.values())


def parse_split(text: str) -> tuple[float, float, float]:
    """'8,1,1' or '0.98,0.01,0.01' -> (train, val, test) shares."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 3:
        raise DataError(f"--split {text!r}: write three shares train,val,test, e.g. 0.98,0.01,0.01 or 8,1,1")
    return values  # type: ignore[return-value]


def deal(counts: dict[str, int], shares: tuple[float, ...]) -> str:
    """The split the next record goes to: the one furthest below its share of the records so far plus one
    (ties to the earlier of train, val, test)."""
    n = sum(counts.values()) + 1
    return max(SPLITS, key=lambda s: (shares[SPLITS.index(s)] * n - counts[s], -SPLITS.index(s)))


def _lines(jsonl: Path, progress: Callable[[int], None]):
    """(line number, text) of every non-blank line, read one at a time; a line that is not UTF-8 or longer
    than MAX_LINE comes as a BadRecord instead of its text."""
    with jsonl.open("rb") as f:
        n = 0
        while True:
            raw = f.readline(MAX_LINE + 1)
            if not raw:
                return
            n += 1
            size = len(raw)
            if len(raw) > MAX_LINE and not raw.endswith(b"\n"):
                while True:  # the rest of the over-long line
                    more = f.readline(1 << 20)
                    size += len(more)
                    if not more or more.endswith(b"\n"):
                        break
                progress(size)
                yield n, BadRecord(f"longer than {MAX_LINE >> 20} MiB; a record holds text and image paths")
                continue
            progress(size)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield n, BadRecord(f"not UTF-8 text (byte {e.start})")
                continue
            if text.strip():
                yield n, text


def check_paths(jsonl: Path, images: Path, out: Path) -> None:
    """The inputs exist and OUT is free (nothing read or written yet)."""
    if not jsonl.exists():
        raise DataError(f"{jsonl}: no such file")
    if not jsonl.is_file():
        raise DataError(f"{jsonl}: not a regular file (give the JSONL file)")
    if not images.is_dir():
        raise DataError(f"--images {images}: not a directory (the folder the records' image paths start at)")
    if out.is_symlink():  # the staging folder is renamed onto OUT at the end, which a symlink cannot take
        raise DataError(f"--out {out}: a symlink (to {out.resolve()}); give the directory itself")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "a file" if not out.is_dir() else "not empty"
        raise DataError(f"--out {out}: {what}; give a new or empty directory")


def prepare_jsonl(
    jsonl: Path,
    images: Path,
    out: Path,
    cfg: PrepareConfig = PrepareConfig(),
    progress: Callable[[int], None] | None = None,
) -> PrepareResult:
    """Write the energon dataset of `jsonl` at `out`. `progress(n)` is called with the bytes of each line
    read. DataError on bad input (a bad record names the file and line unless cfg.skip_bad)."""
    cfg.check()
    check_paths(jsonl, images, out)
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    # A folder of this prepare's own: another prepare into the same OUT, running or later, never touches it.
    stage = out.parent / f".{out.name}.prepare-staging-{uuid.uuid4().hex[:12]}"
    stage.mkdir()  # the umask's permissions, as OUT would have had
    try:
        res = _write(jsonl, images, stage, cfg, progress or (lambda n: None))
        if out.exists():
            out.rmdir()  # empty (checked above)
        stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    res.root = out
    return res


def _clips(folder: Path, rec, cfg: PrepareConfig) -> list[bytes]:
    """The record's audio clips as `.npy` members (data/audio_input.py reads and converts them)."""
    if not rec.audio:
        return []
    from mimo_jobs.model.families.whisper import MelFeatures

    from .audio_input import AudioFileError, record_clip

    try:
        return [record_clip(folder, rel, MelFeatures(n_mels=cfg.n_mels)) for rel in rec.audio]
    except AudioFileError as e:
        raise BadRecord(str(e)) from None


def _video(folder: Path, v: int, video, cfg: PrepareConfig) -> list[tuple[str, bytes]]:
    """The record's video `v` as (member extension, bytes) frames: its frame files, or (a str) a video
    file's `cfg.video_frames` frames sampled uniformly in time."""
    if not isinstance(video, str):
        return video_members(folder, v, video)
    try:
        return video_file_frames(folder, video, cfg.video_frames)
    except BadRecord as e:
        raise BadRecord(f"video {v}: {e}") from None


def _write(jsonl: Path, images: Path, stage: Path, cfg: PrepareConfig, progress) -> PrepareResult:
    res = PrepareResult(stage, {s: 0 for s in SPLITS}, {s: [] for s in SPLITS})
    writers = {s: ShardWriter(stage, s, cfg.samples_per_shard) for s in SPLITS}
    try:
        for n, line in _lines(jsonl, progress):
            try:
                if isinstance(line, BadRecord):
                    raise line
                rec = parse_record(line)
                members = [image_member(images, rel) for rel in rec.images]
                clips = _clips(images, rec, cfg)
                videos = [_video(images, v, x, cfg) for v, x in enumerate(rec.videos)]
            except BadRecord as e:
                if not cfg.skip_bad:
                    raise DataError(f"{jsonl}:{n}: {e} (or give --skip-bad to skip bad records)") from None
                res.skipped += 1
                if len(res.skipped_lines) < LISTED_SKIPS:
                    res.skipped_lines.append({"line": n, "reason": str(e)})
                continue
            files = {"json": json.dumps({"id": rec.id, "conversation": rec.conversations}).encode()}
            files |= {f"{j}.{ext}": data for j, (ext, data) in enumerate(members)}
            files |= {f"{j}.npy": data for j, data in enumerate(clips)}
            files |= {
                f"v{v}.{f}.{ext}": data
                for v, frames in enumerate(videos)
                for f, (ext, data) in enumerate(frames)
            }
            split = deal(res.samples, cfg.shares)
            writers[split].add(f"l{n:09d}", files)
            res.samples[split] += 1
            res.images += len(members)
            res.audio += len(clips)
            res.videos += len(videos)
            for k in rec.unknown:
                res.unknown_keys[k] = res.unknown_keys.get(k, 0) + 1
    finally:
        for s, w in writers.items():
            res.shards[s] = w.close()
    if not res.total:
        raise DataError(f"{jsonl}: no record could be prepared ({res.skipped} skipped as bad)")
    if not res.samples["train"]:
        raise DataError(
            f"{jsonl}: the train split got none of the {res.total} record(s) (shares "
            f"{', '.join(f'{r:.3g}' for r in cfg.shares)}); raise the train share (the trainer reads train)"
        )
    shards = [name for s in SPLITS for name in res.shards[s]]
    prepare(stage, shards, {"sample_type": CONVERSATION["sample_type"]}, res.shards, "conversation_images")
    manifest = {
        "source": str(jsonl.resolve()),
        "images": str(images.resolve()),
        "split": dict(zip(SPLITS, cfg.shares, strict=True)),
        "samples_per_shard": cfg.samples_per_shard,
        "samples": res.samples,
        "images_written": res.images,
        "audio_written": res.audio,
        "videos_written": res.videos,
        "unknown_keys": res.unknown_keys,
        "skipped": res.skipped,
        "skipped_lines": res.skipped_lines,
    }
    (stage / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return res
