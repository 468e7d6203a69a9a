"""Writing and printing the results of an evaluation run (used by :class:`callbacks.reporter.ResultsReporter`).

Results are one flat dict keyed by :class:`evaluation.result_keys.ResultKey` strings (``accuracy``,
``perturbation/<method>/<direction>/<setting>/auc`` and ``.../curve``, ``segmentation/<method>/<metric>``,
``cdam_analysis/...``), values a float or a curve (list of floats), with two declarations beside it:
``higher_is_better`` (``{key: True | False | None}``, from the metrics) and ``curve_x`` (``{key: x values}`` of
the curves).

* :func:`write_metrics_json`: ``metrics.json``, sorted keys, NaN and infinities as ``null`` (strict JSON), never
  silently: a ``RuntimeWarning`` names every such key and its value (:func:`non_finite`);
* :func:`metrics_meta` / :func:`read_metrics_meta`: the two declarations as the sidecar ``metrics.meta.json``
  beside it (``{"schema_version": 1, "metrics": {key: {"higher_is_better": ..., "x": [...] (curves only)}}}``),
  so that a run's results describe themselves (``compare.py`` reads them);
* :func:`write_per_sample` / :func:`read_per_sample`: the per-sample sidecar ``per_sample.npz`` (the callbacks'
  ``per_sample_scores``, rows sorted by dataset index), written only when a callback has per-sample scores;
* the curves as one logger table (:func:`log_curves`) and the printed results table (:func:`results_table`).
"""
from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from evaluation.result_keys import ResultKey

#: what the results table prints for a declared direction
BETTER = {True: "higher", False: "lower", None: "-"}
#: the sidecar of ``metrics.json`` and the version of its layout
META_FILE = "metrics.meta.json"
META_SCHEMA_VERSION = 1
#: the W&B summary key whose value is the sidecar as JSON text
META_SUMMARY_KEY = "metrics_meta"


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def non_finite(results: Mapping[str, Any]) -> List[str]:
    """``key=value`` of every non-finite scalar, ``key[i]=value`` of every non-finite point of a curve."""
    found = []
    for key, value in sorted(results.items()):
        points = enumerate(value) if isinstance(value, (list, tuple)) else [(None, value)]
        found += [f"{key}{'' if i is None else f'[{i}]'}={v}" for i, v in points
                  if isinstance(v, float) and not math.isfinite(v)]
    return found


def write_metrics_json(results: Mapping[str, Any], path: os.PathLike) -> Path:
    """``results`` as JSON at ``path`` (sorted keys, non-finite floats as ``null`` with a warning naming each),
    written atomically."""
    bad = non_finite(results)
    if bad:
        warnings.warn(f"{path}: {len(bad)} non-finite metric value(s) written as null: {', '.join(bad)}",
                      RuntimeWarning, stacklevel=2)
    return write_json({k: _jsonable(v) for k, v in sorted(results.items())}, path)


