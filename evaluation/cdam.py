"""Per-image pieces of the CDAM analyses (Brocki & Chung; PROTOCOLS.md section 6).

* :func:`sparsity_per_image`: share of entries with ``|s| < fraction * max(s)`` (CDAM's signed max, or ``max|s|``);
* :func:`mask_to_map`: object coverage of each map cell, the pixel mask pooled by area to a token grid (or a
  pixel map's size): token i carries the fraction ``c_i`` of its patch covered by the object;
* :func:`positive_share`: ``sum_i relu(s_i) c_i / sum_i relu(s_i)`` per image -- exactly the pixel share of the
  map upsampled by nearest-neighbour replication (CDAM's visualisation);
* :func:`pearson_per_image`: Pearson correlation of two maps per image.

The torchmetrics states that accumulate them are in :mod:`evaluation.metrics` (``PooledPearson``,
``MeanOverImages``); the callback is :class:`callbacks.cdam_analysis.CDAMAnalysis`.
"""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .metrics import f64


# ------------------------------------------------------------------------------------------ per-image pieces
def sparsity_per_image(scores: Tensor, fraction: float = 0.05, absolute_max: bool = False) -> Tensor:
    """Share of entries with ``|s| < fraction * max(s)`` per image (``max|s|`` when ``absolute_max``)."""
    s = f64(scores).flatten(1)
    peak = s.abs().amax(dim=1) if absolute_max else s.amax(dim=1)
    return (s.abs() < fraction * peak[:, None]).to(torch.float64).mean(dim=1)


def mask_to_map(mask: Tensor, map_shape: Tuple[int, ...], image_hw: Tuple[int, int]) -> Tensor:
    """Object coverage per map cell ``[B, *map_shape]`` (area pooling of the pixel mask ``[B, H, W]``).

    ``map_shape`` is ``(P,)`` for token maps (row-major grid with the image's aspect) or ``(h, w)``.
    """
    h_img, w_img = image_hw
    if len(map_shape) == 1:
        p = map_shape[0]
        # grid h x w with h / w == H / W and h * w == P
        h = int(round((p * h_img / w_img) ** 0.5))
        w = p // max(h, 1)
        if h * w != p or h_img % h or w_img % w:
            raise ValueError(f"cannot lay {p} tokens on a grid dividing a {h_img}x{w_img} mask")
    else:
        h, w = map_shape
        if h_img % h or w_img % w:
            raise ValueError(f"map {h}x{w} does not divide the {h_img}x{w_img} mask")
    cover = F.avg_pool2d(f64(mask)[:, None], kernel_size=(h_img // h, w_img // w))[:, 0]
    return cover.flatten(1) if len(map_shape) == 1 else cover


def positive_share(scores: Tensor, coverage: Tensor) -> Tensor:
    """Per image: sum(relu(s) * coverage) / sum(relu(s)); NaN where no score is positive."""
    pos = f64(scores).flatten(1).clamp_min(0)
    cov = coverage.flatten(1)
    total = pos.sum(dim=1)
    share = (pos * cov).sum(dim=1) / total.clamp_min(1e-300)
    return torch.where(total > 0, share, torch.full_like(share, float("nan")))


def pearson_per_image(x: Tensor, y: Tensor) -> Tensor:
    x, y = f64(x).flatten(1), f64(y).flatten(1)
    xc, yc = x - x.mean(dim=1, keepdim=True), y - y.mean(dim=1, keepdim=True)
    den = torch.sqrt((xc * xc).sum(1) * (yc * yc).sum(1))
    r = (xc * yc).sum(1) / den.clamp_min(1e-300)
    return torch.where(den > 0, r, torch.full_like(r, float("nan")))
