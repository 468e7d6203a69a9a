"""Raw relevance -> per-image min-max normalised pixel map, the first step of the image protocols.

PROTOCOLS.md sections 1 and 3: a token map ``[B, P]`` (row-major patch grid) is upsampled bilinearly with
``align_corners=False`` to the image size (``methods.tokens_to_map``; for a grid that divides the image this is
the reference's ``scale_factor=patch_size``) and min-max normalised **per sample**. A pixel-level map
``[B, h, w]`` is resized bilinearly (``align_corners=False``) only when its size differs from the image's, then
normalised the same way. A constant map normalises to all zeros (``methods.minmax_normalize``).

The patch grid of token scores is the model's layout (``grid_size``: ``layout.grid`` of the evaluation module's
outputs); without it, the grid with the image's aspect ratio is inferred from the number of scores.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from methods.maps import infer_grid, minmax_normalize, tokens_to_map


def pixel_maps(relevance: Tensor, image_hw: Tuple[int, int], grid_size: Optional[Tuple[int, int]] = None) -> Tensor:
    """``[B, H, W]`` maps in [0, 1], normalised per sample, at the image size ``image_hw`` (float32 or wider)."""
    height, width = int(image_hw[0]), int(image_hw[1])
    rel = relevance.detach()
    if not rel.dtype.is_floating_point or rel.dtype in (torch.float16, torch.bfloat16):
        rel = rel.float()
    if rel.dim() == 2:
        grid = grid_size or infer_grid(rel.shape[1], (height, width))
        maps = tokens_to_map(rel, grid_size=tuple(grid), image_size=(height, width), mode="bilinear")
    elif rel.dim() == 3:
        maps = rel
        if tuple(maps.shape[-2:]) != (height, width):
            maps = F.interpolate(maps[:, None], size=(height, width), mode="bilinear", align_corners=False)[:, 0]
    else:
        raise ValueError(f"relevance must be token scores [B, P] or pixel maps [B, H, W], got {tuple(rel.shape)}")
    if torch.isnan(maps).any():
        # the references zero NaNs (e.g. GradCAM on a dead head) before thresholding; do it explicitly
        maps = torch.nan_to_num(maps, nan=0.0)
    return minmax_normalize(maps)
