"""One evaluate.py run as a markdown table: every scalar result with a direction, one row per method, and one line
per method counting the keys on which it is better than the random map of the same run.

    python -m benchmarks.run_tables RUN_FOLDER [--first m1 m2 ...] [--anchors transformer_attribution attnlrp random]
        [--methods-from perturbation] [--tests t1 t2 ...]

Reads the run's ``metrics.json`` and the direction each key declares in ``metrics.meta.json``
(``higher_is_better``). A key ``<test>/<method>/<rest>`` whose ``<method>`` has a key of the test
``--methods-from`` (default ``perturbation``) in the run is a method's result (its column: ``<test> <rest>``, the
class setting left out of the label where the test has one setting only); ``--tests``: only the columns of these
tests. The other scalars (accuracy, coverage) are printed above the table. Curves, counts and keys without a
direction are left out. Rows: ``--first`` in that order, the other methods sorted, then ``--anchors``. Perturbation
AUCs are printed with 2 decimals, values below 1e-3 in magnitude (not 0) with 4 significant digits, everything
else with 4 decimals. A method is better than the random map on a key when
strictly better in the key's direction; equal values are counted as ties, and each line names the keys where the
method is worse or tied (up to six).
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

SETTINGS = ("predicted", "target", "other")
RANDOM = "random"
ARROWS = {True: " ↑", False: " ↓"}


def read_run(folder: Path, methods_from: str = "perturbation", tests: Optional[Sequence[str]] = None
             ) -> Tuple[Dict[str, Dict[str, float]], Dict[str, bool], Dict[str, float]]:
    """``({method: {column: value}}, {column: higher_is_better}, {run-level key: value})`` of a run folder
    (``tests``: only the columns of these tests)."""
    metrics = json.loads((folder / "metrics.json").read_text())
    meta = json.loads((folder / "metrics.meta.json").read_text())["metrics"]
    methods = {key.split("/")[1] for key in metrics if key.startswith(f"{methods_from}/") and key.count("/") >= 2}
    if not methods:
        raise ValueError(f"{folder}: no {methods_from} results, so no method names to read the keys with")
    table: Dict[str, Dict[str, float]] = {}
    directions: Dict[str, bool] = {}
    run_level: Dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        parts = key.split("/")
        if len(parts) > 2 and parts[1] in methods:
            hib = meta.get(key, {}).get("higher_is_better")
            if hib is None or (tests is not None and parts[0] not in tests):
                continue
            column = "/".join([parts[0]] + parts[2:])
            table.setdefault(parts[1], {})[column] = float(value)
            directions[column] = bool(hib)
        else:
            run_level[key] = float(value)
    return table, directions, run_level


def _number_key(column: str) -> List[Tuple[int, float, str]]:
    """Sort key reading the numbers in a column name as numbers (``f1@2`` before ``f1@10``)."""
    return [(1, float(t), "") if re.fullmatch(r"\d+(\.\d+)?", t) else (0, 0.0, t)
            for t in re.split(r"(\d+(?:\.\d+)?)", column)]


def labels(columns: Sequence[str]) -> Dict[str, str]:
    """Column labels: the key without its method, the class setting left out where the test has only one."""
    settings: Dict[str, set] = {}
    for column in columns:
        parts = column.split("/")
        settings.setdefault(parts[0], set()).update(p for p in parts if p in SETTINGS)
    out = {}
    for column in columns:
        parts = column.split("/")
        if len(settings[parts[0]]) == 1:
            parts = [p for p in parts if p not in SETTINGS]
        out[column] = " ".join(parts)
    return out


def number(value: float, column: str) -> str:
    if column.startswith("perturbation/") and column.endswith("auc"):
        return f"{value:.2f}"
    return f"{value:.3e}" if 0 < abs(value) < 1e-3 else f"{value:.4f}"


def against_random(values: Dict[str, float], random: Dict[str, float], directions: Dict[str, bool]
                   ) -> Tuple[List[str], List[str], List[str]]:
    """The columns where ``values`` is better than, worse than and equal to the random map's."""
    better, worse, tied = [], [], []
    for column in sorted(set(values) & set(random), key=_number_key):
        value, reference = values[column], random[column]
        if value == reference:
            tied.append(column)
        elif (value > reference) == directions[column]:
            better.append(column)
        else:
            worse.append(column)
    return better, worse, tied


def _named(columns: List[str], label: Dict[str, str]) -> str:
    """`` (label, label, ...)`` of up to six columns, else nothing."""
    return f" ({', '.join(label[c] for c in columns)})" if 0 < len(columns) <= 6 else ""


def render(folder: Path, first: Sequence[str] = (), anchors: Sequence[str] = ("transformer_attribution", "attnlrp",
                                                                              RANDOM),
           methods_from: str = "perturbation", tests: Optional[Sequence[str]] = None) -> List[str]:
    """The lines of the run's markdown: settings and run-level values, the table, the counts against random."""
    table, directions, run_level = read_run(folder, methods_from, tests)
    columns = sorted(directions, key=_number_key)
    label = labels(columns)
    rest = sorted(m for m in table if m not in first and m not in anchors)
    order = [m for m in first if m in table] + rest + [m for m in anchors if m in table]
    lines = ["run-level: " + ", ".join(f"`{k}` {v:g}" for k, v in sorted(run_level.items())), "",
             "| method | " + " | ".join(label[c] + ARROWS[directions[c]] for c in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for method in order:
        name = f"**{method}**" if method == RANDOM else method
        cells = [number(table[method][c], c) if c in table[method] else "-" for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if RANDOM not in table:
        return lines
    lines.append("")
    for method in order:
        if method == RANDOM:
            continue
        better, worse, tied = against_random(table[method], table[RANDOM], directions)
        counted = len(better) + len(worse) + len(tied)
        line = f"- `{method}`: better than the random map on {len(better)} of {counted} keys"
        if worse:
            line += f", worse on {len(worse)}{_named(worse, label)}"
        if tied:
            line += f", tied on {len(tied)}{_named(tied, label)}"
        lines.append(line)
    return lines


def main(argv: Optional[Sequence[str]] = None) -> List[str]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("run", type=Path, help="run folder (metrics.json, metrics.meta.json)")
    parser.add_argument("--first", nargs="*", default=[], help="methods listed first, in this order")
    parser.add_argument("--anchors", nargs="*", default=["transformer_attribution", "attnlrp", RANDOM],
                        help="methods listed last, in this order")
    parser.add_argument("--methods-from", default="perturbation",
                        help="the test whose keys name the methods (a run without the perturbation test)")
    parser.add_argument("--tests", nargs="*", default=None, help="only the columns of these tests")
    args = parser.parse_args(argv)
    lines = render(args.run, args.first, args.anchors, args.methods_from, args.tests)
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
