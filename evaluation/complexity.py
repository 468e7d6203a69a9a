"""Complexity of a map, per sample, no forward pass (``metrics_catalogue.md`` section 2.D).

Each function takes scores ``[B, N]`` over units and ``valid`` bool ``[B, N]`` (the units that take part) and
returns float64 ``[B]``, computed on ``|a|`` (the magnitude: a strongly negative unit is as complex as a strongly
positive one, as Quantus' defaults ``abs=True``):

* :func:`sparseness`: the Gini index of the sorted ``|a|`` (Chalasani et al. 2020, ICML, "Concise explanations
  of neural networks using adversarial training", sec. 5: Σ_i (2i − n − 1) a_(i) / (n Σ a), a_(i) ascending);
  1 = one unit holds everything, 0 = uniform; higher is better (sparser). No offset is added (Quantus adds
  1e-7 to every unit: its value differs by O(1e-7 n / Σ|a|)); an all-zero map is NaN;
* :func:`complexity`: the Shannon entropy (natural log) of ``|a| / Σ|a|`` (Bhatt et al. 2020, IJCAI,
  "Evaluating and aggregating feature-based model explanations", eq. 4); lower is better; 0·log 0 = 0;
* :func:`effective_complexity`: the number of units with ``|a| > threshold · max|a|`` (Nguyen & Martínez 2020,
  "On quantitative aspects of model interpretability", sec. 3.3; the threshold relative to the map's maximum, as
  Quantus' ``normalise=True`` then ``eps``); lower is better.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def _magnitudes(scores: Tensor, valid: Optional[Tensor]) -> Tensor:
    if scores.dim() != 2:
        raise ValueError(f"complexity: expected scores [B, N], got {tuple(scores.shape)}")
    magnitude = scores.detach().to(torch.float64).abs()
    if valid is not None:
        if valid.shape != scores.shape:
            raise ValueError(f"complexity: valid has shape {tuple(valid.shape)}, scores {tuple(scores.shape)}")
        magnitude = magnitude * valid.bool()
    return magnitude


def sparseness(scores: Tensor, valid: Optional[Tensor] = None) -> Tensor:
    """Gini index of ``|a|`` over each sample's valid units (module docstring)."""
    magnitude = _magnitudes(scores, valid)
    n = (torch.ones_like(magnitude, dtype=torch.bool) if valid is None else valid.bool()).sum(dim=1)
    # invalid units hold 0 and sort first: the valid ones take ranks N - n + 1 ... N, shift them to 1 ... n
    ordered = torch.sort(magnitude, dim=1).values
    rank = (torch.arange(1, magnitude.shape[1] + 1, dtype=torch.float64, device=magnitude.device)[None]
            - (magnitude.shape[1] - n)[:, None])
    nf = n.to(torch.float64)
    total = ordered.sum(dim=1)
    gini = ((2 * rank - nf[:, None] - 1) * ordered).sum(dim=1) / (nf * torch.where(total > 0, total, 1.0))
    return torch.where(total > 0, gini, torch.full_like(gini, float("nan")))


def complexity(scores: Tensor, valid: Optional[Tensor] = None) -> Tensor:
    """Entropy of ``|a| / Σ|a|`` (module docstring)."""
    magnitude = _magnitudes(scores, valid)
    total = magnitude.sum(dim=1, keepdim=True)
    p = magnitude / torch.where(total > 0, total, 1.0)
    entropy = -torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum(dim=1)
    return torch.where(total[:, 0] > 0, entropy, torch.full_like(entropy, float("nan")))


def effective_complexity(scores: Tensor, valid: Optional[Tensor] = None, threshold: float = 1e-5) -> Tensor:
    """Number of units with ``|a| > threshold · max|a|`` (module docstring)."""
    if not 0 <= threshold < 1:
        raise ValueError(f"effective complexity: threshold must lie in [0, 1), got {threshold}")
    magnitude = _magnitudes(scores, valid)
    peak = magnitude.max(dim=1, keepdim=True).values
    count = (magnitude > threshold * peak).sum(dim=1).to(torch.float64)
    return torch.where(peak[:, 0] > 0, count, torch.full_like(count, float("nan")))
