"""Turning token scores ``[B, P]`` into image maps ``[B, H, W]``."""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor


def minmax_normalize(maps: Tensor, eps: float = 0.0) -> Tensor:
    """Per-sample min-max normalisation over all but the first dimension.

    A constant map (max == min) becomes all zeros rather than NaN (the references divide by zero there).
    """
    flat = maps.reshape(maps.shape[0], -1)
    lo = flat.min(dim=1, keepdim=True).values
    hi = flat.max(dim=1, keepdim=True).values
    span = hi - lo
    scale = (span + eps).clamp_min(torch.finfo(flat.dtype).tiny)
    out = torch.where(span > 0, (flat - lo) / scale, torch.zeros_like(flat))
    return out.reshape(maps.shape)


def infer_grid(num_tokens: int, image_hw: Tuple[int, int] = (1, 1)) -> Tuple[int, int]:
    """The row-major ``h x w`` patch grid with ``h * w == num_tokens`` and the aspect ratio of an
    ``image_hw`` image (square by default); ``ValueError`` when there is none (then pass the grid)."""
    height, width = image_hw
    h = int(round(math.sqrt(num_tokens * height / width)))
    w = num_tokens // max(h, 1)
    if h < 1 or h * w != num_tokens:
        shape = "square grid" if height == width else f"grid with the aspect of a {height}x{width} image"
        raise ValueError(f"{num_tokens} token scores do not form a {shape}: pass grid_size=(h, w)")
    return h, w


def tokens_to_map(
    relevance: Tensor,
    grid_size: Optional[Tuple[int, int]] = None,
    patch_size: Union[int, Sequence[int], None] = None,
    image_size: Optional[Tuple[int, int]] = None,
    normalize: bool = False,
    mode: str = "bilinear",
) -> Tensor:
    """Reshape patch scores ``[B, P]`` (row-major grid order) to ``[B, h, w]`` and upsample to pixels.

    Upsampling is ``F.interpolate(..., mode, align_corners=False)`` by ``patch_size`` (the reference's
    ``scale_factor=16``) or to ``image_size``; ``normalize=True`` min-max normalises each sample separately
    (the references normalise the whole batch only because they run batch size 1).
    """
    if relevance.dim() != 2:
        raise ValueError(f"expected token scores of shape [B, P], got {tuple(relevance.shape)}")
    batch, num_patches = relevance.shape
    if grid_size is None:
        grid_size = infer_grid(num_patches)
    h, w = grid_size
    if h * w != num_patches:
        raise ValueError(f"grid {h}x{w} does not hold {num_patches} tokens")
    grid = relevance.reshape(batch, 1, h, w)
    if image_size is None and patch_size is not None:
        ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
        image_size = (h * ph, w * pw)
    if image_size is not None:
        kwargs = {"align_corners": False} if mode in ("bilinear", "bicubic") else {}
        grid = F.interpolate(grid, size=tuple(image_size), mode=mode, **kwargs)
    maps = grid[:, 0]
    return minmax_normalize(maps) if normalize else maps
