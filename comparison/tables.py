"""Methods x runs tables of every metric, per test and class setting.

Each result key of a run (``metrics.json`` keys, :class:`evaluation.result_keys.ResultKey`) is placed by its
*test*, *class setting*, *metric* and *row* (its method; a method pair ``a vs b`` for the CDAM analysis' Pearson
correlations; ``model`` for the clean accuracy; ``-`` for a key without a method):

* ``perturbation/<method>/<direction>/<setting>/auc``  -> (perturbation, setting, ``<direction> AUC``, method)
  (the curves are drawn, not tabulated);
* ``segmentation/<method>/<metric>``                   -> (segmentation, -, metric, method)
* ``cdam_analysis/pearson/<a>__vs__<b>``               -> (cdam_analysis, -, pearson, ``a vs b``)
* ``cdam_analysis/discrimination/<method>/<metric>``   -> (cdam_analysis, -, ``discrimination/<metric>``, method)
* ``cdam_analysis/<metric>/<method>``                  -> (cdam_analysis, -, metric, method)
* ``accuracy``                                         -> (accuracy, -, accuracy, model); any other key
  ``<test>[/<method>[/<setting>]]/<metric>`` -> (test, setting, metric, method), e.g. the rationale and ERASER
  tests' scalars.

Every cell holds the run's value, the same run's ``random`` map value for that metric (where the random map has
one), the delta against the reference run and whether it is the best of its row. The best follows the direction
the metric declares (the run's ``metrics.meta.json``, :mod:`comparison.directions` for older runs); a row whose
runs all tie, or with fewer than two values, or whose metric declares no direction, marks none. A run without a
value for a row (the metric was not computed, or was ``null``) gets a *missing* cell: the row is kept. A non-finite
value (``NaN``, ``Infinity`` in ``metrics.json``) is shown as such (``NaN``, ``inf``, ``-inf``) and flagged; it has
no delta (never a tie), is never the best, and a non-finite reference value gives its row no deltas.

The exports hold run data as text: Markdown escapes ``&``, ``<``, ``>`` (and ``|``) in every name, key and title
(:func:`md_text`); the CSV prefixes a text cell that starts with ``=``, ``+``, ``-`` or ``@`` with ``'`` so no
spreadsheet reads it as a formula (:func:`csv_text`; numbers stay numbers).
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from comparison.runs import Run
from evaluation.result_keys import ResultKey

RANDOM = "random"
TEST_ORDER = ("accuracy", "perturbation", "segmentation", "cdam_analysis")
SETTING_ORDER = ("predicted", "target", "other", "")
PERTURBATION_METRICS = ("positive AUC", "negative AUC")
SEGMENTATION_METRICS = ("pixel_accuracy", "miou", "map", "f1", "f1_rows")
#: relative difference below which two values tie (W&B summaries hold float32 copies of the float64 results)
TIE = 1e-6


def same(a: float, b: float) -> bool:
    """Whether ``a`` and ``b`` tie (relative tolerance ``TIE``)."""
    return abs(a - b) <= TIE * max(1.0, abs(a), abs(b))


@dataclass(frozen=True)
class KeyInfo:
    test: str
    setting: str
    metric: str
    row: str
    random_key: Optional[str]


def parse_key(key: str) -> Optional[KeyInfo]:
    """The table position of a scalar result key (``None`` for curves and keys that are no result)."""
    k = ResultKey.try_parse(key)
    if k is None:
        return None
    if k.test == "accuracy" and k.metric == "accuracy":
        return KeyInfo("accuracy", "", "accuracy", "model", None)
    if k.test == "perturbation":
        if not k.direction or k.metric != "auc":
            return None
        return KeyInfo("perturbation", k.setting, f"{k.direction} AUC", k.method, k.with_method(RANDOM).format())
    if k.test == "cdam_analysis" and k.metric == "pearson":
        return KeyInfo(k.test, "", "pearson", k.method.replace("__vs__", " vs "), None)
    if not k.method:
        return KeyInfo(k.test, k.setting, k.metric, "-", None)
    return KeyInfo(k.test, k.setting, k.metric, k.method, k.with_method(RANDOM).format())


@dataclass
class Cell:
    value: Optional[float]
    random: Optional[float] = None
    delta: Optional[float] = None
    best: bool = False

    @property
    def missing(self) -> bool:
        return self.value is None

    @property
    def non_finite(self) -> bool:
        return self.value is not None and not math.isfinite(self.value)


@dataclass
class Table:
    """One methods x runs table: a test, class setting and metric."""

    test: str
    setting: str
    metric: str
    runs: List[str]
    reference: str
    rows: List[str] = field(default_factory=list)
    keys: Dict[str, str] = field(default_factory=dict)                    # row -> result key
    higher_is_better: Dict[str, Optional[bool]] = field(default_factory=dict)   # row -> declared direction
    cells: Dict[Tuple[str, str], Cell] = field(default_factory=dict)      # (row, run) -> cell

    @property
    def fmt(self) -> str:
        return ".2f" if self.test == "perturbation" else ".4f"

    def direction(self) -> Optional[bool]:
        """The table's direction when every row declares the same one, else ``None``."""
        found = {self.higher_is_better.get(r) for r in self.rows}
        return found.pop() if len(found) == 1 else None

    def cell(self, row: str, run: str) -> Cell:
        return self.cells[(row, run)]


