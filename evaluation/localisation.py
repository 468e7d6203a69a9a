"""Localisation of a map against a ground-truth region, per sample, no forward pass (PROTOCOLS-style notes:
``/work/shared/reference/metrics_catalogue.md`` section 2.C).

Every function takes scores ``[B, N]`` over *units* (pixels, patches or tokens), the ground truth ``truth`` bool
``[B, N]`` and ``valid`` bool ``[B, N]`` (the units that take part: every pixel; a text's content tokens) and
returns one float64 value per sample, NaN where the sample is skipped (no true unit, or, where the measure
divides by it, no relevance):

* :func:`pointing_hits` (Zhang et al. 2018, ECCV, "Top-down neural attention by excitation backprop", sec. 5.1;
  TorchRay's ``PointingGame.evaluate``): 1 if the map's maximum lies within ``tolerance`` units (Euclidean, strict
  ``<`` as TorchRay; inside the region always counts) of the region, else 0; the point is the **first** maximum
  in row-major order; an empty region is skipped (NaN: TorchRay's "0, not counted"; Quantus 0.6.0 scores it a
  hit);
* :func:`energy_pointing_game` (Wang et al. 2020, Score-CAM, sec. 5.2): the share of the **positive** relevance
  inside the region, Σ_in max(a, 0) / Σ max(a, 0);
* :func:`relevance_mass_accuracy` (Arras et al. 2022, CLEVR-XAI, eq. 1, as Quantus' ``RelevanceMassAccuracy``):
  Σ_in a / Σ a with the **signed** scores (it can leave [0, 1] where a map has negative scores);
* :func:`relevance_rank_accuracy` (Arras et al. 2022, eq. 2): with K = |region|, the share of the K top-scored
  units inside the region (equal scores ordered by unit index, lower first);
* :func:`localisation_auc` (ROC-AUC of the scores as a detector of the region's units; Fawcett 2006, as
  scikit-learn's ``roc_curve`` + ``auc``: tied scores count one half).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor


def _check(scores: Tensor, truth: Tensor, valid: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    if scores.dim() != 2 or truth.shape != scores.shape:
        raise ValueError(f"localisation: expected scores and truth of the same shape [B, N], got "
                         f"{tuple(scores.shape)} and {tuple(truth.shape)}")
    valid = torch.ones_like(truth, dtype=torch.bool) if valid is None else valid.bool()
    if valid.shape != scores.shape:
        raise ValueError(f"localisation: valid has shape {tuple(valid.shape)}, scores {tuple(scores.shape)}")
    return scores.detach().to(torch.float64), truth.bool() & valid, valid


def _nan_where(values: Tensor, skip: Tensor) -> Tensor:
    return torch.where(skip, torch.full_like(values, float("nan")), values)


def point_of(scores: Tensor, valid: Optional[Tensor] = None) -> Tensor:
    """The unit ``[B]`` of each sample's first maximum among its valid units (row-major order)."""
    scores = scores.detach().to(torch.float64)
    if valid is not None:
        scores = scores.masked_fill(~valid.bool(), float("-inf"))
    return scores.argmax(dim=1)


def pointing_hits(scores: Tensor, truth: Tensor, valid: Optional[Tensor] = None,
                  grid: Optional[Tuple[int, int]] = None, tolerance: float = 0.0) -> Tensor:
    """Pointing-game hit (1.0) or miss (0.0) per sample, NaN for an empty region (module docstring). ``grid``:
    the ``(h, w)`` layout of 2-D units (row-major) for a ``tolerance`` in units; ``None``: 1-D units (tokens),
    where only ``tolerance=0`` is defined."""
    scores, truth, valid = _check(scores, truth, valid)
    if tolerance < 0:
        raise ValueError(f"pointing game: tolerance must be >= 0, got {tolerance}")
    point = point_of(scores, valid)
    inside = truth.gather(1, point[:, None])[:, 0]
    if grid is None:
        if tolerance != 0:
            raise ValueError("pointing game: a tolerance needs 2-D units (a grid); token units take tolerance 0")
        hit = inside
    else:
        h, w = int(grid[0]), int(grid[1])
        if h * w != scores.shape[1]:
            raise ValueError(f"pointing game: grid {h}x{w} does not hold {scores.shape[1]} units")
        rows = torch.arange(h, dtype=torch.float64, device=scores.device).repeat_interleave(w)
        cols = torch.arange(w, dtype=torch.float64, device=scores.device).repeat(h)
        pr, pc = rows[point][:, None], cols[point][:, None]
        near = (rows[None] - pr) ** 2 + (cols[None] - pc) ** 2 < float(tolerance) ** 2
        hit = inside | (near & truth).any(dim=1)
    return _nan_where(hit.to(torch.float64), ~truth.any(dim=1))


def energy_pointing_game(scores: Tensor, truth: Tensor, valid: Optional[Tensor] = None) -> Tensor:
    """Share of the positive relevance inside the region (module docstring)."""
    scores, truth, valid = _check(scores, truth, valid)
    positive = scores.clamp(min=0) * valid
    total = positive.sum(dim=1)
    inside = (positive * truth).sum(dim=1)
    return _nan_where(inside / torch.where(total > 0, total, torch.ones_like(total)),
                      ~truth.any(dim=1) | (total <= 0))


def relevance_mass_accuracy(scores: Tensor, truth: Tensor, valid: Optional[Tensor] = None) -> Tensor:
    """Σ_in a / Σ a with signed scores (module docstring); NaN where Σ a = 0."""
    scores, truth, valid = _check(scores, truth, valid)
    scores = scores * valid
    total = scores.sum(dim=1)
    inside = (scores * truth).sum(dim=1)
    return _nan_where(inside / torch.where(total != 0, total, torch.ones_like(total)),
                      ~truth.any(dim=1) | (total == 0))


def relevance_rank_accuracy(scores: Tensor, truth: Tensor, valid: Optional[Tensor] = None) -> Tensor:
    """|top-K ∩ region| / K with K = |region| (module docstring)."""
    scores, truth, valid = _check(scores, truth, valid)
    k = truth.sum(dim=1)
    ranked = scores.masked_fill(~valid, float("-inf"))
    order = torch.sort(ranked, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
    hits = (truth & (rank < k[:, None])).sum(dim=1).to(torch.float64)
    return _nan_where(hits / k.clamp(min=1).to(torch.float64), k == 0)


def localisation_auc(scores: Tensor, truth: Tensor, valid: Optional[Tensor] = None) -> Tensor:
    """ROC-AUC of the scores against the region over the valid units; ties count 1/2 (module docstring); NaN
    where the valid units are all inside or all outside the region."""
    scores, truth, valid = _check(scores, truth, valid)
    out = torch.full((scores.shape[0],), float("nan"), dtype=torch.float64, device=scores.device)
    for i in range(scores.shape[0]):
        s, t = scores[i][valid[i]], truth[i][valid[i]]
        positives, negatives = int(t.sum()), int((~t).sum())
        if positives == 0 or negatives == 0:
            continue
        values, inverse, counts = torch.unique(s, return_inverse=True, return_counts=True)
        # the average rank (1-based) of each distinct value: ties share the mean of their ranks
        ends = torch.cumsum(counts, 0).to(torch.float64)
        mean_rank = ends - (counts.to(torch.float64) - 1) / 2
        rank_sum = mean_rank[inverse][t].sum()
        out[i] = (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)
    return out
