"""A ViT's learned position table at another resolution: the patch rows, a square grid, resampled bicubically
to the new grid, as transformers' `interpolate_pos_encoding` of SiglipVisionEmbeddings,
CLIPVisionEmbeddings and InternVLVisionEmbeddings does (`torch.nn.functional.interpolate(mode="bicubic",
align_corners=False)`); the class token's row (CLIP, InternViT) is kept apart, unchanged. Pure: torch only."""

from __future__ import annotations

import math

import torch


def square_side(rows: int) -> int | None:
    """The side of a square grid of `rows` patches, or None when `rows` is not a square."""
    side = math.isqrt(rows)
    return side if side * side == rows else None


def resample_positions(table: torch.Tensor, grid: int, class_rows: int = 0) -> torch.Tensor:
    """[class_rows + g*g, h] -> [class_rows + grid*grid, h]: the patch rows (row-major on a g x g grid)
    resampled to grid x grid. Computed in float32 (bicubic weights on bfloat16 rows would round twice) and
    returned in the table's dtype."""
    if table.dim() != 2 or table.shape[0] <= class_rows:
        raise ValueError(f"a position table is [rows, hidden] with patch rows, got {list(table.shape)}")
    head, patches = table[:class_rows], table[class_rows:]
    side = square_side(patches.shape[0])
    if side is None:
        raise ValueError(f"{patches.shape[0]} patch rows are not a square grid")
    if side == grid:
        return table.clone()
    h = patches.shape[1]
    x = patches.float().reshape(1, side, side, h).permute(0, 3, 1, 2)
    x = torch.nn.functional.interpolate(x, size=(grid, grid), mode="bicubic", align_corners=False)
    x = x.permute(0, 2, 3, 1).reshape(grid * grid, h).to(table.dtype)
    return torch.cat([head, x]) if class_rows else x
