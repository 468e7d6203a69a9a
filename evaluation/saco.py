"""Salience-guided faithfulness coefficient, SaCo (Wu et al. 2024, CVPR, "On the faithfulness of vision
transformer explanations", Alg. 1; the authors published pseudo-code only, this follows it).

A sample's removable units are sorted by score, descending (equal scores by unit index), and cut into K groups
G_1 ... G_K of equal size (sizes differ by at most one where K does not divide the count, the larger first, as
``numpy.array_split``). With s_i = Σ_{u∈G_i} a_u and Δ_i = p(ŷ|x) − p(ŷ|x without G_i) (each group removed alone),
every pair i < j (s_i ≥ s_j) weighs w_ij = s_i − s_j, positive when the model agrees (Δ_i ≥ Δ_j) and negative
otherwise: F = Σ_{i<j} ±w_ij / Σ_{i<j} |w_ij| ∈ [−1, 1]; higher is better; NaN where every w_ij is 0 (a constant
map).
"""
from __future__ import annotations

import torch
from torch import Tensor


def saco_groups(scores: Tensor, removable: Tensor, groups: int) -> Tensor:
    """Group index ``[B, N]`` (0 = most salient, ``-1``: a unit that is not removable, or every unit of a sample
    with fewer removable units than groups) of every unit (module docstring)."""
    if groups < 2:
        raise ValueError(f"SaCo: groups must be >= 2, got {groups}")
    scores, removable = scores.detach().to(torch.float64), removable.bool()
    order = torch.sort(scores.masked_fill(~removable, float("-inf")), dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
    n = removable.sum(dim=1, keepdim=True)
    removable = removable & (n >= groups)      # a sample with fewer units than groups: no group (its SaCo is NaN)
    base, extra = n // groups, n % groups
    # the first `extra` groups hold base + 1 units: rank r falls in group r // (base + 1) there, else after them
    big = extra * (base + 1)
    group = torch.where(rank < big, rank // (base + 1), extra + (rank - big) // base.clamp(min=1))
    return torch.where(removable, group, torch.full_like(group, -1))


def saco(sums: Tensor, drops: Tensor) -> Tensor:
    """SaCo ``[B]`` from the group sums ``s`` and output drops ``Δ``, both ``[K, B]`` in group order."""
    s, d = sums.to(torch.float64), drops.to(torch.float64)
    k = s.shape[0]
    i, j = torch.triu_indices(k, k, offset=1)
    weight = s[i] - s[j]
    signed = torch.where(d[i] >= d[j], weight, -weight)
    total = weight.abs().sum(dim=0)
    return torch.where(total > 0, signed.sum(dim=0) / torch.where(total > 0, total, 1.0),
                       torch.full_like(total, float("nan")))