def _sort_key(table: Table) -> tuple:
    test = TEST_ORDER.index(table.test) if table.test in TEST_ORDER else len(TEST_ORDER)
    setting = SETTING_ORDER.index(table.setting) if table.setting in SETTING_ORDER else len(SETTING_ORDER)
    order = PERTURBATION_METRICS + SEGMENTATION_METRICS
    metric = order.index(table.metric) if table.metric in order else len(order)
    return (test, table.test, setting, table.setting, metric, table.metric)


def _row_sort(row: str) -> tuple:
    return (row == RANDOM, row)   # the random map last: the floor every row is read against


def mark_best(values: Dict[str, Optional[float]], higher_is_better: Optional[bool]) -> List[str]:
    """The runs holding the best of ``values`` (none: no direction, fewer than two values, or all tie)."""
    present = {run: v for run, v in values.items() if v is not None and math.isfinite(v)}
    if higher_is_better is None or len(present) < 2:
        return []
    best = max(present.values()) if higher_is_better else min(present.values())
    if same(max(present.values()), min(present.values())):
        return []
    return [run for run, v in present.items() if same(v, best)]


def build_tables(runs: Sequence[Run], reference: Optional[str] = None) -> List[Table]:
    """Every test x class setting x metric table over ``runs`` (module docstring); deltas against the run named
    ``reference`` (default: the first run)."""
    if not runs:
        raise ValueError("no runs to compare")
    names = [r.name for r in runs]
    reference = names[0] if reference is None else reference
    if reference not in names:
        raise ValueError(f"reference run {reference!r} is not among the runs {names}")
    ref_run = runs[names.index(reference)]
    tables: Dict[Tuple[str, str, str], Table] = {}
    for run in runs:
        for key, value in run.metrics.items():
            if isinstance(value, list):
                continue
            info = parse_key(key)
            if info is None:
                continue
            table = tables.setdefault((info.test, info.setting, info.metric),
                                      Table(info.test, info.setting, info.metric, names, reference))
            if info.row not in table.keys:
                table.rows.append(info.row)
                table.keys[info.row] = key
            if table.higher_is_better.get(info.row) is None:
                table.higher_is_better[info.row] = run.higher_is_better.get(key)
    for table in tables.values():
        table.rows.sort(key=_row_sort)
        for row in table.rows:
            key = table.keys[row]
            info = parse_key(key)
            ref_value = ref_run.scalar(key)
            for run in runs:
                value = run.scalar(key)
                random = run.scalar(info.random_key) if info.random_key and row != RANDOM else None
                delta = None if run.name == reference or not _finite(value) or not _finite(ref_value) else (
                    0.0 if same(value, ref_value) else value - ref_value)
                table.cells[(row, run.name)] = Cell(value, random, delta)
            for name in mark_best({n: table.cells[(row, n)].value for n in names}, table.higher_is_better.get(row)):
                table.cells[(row, name)].best = True
    return sorted(tables.values(), key=_sort_key)


