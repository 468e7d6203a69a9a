"""ERASER's rationale metrics (DeYoung et al. 2020) as its scorer (``rationale_benchmark/metrics.py``) computes them,
batched, on **document words** (ERASER's whitespace tokens of the flattened document, ``W`` per batch row, padded),
from the hard rationales of :mod:`evaluation.rationale_selection`. PROTOCOLS.md sections 4 and 8.

* token-level P/R/F1 (:func:`instance_prf`, :class:`TokenF1`): ERASER's ``score_hard_rationale_predictions``
  on token-level rationales (its ``token_prf``). ``instance_macro`` (what Chefer reports): per instance
  ``P = |pred & truth| / |pred|`` (0 without predictions), ``R = |pred & truth| / |truth|`` (0 without truth),
  ``F1 = 0 if P == 0 or R == 0 else 2PR / (P + R)``, then the **mean of P, of R and of F1** over the instances
  that have a predicted or a true token (an instance with neither is not one of ERASER's keys). ``instance_micro``:
  summed counts, ``P = sum |pred & truth| / sum |pred|``, ``R = sum |pred & truth| / sum |truth|``, F1 of those
  (NaN where ERASER would divide by zero).
* IOU-F1 (:func:`span_iou_matches`, :class:`SpanIOUF1`): ERASER's ``partial_match_score``. Predicted spans are
  the maximal runs of the hard rationale; a predicted span is a hit when its best IoU (``|p & t| / |p | t|`` over
  token sets) with a true span of the same instance is ``>= threshold`` (0.5). Micro: ``R = hits / true spans``,
  ``P = hits / predicted spans`` summed over instances (0 when a denominator is 0, as ERASER), F1 of those.
  Macro (ERASER's ``macro``, reported as ``iou_f1``; ERASER's scorer prints both): the mean of per-instance
  recall over instances with true spans and the mean of per-instance precision over instances with predicted
  spans, then **F1 of the two means** (unlike the token-level macro F1, which averages per-instance F1s).
  **True spans** are the maximal runs of the word-level truth mask; ERASER uses each evidence span as annotated,
  which is the same whenever no two evidence spans overlap or touch (true of every split of the Movie Reviews
  release: checked in the tests of this module).
* AUPRC (:func:`soft_auprc`, :class:`SoftAUPRC`): ERASER's ``_auprc``: per instance, sklearn's
  ``precision_recall_curve`` of the soft scores of **every document word** (uncovered words score 0) against the
  truth, its area by the trapezoidal rule (``sklearn.metrics.auc(recall, precision)``), averaged over instances.
  The curve has one point per distinct score (ties form one threshold) plus the point ``(recall 0, precision
  1)``. An instance without a true word has no recall (with the scikit-learn ERASER pins, 0.20, recall is 0 / 0 =
  NaN, which makes ERASER's average NaN; recent versions set it to 1 with a warning): it is **left out** of the
  average and counted (``skipped``). Every annotation of the Movie Reviews test split has evidence.

The metric states are float64 sums (:class:`evaluation.metrics.SumsMetric`).
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np
import torch
from torch import Tensor

from .metrics import SumsMetric, f64
from .rationale_selection import batched_runs

#: ERASER's default ``--iou_thresholds``
DEFAULT_IOU_THRESHOLD = 0.5


def instance_prf(tp: Tensor, n_pred: Tensor, n_truth: Tensor) -> Dict[str, Tensor]:
    """ERASER's per-instance token P/R/F1 (``score_hard_rationale_predictions``) from counts (any shape):
    ``{"p", "r", "f1"}`` float64 and ``"included"`` (the instance is one of ERASER's keys: it has a predicted or a
    true token)."""
    tp, n_pred, n_truth = (torch.as_tensor(x).to(torch.float64) for x in (tp, n_pred, n_truth))
    p = torch.where(n_pred > 0, tp / n_pred.clamp(min=1), torch.zeros_like(tp))
    r = torch.where(n_truth > 0, tp / n_truth.clamp(min=1), torch.zeros_like(tp))
    f1 = torch.where((p > 0) & (r > 0), 2 * p * r / (p + r).clamp(min=1e-300), torch.zeros_like(tp))
    return {"p": p, "r": r, "f1": f1, "included": (n_pred > 0) | (n_truth > 0)}


def token_counts(hard: Tensor, truth: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """``hard [B, K, W]`` predicted rationales and ``truth [B, W]`` -> ``(tp, n_pred, n_truth)``, ``[B, K]`` long."""
    if hard.dim() != 3 or truth.dim() != 2 or hard.shape[0] != truth.shape[0] or hard.shape[2] != truth.shape[1]:
        raise ValueError(f"expected hard [B, K, W] and truth [B, W], got {tuple(hard.shape)} and "
                         f"{tuple(truth.shape)}")
    truth = truth.bool()
    tp = (hard & truth[:, None, :]).sum(dim=2)
    n_pred = hard.sum(dim=2)
    n_truth = truth.sum(dim=1, keepdim=True).expand_as(tp)
    return tp, n_pred, n_truth


def span_iou_matches(hard: Tensor, truth: Tensor, threshold: float = DEFAULT_IOU_THRESHOLD
                     ) -> Tuple[Tensor, Tensor, Tensor]:
    """ERASER's ``partial_match_score`` counts per instance and ``k``: ``(hits, n_pred_spans, n_true_spans)``,
    ``[B, K]`` long. Spans are maximal runs (module docstring); a predicted span is a hit when its best IoU with a
    true span is ``>= threshold``."""
    if hard.dim() != 3 or truth.dim() != 2 or hard.shape[0] != truth.shape[0] or hard.shape[2] != truth.shape[1]:
        raise ValueError(f"expected hard [B, K, W] and truth [B, W], got {tuple(hard.shape)} and "
                         f"{tuple(truth.shape)}")
    b, k, w = hard.shape
    ps, pe, pv = batched_runs(hard.reshape(b * k, w))                         # [BK, P]
    ts, te, tv = batched_runs(truth.bool())                                   # [B, T]
    ts, te, tv = (x.repeat_interleave(k, dim=0) for x in (ts, te, tv))         # [BK, T]
    inter = (torch.minimum(pe[:, :, None], te[:, None, :]) - torch.maximum(ps[:, :, None], ts[:, None, :])).clamp(min=0)
    union = (pe - ps)[:, :, None] + (te - ts)[:, None, :] - inter
    iou = inter.to(torch.float64) / union.clamp(min=1).to(torch.float64)
    iou = torch.where(pv[:, :, None] & tv[:, None, :], iou, torch.zeros_like(iou))
    best = iou.max(dim=2).values                                              # 0 when the instance has no true span
    hits = ((best >= threshold) & pv).sum(dim=1)
    return hits.view(b, k), pv.sum(dim=1).view(b, k), tv.sum(dim=1).view(b, k)


def soft_auprc(scores: Tensor, truth: Tensor, valid: Tensor) -> Tensor:
    """ERASER's per-instance AUPRC (``_auprc``: sklearn ``precision_recall_curve`` then ``auc(recall,
    precision)``), batched: ``[B]`` float64, NaN for an instance without a true word.

    ``scores [B, W]`` soft word scores, ``truth [B, W]`` bool, ``valid [B, W]`` the words of the document (each
    row's valid words must come first: words ``0 .. num_words - 1``). Thresholds are the distinct scores; the
    curve starts at (recall 0, precision 1); the area is the trapezoidal rule over consecutive points.
    """
    if not (scores.shape == truth.shape == valid.shape) or scores.dim() != 2:
        raise ValueError(f"expected scores, truth and valid of the same shape [B, W], got {tuple(scores.shape)}, "
                         f"{tuple(truth.shape)}, {tuple(valid.shape)}")
    scores = scores.to(torch.float64)
    valid, truth = valid.bool(), truth.bool() & valid.bool()
    if not torch.isfinite(scores[valid]).all():
        raise ValueError("soft word scores must be finite for the AUPRC")
    b, w = scores.shape
    keyed = scores.masked_fill(~valid, -np.inf)
    order = torch.sort(keyed, dim=1, descending=True, stable=True).indices
    s_sorted = keyed.gather(1, order)
    t_sorted = truth.gather(1, order)
    v_sorted = valid.gather(1, order)                                          # valid words first
    tps = t_sorted.to(torch.float64).cumsum(dim=1)
    predicted = torch.arange(1, w + 1, device=scores.device, dtype=torch.float64)[None, :]
    positives = truth.sum(dim=1, keepdim=True).to(torch.float64)
    precision = tps / predicted
    recall = tps / positives.clamp(min=1)
    nxt_differs = torch.ones_like(v_sorted)
    if w > 1:
        nxt_differs[:, :-1] = (s_sorted[:, 1:] != s_sorted[:, :-1]) | ~v_sorted[:, 1:]
    is_end = v_sorted & nxt_differs                                            # the last word of each tie group
    ends = torch.where(is_end, torch.arange(w, device=scores.device)[None, :], torch.full_like(order, -1))
    prev_end = torch.cat([torch.full((b, 1), -1, device=scores.device, dtype=torch.long),
                          ends.cummax(dim=1).values[:, :-1]], dim=1)
    has_prev = prev_end >= 0
    prev_r = torch.where(has_prev, recall.gather(1, prev_end.clamp(min=0)), torch.zeros_like(recall))
    prev_p = torch.where(has_prev, precision.gather(1, prev_end.clamp(min=0)), torch.ones_like(precision))
    area = torch.where(is_end, (recall - prev_r) * (precision + prev_p) / 2, torch.zeros_like(recall)).sum(dim=1)
    return torch.where(positives[:, 0] > 0, area, torch.full_like(area, float("nan")))


# ============================================================================================= metric states
def _f1(p: Tensor, r: Tensor) -> Tensor:
    """ERASER's ``_f1``: 0 when either is 0, else the harmonic mean (NaN stays NaN)."""
    out = 2 * p * r / (p + r)
    return torch.where((p == 0) | (r == 0), torch.zeros_like(out), out)


def _ratio(num: Tensor, den: Tensor, empty: float) -> Tensor:
    return torch.where(den > 0, num / den.clamp(min=1e-300), torch.full_like(num, empty))


class TokenF1(SumsMetric):
    """Token-level P/R/F1 per ``k`` as ERASER's ``token_prf`` (module docstring): float64 sums of per-instance
    P, R, F1 and of included instances (``instance_macro``), and of true positives, predicted and true tokens
    (``instance_micro``). ``compute`` gives ``{"p", "r", "f1", "micro_p", "micro_r", "micro_f1"}``, ``[K]`` each."""

    higher_is_better = True

    def __init__(self, num_ks: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_ks = int(num_ks)
        self.add_sums("sum_p", "sum_r", "sum_f1", "instances", "tp", "n_pred", "n_truth", shape=(self.num_ks,))

    def update(self, tp: Tensor, n_pred: Tensor, n_truth: Tensor) -> None:
        """Counts ``[B, K]`` of :func:`token_counts`."""
        tp, n_pred, n_truth = f64(tp), f64(n_pred), f64(n_truth)
        if tp.dim() != 2 or tp.shape[1] != self.num_ks or n_pred.shape != tp.shape or n_truth.shape != tp.shape:
            raise ValueError(f"expected counts [B, {self.num_ks}], got {tuple(tp.shape)}, {tuple(n_pred.shape)}, "
                             f"{tuple(n_truth.shape)}")
        prf = instance_prf(tp, n_pred, n_truth)
        inc = prf["included"].to(torch.float64)
        self.sum_p += (prf["p"] * inc).sum(dim=0)
        self.sum_r += (prf["r"] * inc).sum(dim=0)
        self.sum_f1 += (prf["f1"] * inc).sum(dim=0)
        self.instances += inc.sum(dim=0)
        self.tp += tp.sum(dim=0)
        self.n_pred += n_pred.sum(dim=0)
        self.n_truth += n_truth.sum(dim=0)

    def compute(self) -> Dict[str, Tensor]:
        nan = float("nan")
        micro_p = _ratio(self.tp, self.n_pred, nan)
        micro_r = _ratio(self.tp, self.n_truth, nan)
        return {"p": _ratio(self.sum_p, self.instances, nan), "r": _ratio(self.sum_r, self.instances, nan),
                "f1": _ratio(self.sum_f1, self.instances, nan),
                "micro_p": micro_p, "micro_r": micro_r, "micro_f1": _f1(micro_p, micro_r)}


class SpanIOUF1(SumsMetric):
    """IOU-F1 per ``k`` as ERASER's ``partial_match_score`` (module docstring): float64 sums of hits, predicted
    and true spans (micro), of per-instance recall over instances with true spans and of per-instance precision
    over instances with predicted spans (macro). ``compute`` gives ``{"f1", "p", "r", "micro_f1", "micro_p",
    "micro_r"}``, ``[K]`` each (``f1``: ERASER's macro F1)."""

    higher_is_better = True

    def __init__(self, num_ks: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_ks = int(num_ks)
        self.add_sums("hits", "n_pred", "n_truth", "sum_r", "with_truth", "sum_p", "with_pred", shape=(self.num_ks,))

    def update(self, hits: Tensor, n_pred: Tensor, n_truth: Tensor) -> None:
        """Counts ``[B, K]`` of :func:`span_iou_matches`."""
        hits, n_pred, n_truth = f64(hits), f64(n_pred), f64(n_truth)
        if hits.dim() != 2 or hits.shape[1] != self.num_ks or n_pred.shape != hits.shape \
                or n_truth.shape != hits.shape:
            raise ValueError(f"expected counts [B, {self.num_ks}], got {tuple(hits.shape)}, {tuple(n_pred.shape)}, "
                             f"{tuple(n_truth.shape)}")
        self.hits += hits.sum(dim=0)
        self.n_pred += n_pred.sum(dim=0)
        self.n_truth += n_truth.sum(dim=0)
        self.sum_r += _ratio(hits, n_truth, 0.0).sum(dim=0)
        self.with_truth += (n_truth > 0).to(torch.float64).sum(dim=0)
        self.sum_p += _ratio(hits, n_pred, 0.0).sum(dim=0)
        self.with_pred += (n_pred > 0).to(torch.float64).sum(dim=0)

    def compute(self) -> Dict[str, Tensor]:
        micro_r, micro_p = _ratio(self.hits, self.n_truth, 0.0), _ratio(self.hits, self.n_pred, 0.0)
        r, p = _ratio(self.sum_r, self.with_truth, 0.0), _ratio(self.sum_p, self.with_pred, 0.0)
        return {"f1": _f1(p, r), "p": p, "r": r, "micro_f1": _f1(micro_p, micro_r), "micro_p": micro_p,
                "micro_r": micro_r}


class SoftAUPRC(SumsMetric):
    """Mean per-instance AUPRC (ERASER's ``_auprc``): float64 sum and count of the instances with a true word, and
    the count of those without (``skipped``, module docstring). ``compute``: the mean (NaN without instances)."""

    higher_is_better = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_sums("total", "count", "skipped")

    def update(self, values: Tensor) -> None:
        """Per-instance AUPRC ``[B]`` of :func:`soft_auprc` (NaN: no true word, skipped)."""
        values = f64(values).flatten()
        keep = ~torch.isnan(values)
        self.total += values[keep].sum()
        self.count += keep.sum()
        self.skipped += (~keep).sum()

    def compute(self) -> Tensor:
        return self.total / self.count if self.count > 0 else torch.tensor(float("nan"), dtype=torch.float64)

