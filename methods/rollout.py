"""Propagating per-block token-to-token matrices through the residual stream: the two compositions in use.

* :func:`rollout` (Abnar & Zuidema 2020, eq. 1; Chefer et al. 2021a eq. 13): ``(M_{L-1} + I) ... (M_s + I)``,
  each factor optionally divided by its row sums after the identity is added;
* :func:`accumulate_residual` (Chefer et al. 2021b eq. 6; Chen et al. 2023's perception): ``R = I`` and, for
  each block in forward order, ``R = R + M_l R``.

They agree in exact arithmetic without row normalisation; each keeps the reference's own float order.

Token flow (a hierarchical model, Swin): where the tokens entering block ``l`` are formed from those leaving block
``l - 1`` by a transition ``T_l`` (``[N_l, N_{l-1}]``, :meth:`~methods.adapters.TokenFlow.transition`; ``None``
is the identity, every isotropic family), the streaming composers pull their row through it (``through``:
``r <- r T_l``, rows of ``T_l`` summing to 1, so a row-stochastic product stays one), and the finished row, in the
first composed block's token space, is carried up to the read-out's by summing each token's sources
(:func:`carry_to_readout_space`: the total is kept). With every transition the identity nothing changes.
:func:`rollout_readout` is :func:`rollout` followed by a read-out of its rows, as vector-matrix products.

Streaming (the methods that report only the read-out row): :class:`ReadoutRollout` and :class:`ReadoutResidual`
compose the read-out row of either product one block at a time, **from the last block down** (the order in
which the gradients and the LRP relevance reach the blocks), so a caller folds each block's ``[B, N, N]`` matrix
in as soon as it is known and drops it: one block's matrix at a time and ``O(N^2)`` operations per block
instead of the full product's ``O(N^3)``. The read-out ``read`` combines rows linearly (a row, or a weighted
mean of rows: :func:`methods.readout.read_out`), so ``read(M X) = read(M) X``: equal to the read-out of the full
product up to float rounding (the products are associated differently).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from .adapters import ModelAdapter
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
    times fewer operations; :class:`ReadoutRollout` over the matrices from the last down). Equal to the
    read-out of :func:`rollout` up to float rounding (the products are associated differently)."""
    composed = ReadoutRollout(row_normalize, read)
    for m in reversed(list(matrices)):
        composed.add(m)
    return composed.row()


def row_times(row: Tensor, m: Tensor) -> Tensor:
    """``row[b] @ m[b]`` for each sample (``[B, N]`` x ``[B, N, N]`` -> ``[B, N]``), in float64 (``row`` is kept
    in float64 by the composers below, and cast back once at the end). One product per sample, so a sample's row
    does not depend on the batch it is in; measured (2026-11-27, MKL, N = 17 to 2049), it is the same to the bit
    at 1 and 2 threads too (``tests/test_streaming.py``)."""
    return torch.stack([r @ mat.to(torch.float64) for r, mat in zip(row.to(torch.float64), m)])


def pull_through(row: Tensor, transition: Tensor) -> Tensor:
    """``row[b] @ T`` for each sample (``[B, N_l]`` x sparse ``[N_l, N_{l-1}]`` -> ``[B, N_{l-1}]``), in float64."""
    return torch.sparse.mm(transition.to(torch.float64).t(), row.to(torch.float64).t()).t()


def carry_to_readout_space(adapter: ModelAdapter, row: Tensor, first: int) -> Tensor:
    """A row ``[B, N_first]`` over the tokens entering block ``first``, carried through the transitions of the
    blocks above to the last block's tokens: each token gets the sum of its sources' entries (the support of
    ``T_l``). Unchanged where every transition is the identity."""
    for layer in range(first + 1, len(adapter.blocks)):
        transition = adapter.token_flow.transition(layer, row)
        if transition is not None:
            transition = transition.coalesce()
            support = torch.sparse_coo_tensor(transition.indices(), torch.ones_like(transition.values()),
                                              transition.shape, check_invariants=True)
            row = torch.sparse.mm(support.to(row.dtype), row.t()).t()
    return row


class ReadoutRollout:
    """The read-out row of :func:`rollout` composed from the last block down: ``add`` each block's matrix
    ``M_l`` ``[B, N, N]`` in the order ``l = last, last - 1, ..., first``; ``row()`` is
    ``read(M'_last) M'_{last-1} ... M'_first`` ``[B, N]`` with ``M' = M + I`` (divided by its row sums with
    ``row_normalize``). Holds the row only; ``add(m, overwrite=True)`` forms ``M'`` in ``m``'s storage."""

    def __init__(self, row_normalize: bool, read: Callable[[Tensor], Tensor]):
        self.row_normalize = row_normalize
        self.read = read
        self.dtype = torch.float32
        self._row: Optional[Tensor] = None

    def add(self, m: Tensor, overwrite: bool = False) -> None:
        if overwrite:
            m.diagonal(dim1=-2, dim2=-1).add_(1)
        else:
            m = m + torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
        if self.row_normalize:
            m = m.div_(m.sum(dim=-1, keepdim=True))
        if self._row is None:
            self.dtype = m.dtype
            self._row = self.read(m).to(torch.float64)
        else:
            self._row = row_times(self._row, m)

    def through(self, transition: Optional[Tensor]) -> None:
        """Pull the row through the transition into the block below (``None``: the identity, nothing to do)."""
        if transition is not None and self._row is not None:
            self._row = pull_through(self._row, transition)

    def row(self) -> Tensor:
        if self._row is None:
            raise ValueError("rollout needs at least one block")
        return self._row.to(self.dtype)


class ReadoutResidual:
    """The read-out row of :func:`accumulate_residual` composed from the last block down: start from
    ``read(I)`` (``start`` ``[B, N]``: :func:`methods.readout.read_out_identity`), ``add`` each block's matrix
    ``M_l`` in the order ``l = last, ..., first`` (``r <- r + r M_l``); ``row()`` is
    ``read((I + M_last) ... (I + M_first))``. Holds the row only."""

    def __init__(self, start: Tensor):
        self.dtype = start.dtype
        self._row = start.to(torch.float64)
        self.blocks = 0

    def add(self, m: Tensor) -> None:
        self._row = self._row + row_times(self._row, m)
        self.blocks += 1

    def through(self, transition: Optional[Tensor]) -> None:
        """Pull the row through the transition into the block below (``None``: the identity, nothing to do)."""
        if transition is not None:
            self._row = pull_through(self._row, transition)

    def row(self) -> Tensor:
        if not self.blocks:
            raise ValueError("accumulate_residual needs at least one block")
        return self._row.to(self.dtype)


def accumulate_residual(matrices: Sequence[Tensor]) -> Tensor:
    """``[B, N, N]``: ``R = I``, then ``R = R + M R`` for each matrix in forward order (no normalisation). For
    the methods that read more than the read-out row of ``R`` (Beyond Intuition's perception, which its reasoning
    feedback weights entry by entry); the read-out-row methods use :class:`ReadoutResidual`."""
    matrices = list(matrices)
    if not matrices:
        raise ValueError("accumulate_residual needs at least one block")
    relevance = identity_like(matrices[0].shape[0], matrices[0].shape[-1], matrices[0])
    for m in matrices:
        relevance = relevance + m @ relevance
    return relevance
