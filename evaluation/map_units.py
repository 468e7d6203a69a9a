"""A method's raw map on the units a catalogue metric counts: the image's patch grid or its pixels.

:func:`image_units`: ``patch``: token scores ``[B, P]`` as they are (row-major grid), a pixel-level map ``[B, H, W]``
summed per patch of the model's grid (relevance is additive: the patch holds its pixels' sum); ``pixel``: token
maps upsampled bilinearly (``align_corners=False``, as :mod:`evaluation.pixel_maps`) to the image size, raw values
(no min-max normalisation, which would shift a signed map). NaN scores are zeroed (as the segmentation protocol).
"""
from __future__ import annotations

from typing import Any, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from methods.maps import infer_grid, tokens_to_map

UNITS = ("patch", "pixel")


def image_units(rel: Tensor, image_hw: Tuple[int, int], layout: Any, unit: str) -> Tensor:
    """Raw scores ``[B, N]`` of a map on an image's ``patch`` grid (pixel maps summed per patch) or ``pixel``s."""
    height, width = int(image_hw[0]), int(image_hw[1])
    rel = torch.nan_to_num(rel.detach().to(torch.float64))
    grid = tuple(layout.grid) if layout is not None else None
    if unit == "pixel":
        if rel.dim() == 2:
            return tokens_to_map(rel, grid_size=grid or infer_grid(rel.shape[1], (height, width)),
                                 image_size=(height, width), mode="bilinear").flatten(1)
        if tuple(rel.shape[-2:]) != (height, width):
            rel = F.interpolate(rel[:, None], size=(height, width), mode="bilinear", align_corners=False)[:, 0]
        return rel.flatten(1)
    if rel.dim() == 2:
        return rel
    if grid is None or rel.shape[-2] % grid[0] or rel.shape[-1] % grid[1]:
        raise ValueError(f"a pixel map {tuple(rel.shape[-2:])} cannot be summed per patch of the grid {grid}; use "
                         "unit='pixel'")
    kh, kw = rel.shape[-2] // grid[0], rel.shape[-1] // grid[1]
    return (F.avg_pool2d(rel[:, None], (kh, kw))[:, 0] * (kh * kw)).flatten(1)
