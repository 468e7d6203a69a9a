"""The removal-curve collection (evaluation/curves.py) with a curve kept as sums (``per_sample=False``): its
summaries are read from the mean curve, it has no per-sample rows, and a combined summary refuses it."""
from __future__ import annotations

import pytest
import torch

from evaluation.curves import CurveCollection, CurveEntry, PerSampleCurves, integrate
from evaluation.metrics import PerStepMean


def _collection(combined=None):
    x = [0.0, 0.5, 1.0]
    sums, rows = PerStepMean(3), PerSampleCurves(3)
    values = torch.tensor([[1.0, 0.5, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    sums.update(values)
    rows.update(torch.tensor([2, 0, 1]), values)
    first = lambda y, xs: y[:, 1]   # noqa: E731
    curves = {"t/sums": CurveEntry(sums, x, {"t/sums_mid": (first, True)}, per_sample=False),
              "t/rows": CurveEntry(rows, x, {"t/rows_mid": (first, True)})}
    return CurveCollection(curves, combined or {}), values, x


def test_a_sums_curve_reports_its_mean_curve_and_the_summary_of_it():
    collection, values, x = _collection()
    results = collection.results()
    assert results["t/sums"] == [float(v) for v in values.mean(dim=0)]
    assert results["t/sums_mid"] == pytest.approx(0.5)
    # the same numbers as the per-sample curve of the same values, whose summary is a mean over samples
    assert results["t/rows"] == results["t/sums"] and results["t/rows_mid"] == results["t/sums_mid"]
    assert set(collection.per_sample()) == {"t/rows", "t/rows_mid"}   # no rows for the sums curve
    assert collection.higher_is_better() == {"t/sums": None, "t/sums_mid": True, "t/rows": None, "t/rows_mid": True}


def test_a_combined_summary_of_a_sums_curve_is_refused():
    area = lambda y, xs: integrate(y, xs, "trapezoid")   # noqa: E731
    collection, _, _ = _collection({"t/between": (lambda a, b: a - b, ("t/rows", "t/sums"), area, True)})
    with pytest.raises(ValueError, match="keeps sums only"):
        collection.results()
