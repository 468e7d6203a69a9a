"""Propagating per-block token-to-token matrices through the residual stream: the two compositions in use.

* :func:`rollout` (Abnar & Zuidema 2020, eq. 1; Chefer et al. 2021a eq. 13): ``(M_{L-1} + I) ... (M_s + I)``,
  each factor optionally divided by its row sums after the identity is added;
* :func:`accumulate_residual` (Chefer et al. 2021b eq. 6; Chen et al. 2023's perception): ``R = I`` and, for
  each block in forward order, ``R = R + M_l R``.

They agree in exact arithmetic without row normalisation; each keeps the reference's own float order.
:func:`rollout_readout` is :func:`rollout` followed by a read-out of its rows, as vector-matrix products.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from .readout import identity_like


def rollout(matrices: Sequence[Tensor], row_normalize: bool) -> Tensor:
    """``[B, N, N]``: the product ``M'_{last} ... M'_{first}`` of ``M' = M + I`` (row-normalised if asked)."""
    joint = None
    for m in matrices:
        m = m + torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
        if row_normalize:
            m = m / m.sum(dim=-1, keepdim=True)
        joint = m if joint is None else m @ joint
    if joint is None:
        raise ValueError("rollout needs at least one block")
    return joint


def rollout_readout(matrices: Sequence[Tensor], row_normalize: bool, read: Callable[[Tensor], Tensor]) -> Tensor:
    """``read(rollout(matrices, row_normalize))`` ``[B, N]`` for a read-out ``read`` that combines the rows of a
    ``[B, N, N]`` matrix (a row, or a weighted mean of rows: :func:`methods.readout.read_out`), computed as
    ``read(M'_last) M'_{last-1} ... M'_first``: vector-matrix products instead of matrix products (``N``
    times fewer operations). Equal to the read-out of :func:`rollout` up to float rounding (the products are
    associated differently)."""
    factors = []
    for m in matrices:
        m = m + torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
        if row_normalize:
            m = m / m.sum(dim=-1, keepdim=True)
        factors.append(m)
    if not factors:
        raise ValueError("rollout needs at least one block")
    row = read(factors[-1])
    for m in reversed(factors[:-1]):
        row = torch.bmm(row[:, None, :], m)[:, 0]
    return row


def accumulate_residual(matrices: Sequence[Tensor]) -> Tensor:
    """``[B, N, N]``: ``R = I``, then ``R = R + M R`` for each matrix in forward order (no normalisation)."""
    matrices = list(matrices)
    if not matrices:
        raise ValueError("accumulate_residual needs at least one block")
    relevance = identity_like(matrices[0].shape[0], matrices[0].shape[-1], matrices[0])
    for m in matrices:
        relevance = relevance + m @ relevance
    return relevance
