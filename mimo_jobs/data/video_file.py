"""One video file a `data prepare` record names -> its frames sampled uniformly in time, as PNG bytes.

The file is read as data through PyAV (FFmpeg's libraries in-process; no subprocess, no ffmpeg command).
Checked in the order that keeps a hostile file cheap: the path (inside the image folder once symlinks are
followed), then kind and size from stat on the opened handle (nothing read yet), then the container and
its first video stream (a frame's pixel count before any frame is decoded), then every frame, counted up
to MAX_FRAMES. The sampled frames are stored exactly as a frame list's images are, so nothing downstream
tells the two forms apart. Each failure is a BadRecord naming the video file and the rule.

Sampling: `frames` indices spread evenly from the first frame to the last, `round(k * (T - 1) / (frames -
1))` for k = 0 .. frames-1 of a video of T frames (round half to even, as Python's round and torch's both
do) -- the index rule of Qwen2-VL's qwen-vl-utils (`torch.linspace(0, total_frames - 1, nframes).round()`
in `qwen_vl_utils/vision_process.py`). A fixed count, not a rate: every clip then gives the image module
the same number of temporal groups, which is what the planner prices per clip.
"""

from __future__ import annotations

import io
import os
import stat
from fractions import Fraction
from pathlib import Path

from .image_file import MAX_PIXELS, resolve_inside
from .llava import BadRecord

MAX_BYTES = 4 << 30  # one video file: far above a training clip (an hour of 1080p H.264 is ~2-3 GiB)
MAX_FRAMES = 1 << 18  # decoded frames: over 2 hours at 30 fps; bounds the decode time of a tiny-frame file


def sample_indices(total: int, frames: int) -> list[int]:
    """The `frames` frame indices of a `total`-frame video, evenly spread from the first to the last."""
    if frames == 1:
        return [0]
    return [round(Fraction(k * (total - 1), frames - 1)) for k in range(frames)]


def video_file_frames(images: Path, rel: str, frames: int) -> list[tuple[str, bytes]]:
    """("png", bytes) of each of the `frames` frames sampled from the video file `rel` under `images`, in
    time order, all of one size; BadRecord when the file cannot give them."""
    path = resolve_inside(images, rel, "video file")
    with _open(path, rel) as f:
        total = _count(f, path, rel)
        if total < frames:
            raise BadRecord(
                f"video file {rel!r}: {path} has {total} frame(s), fewer than the {frames} to sample "
                f"(--video-frames); give a longer clip or a smaller --video-frames"
            )
        f.seek(0)
        return _sampled(f, path, rel, sample_indices(total, frames))


def _open(path: Path, rel: str):
    """The file opened for reading, its kind and size checked on the handle (what is read is what was
    checked) before a byte is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    except FileNotFoundError:
        raise BadRecord(f"video file {rel!r}: no such file {path}") from None
    except OSError as e:
        raise BadRecord(f"video file {rel!r}: cannot read {path} ({e.strerror or e})") from None
    f = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        f.close()
        raise BadRecord(f"video file {rel!r}: {path} is not a regular file")
    if st.st_size > MAX_BYTES:
        f.close()
        raise BadRecord(
            f"video file {rel!r}: {path} is {st.st_size:,} bytes, over {MAX_BYTES:,} ({MAX_BYTES >> 30} GiB); "
            "a training clip is at most that (cut it into clips)"
        )
    return f


def _frames(f: io.BufferedReader, path: Path, rel: str):
    """Each decoded frame of the file's first video stream, in order; BadRecord for a file PyAV cannot read,
    one without a video stream, frames over MAX_PIXELS or more than MAX_FRAMES frames."""
    av = _av()
    try:
        with av.open(f, mode="r") as container:
            if not container.streams.video:
                kinds = ", ".join(s.type for s in container.streams) or "none"
                raise BadRecord(
                    f"video file {rel!r}: {path} has no video stream (its streams: {kinds}): not a video, "
                    "or one cut short or damaged"
                )
            stream = container.streams.video[0]
            if stream.codec_context is None:  # a truncated or damaged header names no codec
                raise BadRecord(
                    f"video file {rel!r}: {path} is damaged: its video stream names no codec PyAV decodes"
                )
            w, h = stream.codec_context.width, stream.codec_context.height
            if w * h > MAX_PIXELS:
                raise BadRecord(_too_many_pixels(rel, path, w, h))
            for i, frame in enumerate(container.decode(stream)):
                if i >= MAX_FRAMES:
                    raise BadRecord(
                        f"video file {rel!r}: {path} has over {MAX_FRAMES:,} frames; cut it into clips"
                    )
                if frame.width * frame.height > MAX_PIXELS:
                    raise BadRecord(_too_many_pixels(rel, path, frame.width, frame.height))
                yield frame
    except BadRecord:
        raise
    except Exception as e:  # noqa: BLE001 - FFmpeg raises many types for a damaged or foreign file
        raise BadRecord(
            f"video file {rel!r}: {path} is not a video PyAV reads, or is damaged ({type(e).__name__}: {e})"
        ) from None


def _count(f, path: Path, rel: str) -> int:
    """The frames the file decodes to (every frame decoded: a damaged one is found here)."""
    n = 0
    for _ in _frames(f, path, rel):
        n += 1
    if n == 0:
        raise BadRecord(f"video file {rel!r}: {path} decodes to no frame")
    return n


def _sampled(f, path: Path, rel: str, wanted: list[int]) -> list[tuple[str, bytes]]:
    """The frames at the indices `wanted` (ascending) as PNG bytes, all of one size."""
    keep = set(wanted)  # distinct: a clip has at least as many frames as are sampled, so steps are >= 1
    out: list[tuple[str, bytes]] = []
    size = None
    for i, frame in enumerate(_frames(f, path, rel)):
        if i not in keep:
            continue
        if size is None:
            size = (frame.height, frame.width)
        elif (frame.height, frame.width) != size:
            raise BadRecord(
                f"video file {rel!r}: frame {i} is {frame.height}x{frame.width} px but the first sampled "
                f"frame is {size[0]}x{size[1]}; a video's frames share one size"
            )
        buf = io.BytesIO()
        frame.to_image().save(buf, format="PNG")
        out.append(("png", buf.getvalue()))
        if len(out) == len(wanted):
            break
    if len(out) != len(wanted):  # the second pass decoded fewer frames than the first counted
        raise BadRecord(f"video file {rel!r}: {path} decoded differently twice (damaged)")
    return out


def _av():
    """PyAV, imported when a video file is decoded (the CLI starts without it)."""
    from .errors import DataError

    try:
        import av
    except ImportError:
        raise DataError(
            "a video file needs PyAV (`pip install av`, part of mimo-jobs[train]); or give the video as the "
            "list of its frames' image paths"
        ) from None
    return av


def _too_many_pixels(rel: str, path: Path, w: int, h: int) -> str:
    return (
        f"video file {rel!r}: {path} has {w}x{h} = {w * h:,}-pixel frames, over {MAX_PIXELS:,} (resize the "
        "video first)"
    )
