"""AUC conventions of a perturbation curve (PROTOCOLS.md section 1); the raw curve is always stored as well.

Both are in percent of accuracy x fraction, for a curve ``y`` at ``x = [0] + fractions`` (``y[0]``: the clean
accuracy):

* ``chefer`` (default): ``100 * trapezoid(y, x)``;
* ``bi``: ``100 * sklearn.metrics.auc`` over ``x + [1.0]`` with ``y + [0]`` (an extra point: nothing left, no
  accuracy).
"""
from __future__ import annotations

from typing import List, Sequence

AUC_CONVENTIONS = ("chefer", "bi")
DEFAULT_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def trapezoid(y: Sequence[float], x: Sequence[float]) -> float:
    """``sum_i (x[i+1] - x[i]) * (y[i+1] + y[i]) / 2`` (numpy's ``trapezoid`` / sklearn's ``auc``)."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"trapezoid needs as many x as y values (at least 2), got {len(x)} and {len(y)}")
    return float(sum((x[i + 1] - x[i]) * (y[i + 1] + y[i]) / 2.0 for i in range(len(x) - 1)))


def curve_x(fractions: Sequence[float]) -> List[float]:
    """The x values of a curve: ``[0] + fractions``."""
    return [0.0] + [float(f) for f in fractions]


def perturbation_auc(curve: Sequence[float], fractions: Sequence[float] = DEFAULT_FRACTIONS,
                     convention: str = "chefer") -> float:
    """AUC (percent) of an accuracy ``curve`` at ``[0] + fractions`` (``curve[0]`` = clean accuracy)."""
    curve = [float(v) for v in curve]
    fractions = [float(f) for f in fractions]
    if len(curve) != len(fractions) + 1:
        raise ValueError(f"curve has {len(curve)} points; expected {len(fractions) + 1} (clean + one per fraction)")
    if convention == "chefer":
        return 100.0 * trapezoid(curve, [0.0] + fractions)
    if convention == "bi":
        return 100.0 * trapezoid(curve + [0.0], [0.0] + fractions + [1.0])
    raise ValueError(f"unknown AUC convention {convention!r}; choose one of {AUC_CONVENTIONS}")


def check_fractions(fractions: Sequence[float], convention: str = "chefer") -> tuple:
    """Validated fractions (increasing, in (0, 1]; below 1 for the ``bi`` convention) as a tuple of floats."""
    if convention not in AUC_CONVENTIONS:
        raise ValueError(f"unknown AUC convention {convention!r}; choose one of {AUC_CONVENTIONS}")
    if not fractions or any(not 0.0 < float(p) <= 1.0 for p in fractions) or list(fractions) != sorted(fractions):
        raise ValueError(f"fractions must be increasing values in (0, 1], got {list(fractions)}")
    if convention == "bi" and float(fractions[-1]) >= 1.0:
        raise ValueError("the 'bi' AUC appends y=0 at x=1.0: fractions must stay below 1.0")
    return tuple(float(p) for p in fractions)
