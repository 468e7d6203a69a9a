"""Collecting, writing, logging and printing the results of an evaluation run.

``collect_results`` merges the module's ``results`` (clean ``accuracy``) and every ``EvaluationCallback``'s
``results`` (scalars and curves, already reduced over processes) into one flat dict, keyed as the callbacks key
them (``perturbation/<method>/<direction>/<setting>/auc``, ``segmentation/<method>/<metric>``,
``cdam_analysis/...``). ``write_metrics_json`` writes it (NaN as ``null``); ``log_curves`` logs list-valued
results as one table through the logger (``log_table`` when it has one); ``results_table`` is the text table
printed at the end of ``evaluate.py``.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .base import EvaluationCallback


def collect_results(trainer, pl_module) -> Dict[str, Any]:
    results: Dict[str, Any] = dict(getattr(pl_module, "results", {}) or {})
    for callback in trainer.callbacks:
        if isinstance(callback, EvaluationCallback):
            overlap = set(results) & set(callback.results)
            if overlap:
                raise ValueError(f"two evaluation callbacks report the same keys: {sorted(overlap)[:5]}")
            results.update(callback.results)
    return results


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_metrics_json(results: Dict[str, Any], path: os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as handle:
        json.dump({k: _jsonable(v) for k, v in sorted(results.items())}, handle, indent=2)
    os.replace(tmp, path)
    return path


def curve_rows(results: Dict[str, Any], fractions: Optional[Sequence[float]] = None) -> List[list]:
    """Rows ``[key, step, x, y]`` of every list-valued result (x from ``fractions`` when lengths fit)."""
    rows = []
    for key, value in sorted(results.items()):
        if isinstance(value, (list, tuple)):
            xs = [0.0] + list(fractions) if fractions is not None and len(fractions) + 1 == len(value) else None
            for i, y in enumerate(value):
                rows.append([key, i, float(xs[i]) if xs else float(i), _jsonable(float(y))])
    return rows


def log_curves(logger, results: Dict[str, Any], fractions: Optional[Sequence[float]] = None) -> None:
    rows = curve_rows(results, fractions)
    if logger is None or not rows or not hasattr(logger, "log_table"):
        return
    logger.log_table(key="curves", columns=["key", "step", "fraction", "value"], data=rows)


def results_table(results: Dict[str, Any]) -> str:
    """Readable text: perturbation AUCs as a method x (direction/setting) grid, segmentation as method x metric,
    then every other scalar."""
    lines: List[str] = []
    if "accuracy" in results:
        lines.append(f"clean accuracy: {results['accuracy']:.4f}")

    def grid(title: str, cells: Dict[str, Dict[str, float]], columns: List[str], fmt: str) -> None:
        if not cells:
            return
        width = max(len("method"), *(len(m) for m in cells))
        col_w = max(10, *(len(c) for c in columns))
        lines.append("")
        lines.append(title)
        lines.append("method".ljust(width) + "".join(c.rjust(col_w + 2) for c in columns))
        for method in sorted(cells):
            row = cells[method]
            lines.append(method.ljust(width) + "".join(
                (format(row[c], fmt) if c in row and row[c] is not None and math.isfinite(row[c]) else "-").rjust(col_w + 2)
                for c in columns))

    pert: Dict[str, Dict[str, float]] = {}
    seg: Dict[str, Dict[str, float]] = {}
    other: Dict[str, float] = {}
    for key, value in results.items():
        parts = key.split("/")
        if parts[0] == "perturbation" and len(parts) == 5 and parts[-1] == "auc":
            pert.setdefault(parts[1], {})[f"{parts[2]}/{parts[3]}"] = value
        elif parts[0] == "segmentation" and len(parts) == 3:
            seg.setdefault(parts[1], {})[parts[2]] = value
        elif key != "accuracy" and isinstance(value, (int, float)) and parts[0] != "perturbation":
            other[key] = float(value)
    pert_cols = [c for c in ("positive/predicted", "negative/predicted", "positive/target", "negative/target")
                 if any(c in row for row in pert.values())]
    pert_cols += sorted({c for row in pert.values() for c in row} - set(pert_cols))
    grid("perturbation AUC (positive: lower is better; negative: higher is better)", pert, pert_cols, ".2f")
    seg_cols = [c for c in ("pixel_accuracy", "miou", "map", "f1", "f1_rows") if any(c in r for r in seg.values())]
    grid("segmentation (higher is better)", seg, seg_cols, ".4f")
    if other:
        lines.append("")
        width = max(len(k) for k in other)
        lines += [f"{k.ljust(width)}  {v:.4f}" for k, v in sorted(other.items())]
    return "\n".join(lines)
