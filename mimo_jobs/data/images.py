"""Image geometry and pixels, shared by both sides of the bridge.

The LLM side needs only the token count of an image (read from the header, no decode); the encoder side
needs the pixels. Both must agree exactly, so the geometry is one pure function here:

  (h, w) -> scale down so max(h, w) <= image_size (aspect kept, rounded) -> round each side down to a
  multiple of u = patch_size * downsample (at least one) -> tokens = (H/u) * (W/u)   (dynamic resolution)

The token count of an H x W image is the encoder's (mimo_jobs.model.arch.EncoderArch.tokens_for: patches,
then s x s pixel shuffle); the tests check the two agree for every preset.

Pixels: RGB (or L when channels == 1), resized to (H, W) when needed, float32 [C, H, W], standardized with
the CLIP per-channel mean/std (roughly zero mean, unit scale: the range of the trainer's mock images).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class ImageGeometry:
    patch_size: int
    image_size: int  # max side in pixels
    channels: int = 3
    downsample: int = 1  # pixel shuffle: s x s patch tokens become one LLM token

    @property
    def unit(self) -> int:
        """Pixels per LLM token along a side."""
        return self.patch_size * self.downsample

    def target_hw(self, h: int, w: int) -> tuple[int, int]:
        p, m = self.unit, self.image_size
        if h < 1 or w < 1:
            raise ValueError(f"image of {h}x{w} pixels has no area")
        if max(h, w) > m:
            scale = m / max(h, w)
            h, w = max(1, round(h * scale)), max(1, round(w * scale))
        return max(p, h // p * p), max(p, w // p * p)

    def tokens_of_pixels(self, h_px: int, w_px: int) -> int:
        """Tokens of an image already at its target size (the decoded pixels)."""
        return (h_px // self.unit) * (w_px // self.unit)

    def tokens(self, h: int, w: int) -> int:
        return self.tokens_of_pixels(*self.target_hw(h, w))

    @property
    def max_tokens(self) -> int:
        return (self.image_size // self.unit) ** 2


def geometry_of_preset(preset_name: str) -> ImageGeometry:
    from mimo_jobs.model.resolve import arch_of

    enc = arch_of(preset_name).encoder
    return ImageGeometry(
        patch_size=enc.patch_size, image_size=enc.image_size, channels=enc.channels, downsample=enc.downsample
    )


def header_size(data: bytes) -> tuple[int, int]:
    """(h, w) of an encoded image from its header, without decoding pixels; checks the file's integrity
    (PIL verify: chunk CRCs, truncation) so that both sides of the bridge reject the same broken images."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
        im.verify()
    return h, w


def decode(data: bytes, geom: ImageGeometry):
    """Encoded image -> float32 tensor [C, H, W] in [0, 1] at the geometry's target size."""
    import numpy as np
    import torch
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im = im.convert("L" if geom.channels == 1 else "RGB")
        th, tw = geom.target_hw(im.height, im.width)
        if (im.height, im.width) != (th, tw):
            im = im.resize((tw, th), Image.BILINEAR)
        arr = np.asarray(im, dtype=np.uint8)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    x = torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div_(255.0)
    c = x.shape[0]
    mean = torch.tensor(CLIP_MEAN[:c] if c == 3 else [sum(CLIP_MEAN) / 3]).view(c, 1, 1)
    std = torch.tensor(CLIP_STD[:c] if c == 3 else [sum(CLIP_STD) / 3]).view(c, 1, 1)
    return (x - mean) / std
