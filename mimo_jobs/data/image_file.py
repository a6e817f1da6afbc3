"""One image file a `data prepare` record names, checked before it becomes a training image.

Everything here is a property of the file alone, checked in the order that keeps a hostile file cheap: the
path (its length, and that it stays inside the image folder once symlinks are followed), then the file's
kind and size from stat (nothing read yet), then the bytes (at most MAX_BYTES of them), then the header
(format and pixel count: a decompression bomb is refused before any pixel is decoded), then every pixel
(a truncated JPEG decodes up to its end, and PIL's verify() checks nothing in a JPEG's scan data). Each
failure is a BadRecord naming the image and the rule, so `--skip-bad` skips the record.
"""

from __future__ import annotations

import io
import os
import stat
import warnings
from pathlib import Path

from .llava import BadRecord

FORMATS = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp"}  # what samples.NUMBERED_IMAGE reads
MAX_BYTES = 64 << 20  # one training image; far above any photo or scan an encoder is fed
MAX_PIXELS = 89_478_485  # PIL's own MAX_IMAGE_PIXELS default, above which it warns of a decompression bomb
PATH_MAX = 4096  # Linux limits (limits.h): a whole path, with its terminating NUL
NAME_MAX = 255  # one name in a path


def image_member(images: Path, rel: str) -> tuple[str, bytes]:
    """(member extension, bytes) of the image `rel` under the folder `images`; BadRecord when it cannot be
    a training image."""
    path = resolve_inside(images, rel)
    data = _read(path, rel)
    return FORMATS[_decode(data, path, rel)], data


def resolve_inside(images: Path, rel: str, what: str = "image") -> Path:
    """The real path of `rel` (an `what`'s path), which must stay inside `images` once every symlink is
    followed."""
    path = images / rel
    raw = os.fsencode(path)
    if len(raw) >= PATH_MAX or any(len(part) > NAME_MAX for part in raw.split(b"/")):
        raise BadRecord(
            f"{what} path of {len(rel):,} characters: a path is under {PATH_MAX} bytes, each name at most "
            f"{NAME_MAX}"
        )
    root = images.resolve()
    real = path.resolve()
    if not real.is_relative_to(root):
        raise BadRecord(
            f"{what} {rel!r}: {path} leads outside the image folder {root} (to {real}) by a symlink"
        )
    return real


def _read(path: Path, rel: str) -> bytes:
    """The file's bytes, its kind and size checked from stat before a byte is read."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise BadRecord(f"image {rel!r}: no such file {path}") from None
    except OSError as e:
        raise BadRecord(f"image {rel!r}: cannot read {path} ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):  # a directory, or a FIFO that would block the read
        raise BadRecord(f"image {rel!r}: {path} is not a regular file")
    too_big = f"image {rel!r}: {path} is over {MAX_BYTES >> 20} MiB; an image is at most that (resize it)"
    if st.st_size > MAX_BYTES:
        raise BadRecord(too_big)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)  # the file may have grown since stat
    except OSError as e:
        raise BadRecord(f"image {rel!r}: cannot read {path} ({e.strerror or e})") from None
    if len(data) > MAX_BYTES:
        raise BadRecord(too_big)
    return data


def _decode(data: bytes, path: Path, rel: str) -> str:
    """The image's format, after its pixel count, every pixel and PIL's integrity check (the one the task
    encoder makes)."""
    from PIL import Image, UnidentifiedImageError

    from .images import header_size

    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data)) as im:
                if im.format not in FORMATS:
                    raise BadRecord(
                        f"image {rel!r}: {path} is {im.format}; convert it to PNG or JPEG (or WebP)"
                    )
                w, h = im.size
                if w * h > MAX_PIXELS:
                    raise BadRecord(_bomb(rel, path, w, h))
                im.load()
                fmt = im.format
            header_size(data)
            return fmt
        except BadRecord:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            raise BadRecord(f"image {rel!r}: {path} is a decompression bomb ({e})") from None
        except UnidentifiedImageError:
            raise BadRecord(
                f"image {rel!r}: {path} is not an image PIL reads; convert it to PNG or JPEG (or WebP)"
            ) from None
        except Exception as e:  # noqa: BLE001 - PIL raises many types for a damaged file
            raise BadRecord(f"image {rel!r}: {path} is damaged ({type(e).__name__}: {e})") from None


def _bomb(rel: str, path: Path, w: int, h: int) -> str:
    return (
        f"image {rel!r}: {path} is {w}x{h} = {w * h:,} pixels, over {MAX_PIXELS:,} (a decompression bomb, "
        "or an image to resize first)"
    )


def video_members(images: Path, v: int, video) -> list[tuple[str, bytes]]:
    """(member extension, bytes) of each frame of a record's video `v` (its frames' paths under `images`,
    in time order), each checked as an image is and all of one size; BadRecord naming the video, the frame
    and the rule. A video file is video_file.py's."""
    from .images import header_size

    out, sizes = [], []
    for f, rel in enumerate(video):
        try:
            ext, data = image_member(images, rel)
        except BadRecord as e:
            raise BadRecord(f"video {v} frame {f}: {e}") from None
        out.append((ext, data))
        sizes.append(header_size(data))
        if sizes[-1] != sizes[0]:
            (h0, w0), (h, w) = sizes[0], sizes[-1]
            raise BadRecord(
                f"video {v} frame {f} {rel!r} is {h}x{w} px but frame 0 {video[0]!r} is {h0}x{w0}; a video's "
                "frames share one size (resize them alike)"
            )
    return out
