"""How an image becomes encoder samples and LLM tokens (pure, torch-free): the one geometry of both sides of
the bridge (the LLM side reads the size from the image's header, the encoder side cuts the pixels), of
`data stats` and of the planner.

An image of h x w pixels (u = patch_size x downsample pixels per LLM token along a side, T = the tile side,
the encoder's image_size rounded down to a multiple of u):

- one piece (max_tiles 1, or max(h, w) <= image_size, or the grid below is 1 x 1): scaled down so that
  max(h, w) <= image_size (aspect kept, rounded), each side rounded down to a multiple of u (at least u):
  dynamic resolution, one encoder sample;
- tiled (max_tiles > 1 and the image larger than image_size): resized to cols*T x rows*T and cut into its
  cols x rows tiles of T x T (row-major), plus, when `thumbnail` is on, the whole image resized to T x T as
  one more encoder sample after them.

The grid is InternVL's `dynamic_preprocess` rule (https://github.com/OpenGVLab/InternVL,
internvl_chat/internvl/train/dataset.py: `find_closest_aspect_ratio`): among the grids cols x rows with
1 <= cols*rows <= max_tiles, ordered by tile count, the one whose aspect ratio cols/rows is closest to w/h;
on a tie the later (larger) grid wins when the image's area exceeds half of that grid's pixel area
(h*w > 0.5 * T^2 * cols * rows). Here the distances are compared exactly (fractions) and grids with the same
tile count are ordered by cols: a tie between two such grids never decides (1 x 1 is always closer).

Tokens: every encoder sample gives its family's token rule of its pixels (model/families/vit.py
`VisionFamily.tokens_for`), so a tiled image gives (cols*rows + thumbnail) x (T/u)^2 = tiles x (T/patch)^2 /
downsample^2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from mimo_jobs.model import families

MAX_TILES = 64  # a study's trainer.data.max_tiles at most


def grids(max_tiles: int) -> list[tuple[int, int]]:
    """The allowed (cols, rows), by tile count, then cols."""
    out = [(c, r) for c in range(1, max_tiles + 1) for r in range(1, max_tiles // c + 1)]
    return sorted(out, key=lambda g: (g[0] * g[1], g[0]))


def closest_grid(h: int, w: int, tile: int, max_tiles: int) -> tuple[int, int]:
    """(cols, rows) of an h x w image cut into tiles of `tile` px: InternVL's choice (module docstring)."""
    aspect = Fraction(w, h)
    best, best_diff = (1, 1), None
    for c, r in grids(max_tiles):
        diff = abs(aspect - Fraction(c, r))
        if best_diff is None or diff < best_diff:
            best, best_diff = (c, r), diff
        elif diff == best_diff and 2 * h * w > tile * tile * c * r:
            best = (c, r)
    return best


@dataclass(frozen=True)
class ImagePlan:
    """What one image becomes: cols x rows pieces of piece_h x piece_w px (1 x 1: the whole image at its
    target size), plus a piece_h x piece_w thumbnail when `thumbnail`."""

    cols: int
    rows: int
    piece_h: int
    piece_w: int
    thumbnail: bool
    tokens_per_piece: int

    @property
    def tiles(self) -> int:
        """Encoder samples of the image (the thumbnail included)."""
        return self.cols * self.rows + int(self.thumbnail)

    @property
    def tokens(self) -> int:
        return self.tiles * self.tokens_per_piece

    @property
    def resize_hw(self) -> tuple[int, int]:
        """The size the whole image is resized to before it is cut."""
        return self.rows * self.piece_h, self.cols * self.piece_w


