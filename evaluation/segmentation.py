"""Segmentation metrics (Chefer et al. 2021a; Beyond Intuition uses the same metric code), PROTOCOLS.md section 3.

For normalised maps ``[B, H, W]`` in [0, 1] (:func:`evaluation.pixel_maps.pixel_maps`: upsampled bilinearly to the
image size, min-max per image) against ground-truth masks ``[B, H, W]``:

* binarisation: foreground = ``map > mean(map)`` (the mean of the *normalised* map of that image);
* ``pixel_accuracy``: correct pixels / all pixels, both summed over the whole dataset (the reference adds
  ``np.spacing(1)`` to the denominator; so do we);
* ``miou``: for background and foreground separately, the sum over the dataset of intersections divided by the
  sum of unions (``+ np.spacing(1)``), then the mean of the two;
* ``map``: per image, the average precision of the pooled two-channel scores ``[1 - map, map]`` against the
  labels ``[gt == 0, gt == 1]`` (``2 * H * W`` values), computed exactly as ``sklearn.metrics.
  average_precision_score`` (one threshold per *distinct* score, so ties form one step:
  ``AP = sum_t (R_t - R_{t-1}) P_t``), then the mean over images; NaN is counted as 0 (the reference's
  ``np.nan_to_num``). A constant map (all pixels equal before normalisation) scores 0 in *both* channels, as in
  the reference script: its min-max normalisation divides 0 by 0 and it sets the NaNs of both channels to 0, so
  every pixel ties and the AP is the share of positives among the ``2 * H * W`` labels, exactly 0.5 (scoring the
  normalised all-zero map as ``[1, 0]`` instead would give ``(1 - f)^2 + f / 2`` for a foreground share ``f``);
* ``f1``: a proper per-image F1 of the binary foreground against the mask, ``2TP / (2TP + FP + FN)`` (0 when the
  denominator is 0, sklearn's ``zero_division`` default), mean over images;
* ``f1_rows``: what TE and BI print as "mF1": their ``get_f1_scores`` is called on one ``[H, W]`` image, so it
  computes an F1 per image **row** (0 for rows without true or predicted foreground), averaged over rows; here
  the row mean per image, then the mean over images (the same number, every image has H rows).

States: float64 sums of per-image values and pixel counts (:class:`evaluation.metrics.SumsMetric`). Every
metric: higher is better. The callback is :class:`callbacks.segmentation.SegmentationTest`.
"""
from __future__ import annotations

from typing import Any, Dict

import numpy as np
import torch
from torch import Tensor

from .metrics import SumsMetric

EPS = float(np.spacing(1))  # the reference's denominators: 1.0 * x / (np.spacing(1) + y)
METRIC_NAMES = ("pixel_accuracy", "miou", "map", "f1", "f1_rows")


# ------------------------------------------------------------------------------------------ pure functions
def binarize(maps: Tensor) -> Tensor:
    """Foreground ``map > mean(map)`` per image for normalised maps ``[B, H, W]``."""
    mean = maps.flatten(1).mean(dim=1)
    return maps > mean[:, None, None]


def average_precision(scores: Tensor, labels: Tensor) -> Tensor:
    """Row-wise average precision ``[B]`` of ``scores [B, N]`` against binary ``labels [B, N]``.

    sklearn's definition: thresholds at the distinct score values in decreasing order; at threshold ``t``
    precision ``P_t = TP_t / (TP_t + FP_t)`` and recall ``R_t = TP_t / #positives``; ``AP = sum_t (R_t - R_{t-1})
    P_t``. Equivalently each positive contributes the precision at the *end* of its tie group, divided by the
    number of positives. Rows without positives give NaN (sklearn warns and its recall is undefined).
    """
    if scores.shape != labels.shape or scores.dim() != 2:
        raise ValueError(f"scores and labels must both be [B, N], got {tuple(scores.shape)} and {tuple(labels.shape)}")
    n = scores.shape[1]
    sorted_scores, order = torch.sort(scores, dim=1, descending=True, stable=True)
    y = labels.gather(1, order).to(torch.float64)
    tps = torch.cumsum(y, dim=1)
    positions = torch.arange(n, device=scores.device).expand_as(order)
    # a tie group ends where the next (sorted) score differs, and at the last position
    group_end = torch.ones_like(order, dtype=torch.bool)
    group_end[:, :-1] = sorted_scores[:, 1:] != sorted_scores[:, :-1]
    end_index = torch.where(group_end, positions, torch.full_like(positions, n))
    end_index = torch.flip(torch.cummin(torch.flip(end_index, [1]), dim=1).values, [1])
    precision_at_end = tps.gather(1, end_index) / (end_index + 1).to(torch.float64)
    positives = y.sum(dim=1)
    return (y * precision_at_end).sum(dim=1) / positives  # NaN when there is no positive


