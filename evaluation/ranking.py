"""The removal order and the steps of a perturbation test, for any kind of input (PROTOCOLS.md sections 1, 2, 5).

A perturbation test removes *units* of an input (pixels of an image, tokens of a text) in the order of their
scores ``[B, N]`` (:func:`removal_ranks`; the ``negative`` direction ranks the negated scores), ``k = int(p * n)``
of them per fraction ``p`` (:func:`removal_counts`, :func:`removal_masks`), and re-classifies the input after each
step. This module knows nothing of what a unit is. Tie conventions (:data:`TIES`): ``index``: among equal scores
the smaller flat index first (in both directions); ``random``: among equal scores in the order of a tie-breaking
score map of the same shape (the random baseline's map of the sample, negated with the scores in the negative
direction), then by index.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import Tensor

DIRECTIONS = ("positive", "negative")
TIES = ("index", "random")


def direction_sign(direction: str) -> float:
    """``+1`` for ``positive`` (most relevant removed first), ``-1`` for ``negative``."""
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; choose one of {DIRECTIONS}")
    return 1.0 if direction == "positive" else -1.0


def removal_ranks(scores: Tensor, tie_breaker: Optional[Tensor] = None, removable: Optional[Tensor] = None) -> Tensor:
    """Rank of every unit in the removal order, ``[B, N]`` (0 = removed first); ``scores``: ``[B, ...]``.

    Descending, *stable* sort of the flattened scores: among equal values the smaller flat index comes first, or,
    with ``tie_breaker`` (scores of the same shape), the unit with the larger ``tie_breaker`` value (then the
    smaller flat index). With ``removable`` (bool, same shape), the units that may not be removed are ranked after
    every removable one (in the same order among themselves).
    """
    flat = scores.reshape(scores.shape[0], -1)
    if tie_breaker is None:
        order = torch.sort(flat, dim=1, descending=True, stable=True).indices
    else:
        breaker = tie_breaker.reshape(flat.shape).to(flat.device)
        first = torch.sort(breaker, dim=1, descending=True, stable=True).indices      # the order among ties
        order = first.gather(1, torch.sort(flat.gather(1, first), dim=1, descending=True, stable=True).indices)
    if removable is not None:
        kept = (~removable.reshape(flat.shape).to(device=flat.device, dtype=torch.bool)).to(torch.int8)
        order = order.gather(1, torch.sort(kept.gather(1, order), dim=1, stable=True).indices)
    ranks = torch.empty_like(order)
    positions = torch.arange(flat.shape[1], device=flat.device).expand_as(order)
    return ranks.scatter_(1, order, positions)


def removal_counts(fractions: Sequence[float], num_units: Union[int, Sequence[int], Tensor]) -> Tensor:
    """``k = int(p * n)`` for each fraction ``p`` (the references' truncation), as a ``LongTensor``:

    ``[S]`` when ``num_units`` is one number for the whole batch, ``[S, B]`` when it is one number per sample.
    """
    if isinstance(num_units, int):
        return torch.tensor([int(float(p) * num_units) for p in fractions], dtype=torch.long)
    lengths = [int(n) for n in (num_units.tolist() if isinstance(num_units, Tensor) else num_units)]
    return torch.tensor([[int(float(p) * n) for n in lengths] for p in fractions], dtype=torch.long).reshape(
        len(fractions), len(lengths))


def removal_masks(ranks: Tensor, counts: Tensor) -> Tensor:
    """``[S, B, N]`` bool: step ``s`` removes the units of rank ``< counts[s]`` (``counts`` ``[S]`` or ``[S, B]``)."""
    counts = torch.as_tensor(counts, device=ranks.device)
    if counts.dim() == 1:
        return ranks[None] < counts[:, None, None]
    if counts.dim() == 2 and counts.shape[1] == ranks.shape[0]:
        return ranks[None] < counts[:, :, None]
    raise ValueError(f"counts must be [S] or [S, B={ranks.shape[0]}], got {tuple(counts.shape)}")
