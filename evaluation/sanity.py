"""Similarity and complexity measures of the randomisation sanity checks (callbacks: :mod:`callbacks.sanity`).

* :func:`spearman_abs`: Spearman rank correlation of ``|a|`` and ``|b|`` per sample (average ranks for ties; the
  Pearson correlation of the ranks), Adebayo et al. 2018 (NeurIPS), sec. 3 "rank correlation (absolute value)";
* :func:`ssim`: the structural similarity index (Wang et al. 2004, IEEE TIP 13(4), eq. 13) of two ``[B, H, W]``
  maps, with a uniform ``win_size`` window, sample covariances (``N / (N - 1)``), ``K1 = 0.01``, ``K2 = 0.03``
  and the mean over the windows that lie inside the map (skimage's ``structural_similarity`` defaults; the maps
  are compared as ``|a| / max |a|``, so ``data_range`` = 1);
* :func:`topk_intersection`: the share of the ``k`` units of largest ``|a|`` that are also among the ``k`` largest
  ``|b|`` (Adebayo et al. 2018; ties broken by unit index);
* :func:`histogram_entropy`: Shannon entropy (natural log) of the 100-bin histogram of ``|a| / max |a|`` over
  [0, 1]: the complexity of eMPRT (Hedström et al. 2023, "Sanity checks revisited", TMLR, eq. 7), whose score is
  :func:`emprt` = ``(H(random) - H(original)) / H(original)``.

Every function works in float64 and returns one value per sample (NaN where a map is constant: no ranks, no
normalisation). ``valid`` masks (``[B, N]`` bool) keep the content units of a text map.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor


def _ranks(values: Tensor) -> Tensor:
    """Average ranks (1-based) of a 1-D tensor, ties sharing their mean rank."""
    unique, inverse, counts = torch.unique(values, sorted=True, return_inverse=True, return_counts=True)
    below = torch.cumsum(counts, 0) - counts                  # entries smaller than each distinct value
    mean_rank = below.to(torch.float64) + (counts.to(torch.float64) + 1) / 2
    return mean_rank[inverse]


def _pearson(x: Tensor, y: Tensor) -> float:
    x, y = x - x.mean(), y - y.mean()
    denominator = float(torch.sqrt((x * x).sum() * (y * y).sum()))
    return float((x * y).sum()) / denominator if denominator > 0 else float("nan")


def _rows(a: Tensor, b: Tensor, valid: Optional[Tensor]):
    a, b = a.detach().flatten(1).to(torch.float64).cpu(), b.detach().flatten(1).to(torch.float64).cpu()
    if a.shape != b.shape:
        raise ValueError(f"sanity: maps of shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be compared")
    keep = torch.ones_like(a, dtype=torch.bool) if valid is None else valid.flatten(1).bool().cpu()
    if keep.shape != a.shape:
        raise ValueError(f"sanity: valid mask {tuple(keep.shape)} does not match the maps {tuple(a.shape)}")
    for i in range(a.shape[0]):
        yield a[i][keep[i]].abs(), b[i][keep[i]].abs()


def spearman_abs(a: Tensor, b: Tensor, valid: Optional[Tensor] = None) -> Tensor:
    """``[B]`` Spearman rank correlation of ``|a|`` and ``|b|`` (module docstring)."""
    return torch.tensor([_pearson(_ranks(x), _ranks(y)) for x, y in _rows(a, b, valid)], dtype=torch.float64)


def topk_intersection(a: Tensor, b: Tensor, fraction: float, valid: Optional[Tensor] = None) -> Tensor:
    """``[B]`` share of the ``k = max(1, round(fraction * n))`` largest ``|a|`` units also among the largest
    ``|b|`` (module docstring)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"sanity: the top-k fraction must lie in (0, 1], got {fraction}")
    out = []
    for x, y in _rows(a, b, valid):
        k = max(1, int(round(fraction * x.numel())))
        top_x = set(torch.argsort(-x, stable=True)[:k].tolist())
        top_y = set(torch.argsort(-y, stable=True)[:k].tolist())
        out.append(len(top_x & top_y) / k)
    return torch.tensor(out, dtype=torch.float64)


def _normalised(maps: Tensor) -> Tensor:
    """``|a| / max |a|`` per sample (NaN for an all-zero map)."""
    magnitude = maps.detach().to(torch.float64).abs()
    peak = magnitude.flatten(1).amax(dim=1).clamp_min(0)
    peak = torch.where(peak > 0, peak, torch.full_like(peak, float("nan")))
    return magnitude / peak.view(-1, *([1] * (maps.dim() - 1)))


def ssim(a: Tensor, b: Tensor, win_size: int = 7, data_range: float = 1.0, normalise: bool = True) -> Tensor:
    """``[B]`` mean structural similarity of ``[B, H, W]`` maps (module docstring); ``normalise``: compare
    ``|a| / max |a|`` (data range 1), else the raw values with ``data_range``. ``win_size`` (odd) larger than the
    map is a ``ValueError``."""
    if a.dim() != 3 or a.shape != b.shape:
        raise ValueError(f"ssim: needs two [B, H, W] maps of one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if win_size < 2 or win_size % 2 == 0 or win_size > min(a.shape[-2:]):
        raise ValueError(f"ssim: win_size must be odd, >= 3 and at most the map's side {tuple(a.shape[-2:])}; "
                         f"got {win_size}")
    x = _normalised(a) if normalise else a.detach().to(torch.float64)
    y = _normalised(b) if normalise else b.detach().to(torch.float64)
    x, y = x[:, None].cpu(), y[:, None].cpu()
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    npix = win_size * win_size
    cov_norm = npix / (npix - 1)

    def mean(t: Tensor) -> Tensor:
        return F.avg_pool2d(t, win_size, stride=1)   # only the windows inside the map: skimage's cropped mean

    ux, uy = mean(x), mean(y)
    vx = cov_norm * (mean(x * x) - ux * ux)
    vy = cov_norm * (mean(y * y) - uy * uy)
    vxy = cov_norm * (mean(x * y) - ux * uy)
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
    return s.flatten(1).mean(dim=1)


def histogram_entropy(maps: Tensor, bins: int = 100, valid: Optional[Tensor] = None) -> Tensor:
    """``[B]`` Shannon entropy (nats) of the ``bins``-bin histogram of ``|a| / max |a|`` over [0, 1]."""
    flat = maps.detach().flatten(1)
    out = []
    for x, _ in _rows(flat, flat, valid):
        peak = float(x.max()) if x.numel() else 0.0
        if peak <= 0:
            out.append(float("nan"))
            continue
        counts = torch.histc(x / peak, bins=bins, min=0.0, max=1.0)
        p = counts[counts > 0] / counts.sum()
        out.append(float(-(p * p.log()).sum()))
    return torch.tensor(out, dtype=torch.float64)


def emprt(original: Tensor, randomised: Tensor, bins: int = 100, valid: Optional[Tensor] = None) -> Tensor:
    """``[B]`` eMPRT: relative rise of :func:`histogram_entropy` from the original map to the fully randomised
    model's map (higher: the map depends more on the parameters)."""
    before = histogram_entropy(original, bins, valid)
    after = histogram_entropy(randomised, bins, valid)
    return (after - before) / before
