"""The one removal-curve mechanism: per-sample curves kept as gathered list states, and a keyed collection
(result key -> curve, with its x values and the summaries read from it).

A removal curve is, per sample, the score of the explained class after each step of a removal (or insertion)
order: ``[B, S]`` values at the x values of its grid. :class:`PerSampleCurves` keeps every sample's curve with its
dataset index (list states reduced by ``cat``): the mean curve and every summary are computed after the rows are
sorted by index, so one process and several give the same numbers, and the per-sample sidecar gets the rows.

Summaries of a curve ``y`` (``y[0]`` the start: the clean input, or the all-removed input of an insertion curve):

* ``auc`` under an integration rule (:data:`INTEGRATION_RULES`): ``trapezoid`` (``sum (x[i+1]-x[i]) (y[i] +
  y[i+1]) / 2`` over the curve's x), ``rise`` (Petsiuk et al. 2018, RISE's ``auc``: ``(sum y - y[0]/2 -
  y[n]/2) / n``, the trapezoid of equally spaced points on [0, 1]) or ``mean`` (mean of ``y[1:]``: grad-cam's and
  ROAD's average over the removal levels);
* ``aopc``: ``mean_k (y[0] - y[k])`` over ``k >= 1`` (Samek et al. 2017, signed); ``aopc_abs``: ``mean_k |y[0] -
  y[k]|`` (AttCAT's ``cal_aopc``); ``log_odds``: ``mean_k log(y[k] / y[0])`` (Shrikumar et al. 2017; DIG, AttCAT;
  probabilities only).

A curve may instead keep float64 sums whose ``compute`` is the mean curve (``CurveEntry(per_sample=False)``:
Chefer's accuracy curves, ERASER's drops): its summaries are then read from the mean curve, as those authors do.

A test (``callbacks.removal_curves``) declares its curves and the summaries it reports; this module knows nothing
of what was removed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torchmetrics import Metric

INTEGRATION_RULES = ("trapezoid", "rise", "mean")


def integrate(y: Tensor, x: Sequence[float], rule: str) -> Tensor:
    """Area of curves ``y`` ``[N, S]`` (float64) at ``x`` under ``rule`` (module docstring), ``[N]``."""
    if y.dim() != 2 or y.shape[1] != len(x) or len(x) < 2:
        raise ValueError(f"integrate: curves [N, {len(x)}] with at least 2 points expected, got {tuple(y.shape)}")
    if rule == "trapezoid":
        xs = torch.as_tensor([float(v) for v in x], dtype=torch.float64, device=y.device)
        return ((xs[1:] - xs[:-1]) * (y[:, 1:] + y[:, :-1]) / 2.0).sum(dim=1)
    if rule == "rise":
        n = y.shape[1] - 1
        return (y.sum(dim=1) - y[:, 0] / 2.0 - y[:, -1] / 2.0) / n
    if rule == "mean":
        return y[:, 1:].mean(dim=1)
    raise ValueError(f"unknown integration rule {rule!r}; choose one of {INTEGRATION_RULES}")


def aopc(y: Tensor) -> Tensor:
    """``mean_k (y[0] - y[k])``, ``k >= 1`` (signed AOPC), ``[N]``."""
    return (y[:, :1] - y[:, 1:]).mean(dim=1)


def aopc_abs(y: Tensor) -> Tensor:
    """``mean_k |y[0] - y[k]|`` (AttCAT's AOPC), ``[N]``."""
    return (y[:, :1] - y[:, 1:]).abs().mean(dim=1)


def log_odds(y: Tensor) -> Tensor:
    """``mean_k log(y[k] / y[0])`` of probabilities (log-odds of the explained class), ``[N]``."""
    if (y < 0).any():
        raise ValueError("log-odds needs probabilities (score='probability'); got negative scores")
    return (torch.log(y[:, 1:]) - torch.log(y[:, :1])).mean(dim=1)


class PerSampleCurves(Metric):
    """Every sample's curve ``[num_points]`` (float64) and dataset index, as list states gathered with ``cat``."""

    full_state_update = False
    higher_is_better: Optional[bool] = None

    def __init__(self, num_points: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_points = int(num_points)
        self.add_state("index", default=[], dist_reduce_fx="cat")
        self.add_state("values", default=[], dist_reduce_fx="cat")

    def update(self, index: Tensor, values: Tensor) -> None:
        """``index`` ``[B]`` (dataset indices), ``values`` ``[B, num_points]``."""
        if values.dim() != 2 or values.shape[1] != self.num_points or values.shape[0] != index.numel():
            raise ValueError(f"expected values [B={index.numel()}, {self.num_points}], got {tuple(values.shape)}")
        self.index.append(index.detach().reshape(-1).to(device=self.device, dtype=torch.long))
        self.values.append(values.detach().to(device=self.device, dtype=torch.float64))

    def compute(self) -> Tuple[Tensor, Tensor]:
        """``(indices [N], curves [N, num_points])`` sorted by index (after the gather across processes)."""
        index, values = self.index, self.values
        if isinstance(index, list):   # not gathered: no update on any process, or a single list
            index = torch.cat(index) if index else torch.zeros(0, dtype=torch.long)
            values = torch.cat(values) if values else torch.zeros(0, self.num_points, dtype=torch.float64)
        values = values.reshape(-1, self.num_points)
        order = torch.sort(index.reshape(-1), stable=True).indices
        return index.reshape(-1)[order].cpu(), values[order].cpu()


#: a summary of one curve: per-sample curves ``[N, S]`` and x -> per-sample values ``[N]``
Summary = Callable[[Tensor, Sequence[float]], Tensor]


@dataclass
class CurveEntry:
    """One curve of the collection: its metric, x values and the summaries reported from it
    (``{result key: (function, higher_is_better)}``).

    ``per_sample`` (default): the metric is a :class:`PerSampleCurves`, each summary is a mean over samples of
    the per-sample values. Otherwise the metric keeps sums whose ``compute`` is the mean curve ``[S]`` (e.g.
    :class:`evaluation.metrics.PerturbationCurve`): each summary is read from the mean curve (given as ``[1, S]``,
    returning ``[1]``: Chefer's AUC of the mean accuracy curve), and the curve has no per-sample rows."""

    metric: Metric
    x: List[float]
    summaries: Dict[str, Tuple[Summary, Optional[bool]]] = field(default_factory=dict)
    per_sample: bool = True


@dataclass
class CurveCollection:
    """Result key -> curve (the curve's own key holds the mean curve, a list), and the combined summaries of two
    curves of the same map (``{key: (function of the two per-sample areas, (curve key a, curve key b),
    higher_is_better)}``)."""

    curves: Dict[str, CurveEntry] = field(default_factory=dict)
    combined: Dict[str, Tuple[Callable[[Tensor, Tensor], Tensor], Tuple[str, str], Summary, Optional[bool]]] = \
        field(default_factory=dict)

    def metrics(self) -> List[Metric]:
        return [entry.metric for entry in self.curves.values()]

    def per_sample(self) -> Dict[str, Tuple[Tensor, Tensor]]:
        """``{key: (indices, values)}`` of every curve, summary and combined summary, rows sorted by index."""
        out: Dict[str, Tuple[Tensor, Tensor]] = {}
        for key, entry in self.curves.items():
            if not entry.per_sample:
                continue
            index, values = entry.metric.compute()
            out[key] = (index, values)
            for name, (fn, _) in entry.summaries.items():
                out[name] = (index, fn(values, entry.x))
        for name, (fn, (a, b), area, _) in self.combined.items():
            if a not in out or b not in out:
                raise ValueError(f"{name}: a combined summary needs per-sample curves; {a} or {b} keeps sums only")
            (ia, ya), (ib, yb) = out[a], out[b]
            if not torch.equal(ia, ib):
                raise RuntimeError(f"{name}: the curves {a} and {b} hold different samples")
            out[name] = (ia, fn(area(ya, self.curves[a].x), area(yb, self.curves[b].x)))
        return out

    def results(self) -> Dict[str, Any]:
        """``{key: mean over samples}``: the mean curve (a list) for curve keys, a float for the summaries."""
        results: Dict[str, Any] = {}
        for key, entry in self.curves.items():
            if not entry.per_sample:   # a mean curve: its summaries are read from it
                curve = entry.metric.compute().to(torch.float64)
                results[key] = [float(v) for v in curve]
                results.update({name: float(fn(curve[None], entry.x)[0]) for name, (fn, _) in entry.summaries.items()})
        for key, (_, values) in self.per_sample().items():
            if values.dim() == 2:
                results[key] = [float(v) for v in values.mean(dim=0)] if len(values) else [float("nan")] * \
                    values.shape[1]
            else:
                results[key] = float(values.mean()) if len(values) else float("nan")
        return results

    def higher_is_better(self) -> Dict[str, Optional[bool]]:
        declared: Dict[str, Optional[bool]] = {}
        for key, entry in self.curves.items():
            declared[key] = None   # a curve is read through its summaries
            declared.update({name: hib for name, (_, hib) in entry.summaries.items()})
        declared.update({name: hib for name, (_, _, _, hib) in self.combined.items()})
        return declared

    def curve_x(self) -> Dict[str, List[float]]:
        return {key: list(entry.x) for key, entry in self.curves.items()}
