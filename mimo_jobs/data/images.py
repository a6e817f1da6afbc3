"""Image pixels and the geometry both sides of the bridge share.

The LLM side needs only the token count of an image (read from the header, no decode); the encoder side
needs the pixels. Both must agree exactly, so the geometry is one pure rule,
`mimo_jobs.model.tiling.ImageGeometry` (re-exported here): an image is one piece at dynamic resolution, or,
with `max_tiles` > 1, larger images are cut into tiles of the encoder's image size plus an optional
thumbnail; each piece's tokens are the encoder family's count (model/families/vit.py `VisionFamily.tokens_for`).

Pixels: RGB (or L when channels == 1), resized as the geometry says, float32, rescaled and standardized
with the encoder family's per-channel mean/std, as its HuggingFace image processor does (model/families:
CLIP's OpenAI mean/std, SigLIP's 0.5/0.5, InternViT's ImageNet mean/std; roughly zero mean, unit scale: the
range of the trainer's mock images). A one-piece
image decodes to [C, H, W]; a tiled one to [T, C, tile, tile], its tiles row-major and then the thumbnail:
each of the T is one encoder sample, and the LLM sequence holds all their tokens in that order.
"""

from __future__ import annotations

import io

from mimo_jobs.model.tiling import ImageGeometry, ImagePlan

__all__ = [
    "ImageGeometry",
    "ImagePlan",
    "decode",
    "geometry_of_preset",
    "header_size",
    "image_module_of",
]


def pixels_of(kind: str):
    """The preprocessing (families.base.Pixels) of an encoder kind: its family's."""
    from mimo_jobs.model import families

    return families.vision(kind).pixels


def image_module_of(arch):
    """The encoder a model's images go to: its first module whose modality is "image" (beside it the model
    may have an audio one), or None when no module reads images (text-only or audio-only models)."""
    return next((e for e in arch.encoders.values() if e.modality == "image"), None)


def geometry_of_preset(model, max_tiles: int = 1, thumbnail: bool = False) -> ImageGeometry | None:
    """The geometry of a trainer.model value (a preset name or a description), with tiling settings; None
    when the model has no image module (a sample with an image is then refused)."""
    from mimo_jobs.model.resolve import arch_of

    enc = image_module_of(arch_of(model))
    return None if enc is None else ImageGeometry.of(enc, max_tiles, thumbnail)


def geometry_of_data(model, data) -> ImageGeometry | None:
    """The geometry a study's trainer.data (spec.DataSpec) trains with (None: no image module)."""
    return geometry_of_preset(model, getattr(data, "max_tiles", 1), getattr(data, "thumbnail", False))


def header_size(data: bytes) -> tuple[int, int]:
    """(h, w) of an encoded image from its header, without decoding pixels; checks the file's integrity
    (PIL verify: chunk CRCs, truncation) so that both sides of the bridge reject the same broken images."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
        im.verify()
    return h, w


def decode(data: bytes, geom: ImageGeometry):
    """Encoded image -> standardized float32 tensor: [C, H, W] at its one-piece size, or [T, C, t, t] tiles
    (row-major, then the thumbnail) when the geometry tiles it."""
    import numpy as np
    import torch
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im = im.convert("L" if geom.channels == 1 else "RGB")
        plan = geom.plan(im.height, im.width)
        rh, rw = plan.resize_hw
        whole = im if (im.height, im.width) == (rh, rw) else im.resize((rw, rh), Image.BILINEAR)
        ph, pw = plan.piece_h, plan.piece_w
        pieces = [
            whole.crop((c * pw, r * ph, (c + 1) * pw, (r + 1) * ph))
            for r in range(plan.rows)
            for c in range(plan.cols)
        ]
        if plan.thumbnail:
            pieces.append(im.resize((pw, ph), Image.BILINEAR))
        arrs = [np.asarray(p, dtype=np.uint8) for p in pieces]
    px = pixels_of(geom.family)
    x = torch.from_numpy(np.stack(arrs)).float().mul_(px.rescale)
    if x.ndim == 3:  # L images: [T, H, W]
        x = x.unsqueeze(-1)
    x = x.permute(0, 3, 1, 2)  # [T, C, H, W]
    c = x.shape[1]
    m, s = px.channels(c)
    mean, std = torch.tensor(m).view(1, c, 1, 1), torch.tensor(s).view(1, c, 1, 1)
    x = ((x - mean) / std).contiguous()
    return x if len(pieces) > 1 else x[0]