def two_channel_ap(maps: Tensor, gt: Tensor) -> Tensor:
    """Per-image AP of the pooled scores ``[1 - map, map]`` against ``[gt == 0, gt == 1]`` (``[B]``, NaN -> 0);
    a constant map scores 0 in both channels (the reference's zeroed 0/0, module docstring)."""
    fg = gt.bool().flatten(1)
    flat = maps.flatten(1)
    constant = (flat.amax(dim=1) == flat.amin(dim=1))[:, None]
    scores = torch.where(constant, torch.zeros_like(flat).repeat(1, 2), torch.cat([1 - flat, flat], dim=1))
    labels = torch.cat([~fg, fg], dim=1)
    return torch.nan_to_num(average_precision(scores, labels), nan=0.0)


def f1_from_counts(tp: Tensor, fp: Tensor, fn: Tensor) -> Tensor:
    """``2TP / (2TP + FP + FN)``, 0 where the denominator is 0 (sklearn's ``zero_division`` default)."""
    tp, fp, fn = tp.to(torch.float64), fp.to(torch.float64), fn.to(torch.float64)
    den = 2 * tp + fp + fn
    return torch.where(den > 0, 2 * tp / den.clamp_min(1), torch.zeros_like(den))


def f1_image(pred: Tensor, gt: Tensor) -> Tensor:
    """Proper per-image F1 ``[B]`` of binary predictions ``[B, H, W]``."""
    pred, gt = pred.bool().flatten(1), gt.bool().flatten(1)
    return f1_from_counts((pred & gt).sum(1), (pred & ~gt).sum(1), (~pred & gt).sum(1))


def f1_rows(pred: Tensor, gt: Tensor) -> Tensor:
    """The reference's "mF1": mean over image rows of the per-row F1, per image ``[B]``."""
    pred, gt = pred.bool(), gt.bool()
    per_row = f1_from_counts((pred & gt).sum(2), (pred & ~gt).sum(2), (~pred & gt).sum(2))  # [B, H]
    return per_row.mean(dim=1)


# ------------------------------------------------------------------------------------------ metric
class SegmentationMetrics(SumsMetric):
    """Dataset-level pixel accuracy and mIoU, image-level mAP, F1 and row-F1 (see the module docstring)."""

    higher_is_better = True  # every one of its values

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_sums("correct", "labeled")
        self.add_sums("intersection", "union", shape=(2,))  # [bg, fg]
        self.add_sums("ap_sum", "f1_sum", "f1_rows_sum", "images")

    def update(self, maps: Tensor, gt: Tensor) -> None:
        """``maps``: normalised ``[B, H, W]`` in [0, 1]; ``gt``: ``[B, H, W]`` in {0, 1}."""
        if maps.shape != gt.shape or maps.dim() != 3:
            raise ValueError(f"segmentation: maps {tuple(maps.shape)} and masks {tuple(gt.shape)} must both be "
                             "[B, H, W]")
        fg = gt > 0.5
        pred = binarize(maps)
        self.correct += (pred == fg).sum().to(torch.float64)
        self.labeled += float(fg.numel())
        self.intersection += torch.stack([(~pred & ~fg).sum(), (pred & fg).sum()]).to(torch.float64)
        self.union += torch.stack([(~pred | ~fg).sum(), (pred | fg).sum()]).to(torch.float64)
        self.ap_sum += two_channel_ap(maps, fg).sum()
        self.f1_sum += f1_image(pred, fg).sum()
        self.f1_rows_sum += f1_rows(pred, fg).sum()
        self.images += float(maps.shape[0])

    def compute(self) -> Dict[str, Tensor]:
        if self.images == 0:
            nan = torch.tensor(float("nan"), dtype=torch.float64)
            return {name: nan for name in METRIC_NAMES}
        iou = self.intersection / (EPS + self.union)
        return {
            "pixel_accuracy": self.correct / (EPS + self.labeled),
            "miou": iou.mean(),
            "map": self.ap_sum / self.images,
            "f1": self.f1_sum / self.images,
            "f1_rows": self.f1_rows_sum / self.images,
        }
