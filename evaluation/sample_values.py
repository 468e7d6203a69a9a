"""Per-sample values as torchmetrics states: the metrics whose result is a mean over samples and whose per-sample
values go into the run's sidecar.

:class:`SampleValues` keeps, for every sample seen, its dataset index, a float64 row of ``width`` values (NaN: the
sample is skipped for that value) and an integer group (e.g. its class), as list states reduced with ``cat``.
:meth:`SampleValues.compute` returns them gathered and **sorted by index**, so every aggregate computed from them
(a mean over the non-NaN values in float64, a mean of per-class means) sums in the same order on one process and
on several: the numbers are identical, not only close.
"""
from __future__ import annotations

from typing import Any, Tuple

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from .metrics import SumsMetric, f64


class SampleValues(Metric):
    """Index, values ``[N, width]`` and group of every sample (module docstring)."""

    full_state_update = False
    higher_is_better = None

    def __init__(self, width: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.width = int(width)
        self.add_state("index", default=[], dist_reduce_fx="cat")
        self.add_state("values", default=[], dist_reduce_fx="cat")
        self.add_state("groups", default=[], dist_reduce_fx="cat")

    def update(self, index: Tensor, values: Tensor, groups: Any = None) -> None:
        """``index`` ``[B]`` (dataset indices), ``values`` ``[B]`` or ``[B, width]``, ``groups`` ``[B]`` (default 0)."""
        index = torch.as_tensor(index).detach().long().reshape(-1)
        values = f64(values).reshape(index.shape[0], -1)
        if values.shape[1] != self.width:
            raise ValueError(f"expected values [B={index.shape[0]}, {self.width}], got {tuple(values.shape)}")
        groups = torch.zeros_like(index) if groups is None else torch.as_tensor(groups).detach().long().reshape(-1)
        if groups.shape != index.shape:
            raise ValueError(f"expected groups [B={index.shape[0]}], got {tuple(groups.shape)}")
        self.index.append(index.to(self.device))
        self.values.append(values.to(self.device))
        self.groups.append(groups.to(self.device))

    def compute(self) -> Tuple[Tensor, Tensor, Tensor]:
        """``(index [N], values [N, width], groups [N])`` sorted by index; a repeated index is an error."""
        # a list of tensors on one process; torchmetrics' sync replaces it by their concatenation across processes
        if isinstance(self.index, list) and not self.index:
            empty = torch.zeros(0, dtype=torch.long)
            return empty, torch.zeros(0, self.width, dtype=torch.float64), empty
        index, values, groups = (dim_zero_cat(s) for s in (self.index, self.values, self.groups))
        index, order = torch.sort(index.reshape(-1), stable=True)
        if index.numel() > 1 and bool((index[1:] == index[:-1]).any()):
            again = index[1:][index[1:] == index[:-1]].unique()[:5].tolist()
            raise ValueError(f"samples {again} (dataset index) were scored twice: a sampler repeated them "
                             "(use datamodules.unrepeated)")
        return index, values.reshape(-1, self.width)[order], groups.reshape(-1)[order]

    def gathered(self) -> Tuple[Tensor, Tensor, Tensor]:
        """:meth:`compute` with its shapes kept: ``(index [N], values [N, width], groups [N])`` (torchmetrics squeezes
        a one-element result to 0-d)."""
        index, values, groups = self.compute()
        return index.reshape(-1), values.reshape(-1, self.width), groups.reshape(-1)


def nan_mean(values: Tensor) -> Tensor:
    """Mean of the non-NaN entries of each column of ``values`` ``[N, X]`` (float64; NaN where none)."""
    keep = ~torch.isnan(values)
    count = keep.sum(dim=0)
    total = torch.where(keep, values, torch.zeros_like(values)).sum(dim=0)
    return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, float("nan")))


def class_mean(values: Tensor, groups: Tensor) -> Tensor:
    """Mean over the groups (classes) of each group's mean of the non-NaN ``values`` ``[N]``; groups with no
    value left out (TorchRay's pointing game instead averages over every class of the dataset, 0 for a class
    never seen)."""
    keep = ~torch.isnan(values)
    means = [values[keep & (groups == g)].mean() for g in torch.unique(groups[keep]).tolist()]
    if not means:
        return torch.tensor(float("nan"), dtype=torch.float64)
    return torch.stack(means).mean()


class Count(SumsMetric):
    """A float64 count summed across processes (e.g. a test's forward passes: model inputs evaluated)."""

    higher_is_better = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_sums("total")

    def update(self, amount: float) -> None:
        self.total += float(amount)

    def compute(self) -> Tensor:
        return self.total.clone()