@dataclass(frozen=True)
class ImageGeometry:
    patch_size: int
    image_size: int  # max side in pixels of one encoder sample
    channels: int = 3
    downsample: int = 1  # pixel shuffle: s x s patch tokens become one LLM token
    max_tiles: int = 1  # 1: never tile (dynamic resolution up to image_size)
    thumbnail: bool = False  # a tiled image also gives the whole image at tile size
    # the encoder's family (EncoderArch.kind), whose token rule counts each encoder sample and whose pixels'
    # mean/std the data path standardises with (model/families); not part of the geometry's identity
    family: str = field(default="clip", compare=False)
    # frames one patch spans in time (EncoderArch.temporal_patch_size): 1, the module embeds images only; a
    # video's frames go in groups of this many, each group one image's worth of tokens
    temporal: int = field(default=1, compare=False)

    def __post_init__(self):
        if not 1 <= self.max_tiles <= MAX_TILES:
            raise ValueError(f"max_tiles={self.max_tiles}: must be between 1 and {MAX_TILES}")

    @classmethod
    def of(cls, encoder, max_tiles: int = 1, thumbnail: bool = False) -> ImageGeometry:
        """The geometry of a model.arch.EncoderArch, with a study's tiling settings."""
        return cls(
            patch_size=encoder.patch_size,
            image_size=encoder.image_size,
            channels=encoder.channels,
            downsample=encoder.downsample,
            max_tiles=max_tiles,
            thumbnail=thumbnail,
            family=encoder.kind,
            temporal=encoder.temporal_patch_size,
        )

    @property
    def unit(self) -> int:
        """Pixels per LLM token along a side."""
        return self.patch_size * self.downsample

    @property
    def tile(self) -> int:
        """The side of a tile (and of the largest one-piece image), a multiple of the unit."""
        return max(self.unit, self.image_size // self.unit * self.unit)

    def tokens_of_pixels(self, h_px: int, w_px: int) -> int:
        """Tokens of one encoder sample already at its size (decoded pixels): its family's rule."""
        return families.vision(self.family).tokens_for(self, h_px, w_px)

    def tokens_of_decoded(self, shape: tuple[int, ...]) -> int:
        """Tokens of a decoded image: [C, H, W] (one piece) or [T, C, H, W] (T tiles)."""
        pieces = shape[0] if len(shape) == 4 else 1
        return pieces * self.tokens_of_pixels(shape[-2], shape[-1])

    def video_tokens(self, frames: int, h: int, w: int) -> int:
        """LLM tokens of a video of `frames` h x w frames: every frame one piece at dynamic resolution (a
        video is never tiled), one such piece's tokens per temporal group (EncoderArch.video_tokens)."""
        return self.video_tokens_of_pixels(frames, *self.target_hw(h, w))

    def video_tokens_of_pixels(self, frames: int, h_px: int, w_px: int) -> int:
        """Tokens of a video whose frames are already at their size (decoded pixels)."""
        from mimo_jobs.model.arch import frame_groups

        return frame_groups(frames, self.temporal) * self.tokens_of_pixels(h_px, w_px)

    def target_hw(self, h: int, w: int) -> tuple[int, int]:
        """The one-piece size of an h x w image."""
        p, m = self.unit, self.image_size
        if h < 1 or w < 1:
            raise ValueError(f"image of {h}x{w} pixels has no area")
        if max(h, w) > m:
            scale = m / max(h, w)
            h, w = max(1, round(h * scale)), max(1, round(w * scale))
        return max(p, h // p * p), max(p, w // p * p)

    def plan(self, h: int, w: int) -> ImagePlan:
        th, tw = self.target_hw(h, w)
        if self.max_tiles > 1 and max(h, w) > self.image_size:
            c, r = closest_grid(h, w, self.tile, self.max_tiles)
            if c * r > 1:
                t = self.tile
                return ImagePlan(c, r, t, t, self.thumbnail, self.tokens_of_pixels(t, t))
        return ImagePlan(1, 1, th, tw, False, self.tokens_of_pixels(th, tw))

    def tokens(self, h: int, w: int) -> int:
        """LLM tokens of an h x w image (all its encoder samples)."""
        return self.plan(h, w).tokens

    @property
    def max_pieces(self) -> int:
        """Encoder samples of the largest image: max_tiles tiles, plus the thumbnail when it has one."""
        return self.max_tiles + int(self.thumbnail and self.max_tiles > 1)

    @property
    def tile_tokens(self) -> int:
        """Tokens of one full-size encoder sample."""
        return self.tokens_of_pixels(self.tile, self.tile)

    @property
    def max_tokens(self) -> int:
        """Tokens of the largest image."""
        return self.max_pieces * self.tile_tokens