def write_json(data: Any, path: os.PathLike) -> Path:
    """``data`` as indented JSON at ``path``, written atomically (a temporary file, then renamed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=2)
    os.replace(tmp, path)
    return path


def metrics_meta(higher_is_better: Mapping[str, Optional[bool]],
                 curve_x: Optional[Mapping[str, Sequence[float]]] = None,
                 conventions: Optional[Mapping[str, Mapping[str, Any]]] = None) -> Dict[str, Any]:
    """The sidecar of ``metrics.json`` (module docstring): every key's declared direction, the curves' x values
    and, for the keys of a test that names them, its conventions (``"conventions": {...}``)."""
    curve_x, conventions = curve_x or {}, conventions or {}
    return {"schema_version": META_SCHEMA_VERSION,
            "metrics": {key: {"higher_is_better": higher_is_better.get(key),
                              **({"x": [float(x) for x in curve_x[key]]} if key in curve_x else {}),
                              **({"conventions": dict(conventions[key])} if key in conventions else {})}
                        for key in sorted(set(higher_is_better) | set(curve_x))}}


#: the per-sample sidecar of ``metrics.json``
PER_SAMPLE_FILE = "per_sample.npz"


def write_per_sample(scores: Mapping[str, Tuple[Any, Any]], path: os.PathLike) -> Path:
    """Every key's per-sample values as ``.npz`` at ``path`` (written atomically): ``index/<key>`` (int64 dataset
    indices, sorted) and ``values/<key>`` (float64 ``[N]`` or ``[N, X]``, rows in the same order)."""
    arrays: Dict[str, Any] = {}
    for key, (index, values) in sorted(scores.items()):
        index = np.asarray(index.cpu() if hasattr(index, "cpu") else index, dtype=np.int64).reshape(-1)
        values = np.asarray(values.cpu() if hasattr(values, "cpu") else values, dtype=np.float64)
        if values.shape[0] != index.shape[0]:
            raise ValueError(f"per-sample scores of {key}: {index.shape[0]} indices, {values.shape[0]} rows")
        order = np.argsort(index, kind="stable")
        arrays[f"index/{key}"], arrays[f"values/{key}"] = index[order], values[order]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    return path


def read_per_sample(path: os.PathLike) -> Dict[str, Tuple[Any, Any]]:
    """``{key: (indices, values)}`` of a sidecar written by :func:`write_per_sample`."""
    with np.load(path) as data:
        keys = sorted(name[len("values/"):] for name in data.files if name.startswith("values/"))
        return {key: (data[f"index/{key}"], data[f"values/{key}"]) for key in keys}


def read_metrics_meta(meta: Any) -> Tuple[Dict[str, Optional[bool]], Dict[str, List[float]]]:
    """``(higher_is_better, curve_x)`` of a sidecar (:func:`metrics_meta`); a ``ValueError`` for another layout or
    a newer schema version."""
    version = meta.get("schema_version") if isinstance(meta, dict) else None
    entries = meta.get("metrics") if isinstance(meta, dict) else None
    if not isinstance(version, int) or not isinstance(entries, dict) or not all(
            isinstance(e, dict) for e in entries.values()):
        raise ValueError("not a metrics sidecar (expected schema_version and metrics: {key: {...}})")
    if version > META_SCHEMA_VERSION:
        raise ValueError(f"metrics sidecar schema version {version} is newer than this code's "
                         f"({META_SCHEMA_VERSION})")
    declared = {key: entry.get("higher_is_better") for key, entry in entries.items()}
    xs = {key: [float(x) for x in entry["x"]] for key, entry in entries.items() if entry.get("x") is not None}
    return declared, xs


def curve_rows(results: Mapping[str, Any], curve_x: Optional[Mapping[str, Sequence[float]]] = None) -> List[list]:
    """Rows ``[key, step, x, y]`` of every list-valued result (``x`` from ``curve_x[key]`` when its length fits,
    else the step)."""
    curve_x = curve_x or {}
    rows = []
    for key, value in sorted(results.items()):
        if isinstance(value, (list, tuple)):
            xs = curve_x.get(key)
            xs = list(xs) if xs is not None and len(xs) == len(value) else None
            for i, y in enumerate(value):
                rows.append([key, i, float(xs[i]) if xs else float(i), _jsonable(float(y))])
    return rows


def log_curves(logger, results: Mapping[str, Any], curve_x: Optional[Mapping[str, Sequence[float]]] = None) -> None:
    """The curves as one table ``curves`` (columns key, step, fraction, value) through ``logger.log_table``."""
    rows = curve_rows(results, curve_x)
    if logger is None or not rows or not hasattr(logger, "log_table"):
        return
    logger.log_table(key="curves", columns=["key", "step", "fraction", "value"], data=rows)


def _direction(keys: Sequence[str], higher_is_better: Mapping[str, Optional[bool]]) -> str:
    """``higher`` / ``lower`` when every key declares that direction, ``mixed`` when they disagree, ``-`` else."""
    declared = {higher_is_better.get(k) for k in keys}
    if len(declared) == 1:
        return BETTER[declared.pop()]
    return "mixed"


def results_table(results: Mapping[str, Any], higher_is_better: Optional[Mapping[str, Optional[bool]]] = None) -> str:
    """Readable text: clean accuracy, perturbation AUCs as a method x (direction/setting) grid, segmentation as
    method x metric, the rationale test's instance-macro token-F1 as method x (setting/k) with its AUPRC and
    IOU-F1, ERASER's AOPCs as method x (setting/score), then every other scalar (the rationale test's micro
    token-F1 per k and ERASER's per-bin values are in ``metrics.json`` only); a ``better`` row under each grid's
    header (and a column beside the other scalars) says which direction is better, as the metrics declare it
    (``higher_is_better``)."""
    declared = dict(higher_is_better or {})
    lines: List[str] = []
    if "accuracy" in results:
        lines.append(f"clean accuracy: {results['accuracy']:.4f}")

    def grid(title: str, cells: Dict[str, Dict[str, float]], keys: Dict[str, List[str]], columns: List[str],
             fmt: str) -> None:
        if not cells:
            return
        width = max(len("method"), len("better"), *(len(m) for m in cells))
        col_w = max(10, *(len(c) for c in columns))
        lines.append("")
        lines.append(title)
        lines.append("method".ljust(width) + "".join(c.rjust(col_w + 2) for c in columns))
        lines.append("better".ljust(width) + "".join(_direction(keys[c], declared).rjust(col_w + 2) for c in columns))
        for method in sorted(cells):
            row = cells[method]
            cells_text = (format(row[c], fmt) if c in row and row[c] is not None and math.isfinite(row[c]) else "-"
                          for c in columns)
            lines.append(method.ljust(width) + "".join(text.rjust(col_w + 2) for text in cells_text))

    # per grid: cells {method: {column: value}} and the keys of each column
    grids: Dict[str, Tuple[Dict[str, Dict[str, float]], Dict[str, List[str]]]] = {
        name: ({}, {}) for name in ("perturbation", "segmentation", "rationale", "eraser")}
    other: Dict[str, float] = {}

    def put(name: str, method: str, column: str, key: str, value: float) -> None:
        grids[name][0].setdefault(method, {})[column] = value
        grids[name][1].setdefault(column, []).append(key)

    for key, value in results.items():
        k = ResultKey.parse(key)
        if k.test == "rationale" and k.setting and isinstance(value, (int, float)):
            if k.metric.startswith("token_f1@") or k.metric in ("auprc", "iou_f1"):
                put("rationale", k.method, f"{k.setting}/{k.metric.replace('token_f1@', 'f1@')}", key, value)
            continue
        if k.test == "eraser" and k.setting and isinstance(value, (int, float)):
            if k.metric.startswith("aopc_"):
                put("eraser", k.method, f"{k.setting}/{k.metric[len('aopc_'):]}", key, value)
            continue
        if k.test == "perturbation" and k.direction and k.metric == "auc":
            put("perturbation", k.method, f"{k.direction}/{k.setting}", key, value)
        elif k.test == "segmentation" and k.method and not k.setting:
            put("segmentation", k.method, k.metric, key, value)
        elif key != "accuracy" and isinstance(value, (int, float)) and k.test != "perturbation":
            other[key] = float(value)
    pert_keys, seg_keys, rat_keys, eraser_keys = (grids[name][1] for name in grids)
    pert_cols = [c for c in ("positive/predicted", "negative/predicted", "positive/target", "negative/target")
                 if c in pert_keys]
    pert_cols += sorted(set(pert_keys) - set(pert_cols))
    grid("perturbation AUC", *grids["perturbation"], pert_cols, ".2f")
    seg_cols = [c for c in ("pixel_accuracy", "miou", "map", "f1", "f1_rows") if c in seg_keys]
    seg_cols += sorted(set(seg_keys) - set(seg_cols))
    grid("segmentation", *grids["segmentation"], seg_cols, ".4f")

    def rationale_order(column: str):
        setting, name = column.split("/", 1)
        k = int(name[3:]) if name.startswith("f1@") and name[3:].isdigit() else 10 ** 6 + len(name)
        return setting, k, name

    grid("rationale: token F1 (instance macro) of the top-k words, AUPRC", *grids["rationale"],
         sorted(rat_keys, key=rationale_order), ".3f")
    grid("ERASER faithfulness: AOPC (mean over bins)", *grids["eraser"], sorted(eraser_keys), ".4f")
    if other:
        lines.append("")
        width = max(len(k) for k in other)
        for key, value in sorted(other.items()):
            better = declared.get(key)
            note = "" if better is None else f"  ({BETTER[better]} is better)"
            lines.append(f"{key.ljust(width)}  {value:.4f}{note}")
    return "\n".join(lines)
