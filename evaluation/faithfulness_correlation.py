"""Faithfulness correlation (Bhatt et al. 2020, IJCAI, "Evaluating and aggregating feature-based model
explanations", eq. 2): for R random subsets S_r of a sample's units, the Pearson correlation between the
attribution sums Σ_{i∈S_r} a_i and the output drops y(x) − y(x with S_r removed).

* :func:`draw_subsets`: the subsets of every sample, drawn from a ``numpy`` ``Generator`` (PCG64) seeded with
  ``SeedSequence([seed, sample index])``: a sample's subsets do not depend on its batch, its process or the other
  samples, and every method of a sample is scored on the same subsets (paired; Quantus draws new subsets for every
  call from the global ``np.random`` stream). Subset r is the first ``k`` units of the r-th permutation
  (``Generator.permuted``) of the sample's removable units;
* :func:`pearson_rows`: the correlation per sample (float64); NaN where either side is constant (e.g. a constant
  map: Pearson is undefined).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor


def subset_size(num_units: int, fraction: float) -> int:
    """``max(1, round(fraction · num_units))`` units (at most ``num_units``)."""
    return min(int(num_units), max(1, int(round(float(fraction) * int(num_units)))))


def draw_subsets(sample_ids: Sequence[int], removable: Tensor, runs: int, fraction: float, seed: int) -> Tensor:
    """Bool ``[R, B, N]``: the ``runs`` subsets of each sample (``removable`` bool ``[B, N]``: the units a subset may
    hold; ``k = subset_size(removable units, fraction)``), module docstring."""
    removable = removable.bool().cpu()
    b, n = removable.shape
    out = np.zeros((runs, b, n), dtype=bool)
    for i, sample in enumerate(int(s) for s in sample_ids):
        units = np.flatnonzero(removable[i].numpy())
        if units.size == 0:
            continue
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), sample]))
        chosen = rng.permuted(np.tile(units, (runs, 1)), axis=1)[:, : subset_size(units.size, fraction)]
        out[np.arange(runs)[:, None], i, chosen] = True
    return torch.from_numpy(out)


def pearson_rows(x: Tensor, y: Tensor) -> Tensor:
    """Pearson correlation of ``x[:, b]`` and ``y[:, b]`` for every column ``b`` of ``[R, B]`` (float64)."""
    x, y = x.to(torch.float64), y.to(torch.float64)
    dx, dy = x - x.mean(dim=0), y - y.mean(dim=0)
    denom = torch.sqrt((dx * dx).sum(dim=0) * (dy * dy).sum(dim=0))
    r = (dx * dy).sum(dim=0) / torch.where(denom > 0, denom, torch.ones_like(denom))
    return torch.where(denom > 0, r, torch.full_like(r, float("nan")))