def _finite(value: Optional[float]) -> bool:
    return value is not None and math.isfinite(value)


# ------------------------------------------------------------------------------------------ text output
def number_text(value: Optional[float], fmt: str, signed: bool = False) -> str:
    """``value`` formatted; ``NaN``, ``inf``, ``-inf`` as such; empty for ``None``."""
    if value is None:
        return ""
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else format(value)
    return format(value, ("+" if signed else "") + fmt)


def md_text(text: object) -> str:
    """``text`` as literal Markdown table text: ``&``, ``<``, ``>`` as entities, ``|`` escaped, lines joined."""
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
            .replace("\n", "<br>"))


def csv_text(text: object) -> str:
    """A CSV text cell no spreadsheet reads as a formula: one starting with ``=``, ``+``, ``-``, ``@`` gets ``'``."""
    text = str(text)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def cell_text(table: Table, row: str, run: str, markdown: bool = True) -> str:
    """``**v** (random r) Δ d``: the value (bold when best), the run's random map, the delta to the reference;
    ``missing`` when the run has no value; a non-finite value flagged ``NaN (non-finite)``."""
    cell = table.cell(row, run)
    if cell.missing:
        return "*missing*" if markdown else "missing"
    text = number_text(cell.value, table.fmt) + (" (non-finite)" if cell.non_finite else "")
    if cell.best:
        text = f"**{text}**" if markdown else f"{text} (best)"
    if cell.random is not None:
        text += f" (random {number_text(cell.random, table.fmt)})"
    if cell.delta is not None:
        text += " Δ 0" if cell.delta == 0 else f" Δ {number_text(cell.delta, table.fmt, signed=True)}"
    return text


def direction_text(higher_is_better: Optional[bool]) -> str:
    return {True: "higher is better", False: "lower is better", None: "no direction"}[higher_is_better]


def table_markdown(table: Table) -> str:
    """One table as Markdown (a heading, the direction, the grid)."""
    header = ["method"] + [md_text(run) + (" (reference)" if run == table.reference else "") for run in table.runs]
    lines = [f"### {md_text(table_title(table))}", "",
             f"{direction_text(table.direction())}; **bold**: best of the row; (random r): the same run's random "
             f"map; Δ: difference to {md_text(table.reference)}", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table.rows:
        lines.append("| " + " | ".join([md_text(row)] + [cell_text(table, row, run) for run in table.runs]) + " |")
    return "\n".join(lines)


def table_title(table: Table) -> str:
    parts = [table.test]
    if table.setting:
        parts.append(f"{table.setting} class")
    if table.metric != table.test:
        parts.append(table.metric)
    return " / ".join(parts)


def tables_markdown(tables: Sequence[Table]) -> str:
    return "\n\n".join(table_markdown(t) for t in tables) + "\n"


CSV_COLUMNS = ["test", "class_setting", "metric", "method", "run", "key", "value", "random", "delta_vs_reference",
               "best", "higher_is_better", "missing", "non_finite"]


def tables_csv(tables: Sequence[Table]) -> str:
    """Every cell of every table, one CSV row each (long format; ``CSV_COLUMNS``)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for table in tables:
        for row in table.rows:
            for run in table.runs:
                cell = table.cell(row, run)
                hib = table.higher_is_better.get(row)
                writer.writerow([*map(csv_text, (table.test, table.setting, table.metric, row, run, table.keys[row])),
                                 "" if cell.value is None else repr(cell.value),
                                 "" if cell.random is None else repr(cell.random),
                                 "" if cell.delta is None else repr(cell.delta),
                                 int(cell.best), "" if hib is None else str(hib).lower(), int(cell.missing),
                                 int(cell.non_finite)])
    return out.getvalue()
