"""torchmetrics states of the evaluation protocols, for any kind of input.

Every state is a float64 sum reduced with ``sum`` across processes, so one process and N processes that see every
sample exactly once give the same value (up to float64 summation order). Each metric declares
``higher_is_better`` (torchmetrics' attribute: ``True``, ``False`` or ``None`` when neither direction is better);
where the direction depends on what is measured, one subclass per direction declares it (a positive perturbation
curve: lower is better; a negative one: higher is better), or the callback that names the result declares it for
its key (e.g. a share of relevance on the target object vs on the other object).
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from torch import Tensor
from torchmetrics import Metric


def f64(x: Any) -> Tensor:
    """``x`` as a detached float64 tensor."""
    return torch.as_tensor(x).detach().to(torch.float64)


class SumsMetric(Metric):
    """A metric whose states are float64 sums (zeros of ``shape``) reduced with ``sum`` (module docstring)."""

    full_state_update = False

    def add_sums(self, *names: str, shape: Tuple[int, ...] = ()) -> None:
        for name in names:
            self.add_state(name, default=torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")


class CleanAccuracy(SumsMetric):
    """Top-1 accuracy: float64 sums of correct predictions and of samples."""

    higher_is_better = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_sums("correct", "total")

    def update(self, logits: Tensor, labels: Tensor) -> None:
        self.correct += (logits.argmax(dim=-1) == labels).sum().to(torch.float64)
        self.total += float(labels.numel())

    def compute(self) -> Tensor:
        return self.correct / self.total if self.total > 0 else torch.tensor(float("nan"), dtype=torch.float64)


class PerStepMean(SumsMetric):
    """Mean over samples of a value per step (e.g. a probability drop per perturbation bin): float64 sums of the
    values ``[B, num_points]`` per step and of the number of samples."""

    higher_is_better: Optional[bool] = None
    #: the names of the two states: the sums of the values per step, the number of samples
    sum_names = ("total", "count")
    #: what ``update`` takes, for its error message
    values_name = "values"

    def __init__(self, num_points: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_points = int(num_points)
        self.add_sums(self.sum_names[0], shape=(self.num_points,))
        self.add_sums(self.sum_names[1])

    def update(self, values: Tensor) -> None:
        """``values``: ``[B, num_points]``."""
        if values.dim() != 2 or values.shape[1] != self.num_points:
            raise ValueError(f"expected {self.values_name} [B, {self.num_points}], got {tuple(values.shape)}")
        sums, count = self.sum_names
        setattr(self, sums, getattr(self, sums) + f64(values).sum(dim=0))
        setattr(self, count, getattr(self, count) + values.shape[0])

    def compute(self) -> Tensor:
        sums, count = (getattr(self, name) for name in self.sum_names)
        if count == 0:
            return torch.full((self.num_points,), float("nan"), dtype=torch.float64)
        return sums / count


class PerturbationCurve(PerStepMean):
    """Accuracy per perturbation step: ``update`` takes the correctness, bool ``[B, num_points]`` (column 0: the
    clean prediction); states: the correct predictions per step and the samples.

    The direction of its area depends on the test: :class:`PositivePerturbationCurve`,
    :class:`NegativePerturbationCurve` (:func:`perturbation_curve` picks one by direction).
    """

    sum_names = ("correct", "total")
    values_name = "correctness"


class PositivePerturbationCurve(PerturbationCurve):
    """Most relevant units removed first: a faithful map makes the accuracy drop early (lower is better)."""

    higher_is_better = False


class NegativePerturbationCurve(PerturbationCurve):
    """Least relevant units removed first: a faithful map keeps the accuracy up (higher is better)."""

    higher_is_better = True


def perturbation_curve(direction: str, num_points: int) -> PerturbationCurve:
    """The curve metric of a ``positive`` or ``negative`` perturbation test."""
    classes = {"positive": PositivePerturbationCurve, "negative": NegativePerturbationCurve}
    if direction not in classes:
        raise ValueError(f"unknown direction {direction!r}; choose one of {tuple(classes)}")
    return classes[direction](num_points)


class PooledPearson(SumsMetric):
    """Pearson correlation of two score tensors pooled over everything passed to ``update`` (float64 sums)."""

    higher_is_better = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_sums("sx", "sy", "sxx", "syy", "sxy", "n")

    def update(self, x: Tensor, y: Tensor) -> None:
        if x.shape != y.shape:
            raise ValueError(f"pearson: shapes differ {tuple(x.shape)} vs {tuple(y.shape)}")
        x, y = f64(x).flatten(), f64(y).flatten()
        self.sx += x.sum()
        self.sy += y.sum()
        self.sxx += (x * x).sum()
        self.syy += (y * y).sum()
        self.sxy += (x * y).sum()
        self.n += x.numel()

    def compute(self) -> Tensor:
        n = self.n
        cov = n * self.sxy - self.sx * self.sy
        var = (n * self.sxx - self.sx ** 2) * (n * self.syy - self.sy ** 2)
        if n < 2 or var <= 0:
            return torch.tensor(float("nan"), dtype=torch.float64)
        return cov / torch.sqrt(var)


class MeanOverImages(SumsMetric):
    """Mean of per-sample values (float64 sum and count); NaN values are skipped."""

    higher_is_better = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_sums("total", "count")

    def update(self, values: Tensor) -> None:
        values = f64(values).flatten()
        keep = ~torch.isnan(values)
        self.total += values[keep].sum()
        self.count += keep.sum()

    def compute(self) -> Tensor:
        if self.count == 0:
            return torch.tensor(float("nan"), dtype=torch.float64)
        return self.total / self.count
