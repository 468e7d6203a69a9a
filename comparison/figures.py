"""The comparison's figures, each built twice from the same data: Plotly (for the HTML page) and matplotlib (PNG).

* **perturbation curves** (one figure per class setting and direction): accuracy against the removed fraction,
  one panel per method, one line per run; the same run's ``random`` map as a dotted line in every panel;
* **bars** (one figure per table: perturbation AUCs, each segmentation metric, each CDAM-analysis metric): one
  bar per method and run, the run's ``random`` map marked as a dashed line in its colour;

A run without a value (or a curve) is drawn as an ``x`` marked *missing* at zero, not dropped; a non-finite value
(NaN, infinity) as an ``x`` marked with it (``NaN``, ``inf``).

Run data is text, never markup: every name, key part and title given to Plotly passes :func:`plotly_text` (Plotly
reads ``<b>``-like tags in labels), and a figure's name (its file stem and HTML id) is a :func:`slug`.
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from comparison.runs import Run
from comparison.tables import RANDOM, Table, direction_text, table_title
from evaluation.result_keys import ResultKey

#: one colour per run, in order (Plotly's and matplotlib's default cycles differ: both use this one)
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")


def color(i: int) -> str:
    return COLORS[i % len(COLORS)]


def line_width(i: int) -> float:
    """Earlier runs draw wider lines, so runs with equal curves all stay visible."""
    return max(1.2, 4.0 - 1.2 * i)


def random_lines(table: Table) -> Dict[float, List[int]]:
    """``{random map value: [run indices]}``: one line per distinct value of the runs' random map (a row's
    random value is the same for every row of a run)."""
    lines: Dict[float, List[int]] = {}
    for i, run in enumerate(table.runs):
        randoms = {v for v in (table.cell(r, run).random for r in table.rows) if _finite(v)}
        if len(randoms) == 1:
            value = randoms.pop()
            same = next((v for v in lines if abs(v - value) <= 1e-6 * max(1.0, abs(v))), value)
            lines.setdefault(same, []).append(i)
    return lines


@dataclass
class Figure:
    """One figure: its file stem, title, section (the test) and the Plotly figure; ``png`` once written."""

    name: str
    title: str
    section: str
    plotly: object
    kind: str
    png: Optional[Path] = None


def _finite(v) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def plotly_text(text: object) -> str:
    """``text`` shown as itself in a Plotly label: ``&``, ``<`` and ``>`` as entities, so no tag is read."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slug(text: str) -> str:
    """``text`` as ``[a-z0-9_]`` (a file stem, an HTML id): other characters become ``_``; a text with characters
    beyond letters, digits, spaces and ``_./@-``, or a long one, is cut to 63 and gets a short hash of itself, so
    such texts stay apart (a slug is its own slug)."""
    out = "_".join(p for p in re.split(r"[^a-z0-9]+", text.lower()) if p)
    if len(out) > 72 or not re.fullmatch(r"[\w ./@-]*", text, re.ASCII):
        out = "_".join(p for p in (out[:63].strip("_"), hashlib.sha1(text.encode("utf-8")).hexdigest()[:8]) if p)
    return out or "_"


# ------------------------------------------------------------------------------------------ curves
def curve_groups(runs: Sequence[Run]) -> Dict[Tuple[str, str], List[str]]:
    """``{(setting, direction): [methods]}`` of the perturbation curves any run has."""
    groups: Dict[Tuple[str, str], set] = {}
    for run in runs:
        for key, value in run.metrics.items():
            k = ResultKey.try_parse(key)
            if k is not None and k.test == "perturbation" and k.direction and k.metric == "curve" and isinstance(
                    value, list):
                groups.setdefault((k.setting, k.direction), set()).add(k.method)
    order = {"predicted": 0, "target": 1, "other": 2, "positive": 0, "negative": 1}
    return {g: sorted(m, key=lambda x: (x == RANDOM, x))
            for g, m in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 9), order.get(kv[0][1], 9)))}


def _curve(run: Run, method: str, direction: str, setting: str):
    key = ResultKey("perturbation", method, setting, "curve", direction).format()
    ys = run.metrics.get(key)
    if not isinstance(ys, list):
        return None
    return run.curve_x.get(key) or list(range(len(ys))), [y if _finite(y) else None for y in ys]


def curves_plotly(runs: Sequence[Run], setting: str, direction: str, methods: Sequence[str], ncols: int = 4):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    nrows = math.ceil(len(methods) / ncols)
    titles = []
    for method in methods:
        missing = [plotly_text(r.name) for r in runs if _curve(r, method, direction, setting) is None]
        titles.append(plotly_text(method) + (f"<br><span style='font-size:10px;color:#c00'>missing: "
                                              f"{', '.join(missing)}</span>" if missing else ""))
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=titles, shared_yaxes=True,
                        vertical_spacing=0.5 / max(nrows, 1) if nrows > 1 else 0.1, horizontal_spacing=0.03)
    for i, run in enumerate(runs):
        name = plotly_text(run.name)
        for j, method in enumerate(methods):
            row, col = j // ncols + 1, j % ncols + 1
            curve = _curve(run, method, direction, setting)
            if curve is not None:
                fig.add_trace(go.Scatter(x=curve[0], y=curve[1], mode="lines+markers", name=name,
                                         legendgroup=name, showlegend=j == 0, marker=dict(size=4),
                                         line=dict(color=color(i), width=line_width(i))), row=row, col=col)
            else:
                fig.add_trace(go.Scatter(x=[0.5], y=[0], mode="markers+text", text=["missing"],
                                         textposition="top center", marker=dict(symbol="x", size=10, color=color(i)),
                                         name=f"{name}: missing", legendgroup=name, showlegend=False),
                              row=row, col=col)
            rnd = _curve(run, RANDOM, direction, setting) if method != RANDOM else None
            if rnd is not None:
                fig.add_trace(go.Scatter(x=rnd[0], y=rnd[1], mode="lines", name=f"random ({name})",
                                         legendgroup=f"random {name}", showlegend=j == 0,
                                         line=dict(color=color(i), dash="dot", width=1), opacity=0.6),
                              row=row, col=col)
    fig.update_layout(height=230 * nrows + 120, margin=dict(t=80, l=50, r=20, b=40),
                      title=f"perturbation curves: {plotly_text(direction)} test, {plotly_text(setting)} class "
                            f"(accuracy vs fraction removed; {'lower' if direction == 'positive' else 'higher'}"
                            f" is better)", legend=dict(orientation="h", y=-0.05))
    fig.update_xaxes(range=[-0.02, 1.0])
    fig.update_yaxes(range=[0, 1.02])
    return fig


def curves_png(runs: Sequence[Run], setting: str, direction: str, methods: Sequence[str], path: Path,
               ncols: int = 4) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nrows = math.ceil(len(methods) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 2.4 * nrows + 0.8), sharex=True, sharey=True,
                             squeeze=False)
    for j, method in enumerate(methods):
        ax = axes[j // ncols][j % ncols]
        missing = []
        for i, run in enumerate(runs):
            curve = _curve(run, method, direction, setting)
            if curve is None:
                missing.append(run.name)
                ax.plot([0.5], [0.0], "x", color=color(i), markersize=8)
                continue
            ax.plot(curve[0], [math.nan if y is None else y for y in curve[1]], "-o", markersize=2,
                    color=color(i), label=run.name, linewidth=line_width(i) * 0.7)
            rnd = _curve(run, RANDOM, direction, setting) if method != RANDOM else None
            if rnd is not None:
                ax.plot(rnd[0], [math.nan if y is None else y for y in rnd[1]], ":", color=color(i), alpha=0.6,
                        linewidth=1)
        ax.set_title(method + (f"\nmissing: {', '.join(missing)}" if missing else ""), fontsize=9,
                     color="#c00" if missing else "black")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    for j in range(len(methods), nrows * ncols):
        axes[j // ncols][j % ncols].axis("off")
    handles = [plt.Line2D([], [], color=color(i), label=r.name) for i, r in enumerate(runs)]
    handles.append(plt.Line2D([], [], color="gray", linestyle=":", label="random map (same run)"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=8)
    fig.suptitle(f"perturbation curves: {direction} test, {setting} class (accuracy vs fraction removed)", fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------ bars
def _gap_text(value) -> str:
    """What a bar without a finite value is marked with: ``missing``, or the value (``NaN``, ``inf``, ``-inf``)."""
    return "missing" if value is None else "NaN" if math.isnan(value) else format(value)


def bars_plotly(table: Table):
    import plotly.graph_objects as go

    fig = go.Figure()
    rows = [plotly_text(r) for r in table.rows]
    for i, run in enumerate(table.runs):
        name = plotly_text(run)
        values = [table.cell(r, run).value for r in table.rows]
        fig.add_trace(go.Bar(x=rows, y=[v if _finite(v) else None for v in values], name=name, offsetgroup=str(i),
                             marker_color=color(i), legendgroup=name,
                             marker_line=dict(width=[2.5 if table.cell(r, run).best else 0 for r in table.rows],
                                              color="black")))
        gaps = [(x, _gap_text(v)) for x, v in zip(rows, values) if not _finite(v)]
        if gaps:
            fig.add_trace(go.Scatter(x=[x for x, _ in gaps], y=[0] * len(gaps), mode="markers+text", text=[
                t for _, t in gaps], textposition="top center", marker=dict(symbol="x", size=11, color=color(i)),
                name=f"{name}: missing or non-finite", legendgroup=name, offsetgroup=str(i)))
    for value, indices in random_lines(table).items():   # a legend entry, not a label the bars would hide
        fig.add_trace(go.Scatter(x=[rows[0], rows[-1]], y=[value, value], mode="lines",
                                 line=dict(color=color(indices[0]), dash="dash", width=1.5),
                                 name=plotly_text(f"random map ({', '.join(table.runs[i] for i in indices)})")))
    fig.update_layout(barmode="group", height=380, margin=dict(t=60, l=50, r=20, b=110),
                      title=f"{plotly_text(table_title(table))} ({direction_text(table.direction())}; black outline: "
                            f"best run of the method; dashed: the run's random map)", title_font=dict(size=13),
                      legend=dict(orientation="h", y=1.12, x=0))
    return fig


def bars_png(table: Table, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, runs = table.rows, table.runs
    width = 0.8 / max(len(runs), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows) * max(1, len(runs)) / 2 + 3), 4.0))
    for i, run in enumerate(runs):
        xs = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(rows))]
        values = [table.cell(r, run).value for r in rows]
        ax.bar(xs, [v if _finite(v) else 0.0 for v in values], width=width, color=color(i), label=run,
               edgecolor=["black" if table.cell(r, run).best else color(i) for r in rows],
               linewidth=[2.0 if table.cell(r, run).best else 0.0 for r in rows])
        for x, v in zip(xs, values):
            if not _finite(v):
                ax.plot([x], [0], "x", color=color(i), markersize=9)
                ax.annotate(_gap_text(v), (x, 0), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7,
                            rotation=90, color=color(i))
    for value, indices in random_lines(table).items():
        ax.axhline(value, color=color(indices[0]), linestyle="--", linewidth=1.2,
                   label=f"random map ({', '.join(runs[i] for i in indices)})")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(rows, rotation=40, ha="right", fontsize=8)
    ax.set_title(f"{table_title(table)} ({direction_text(table.direction())})", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------ all
def build_figures(runs: Sequence[Run], tables: Sequence[Table], png_dir: Optional[Path] = None) -> List[Figure]:
    """Every figure (curves per class setting and direction, then bars per table except the clean accuracy),
    each with its PNG under ``png_dir`` when given; names are slugs, unique (a hash added where two would meet)."""
    figures: List[Figure] = []
    names: set = set()

    def unique(text: str) -> str:
        name = slug(text)
        name = name if name not in names else f"{name}_{hashlib.sha1(text.encode('utf-8')).hexdigest()[:8]}"
        names.add(name)
        return name

    for (setting, direction), methods in curve_groups(runs).items():
        name = unique(f"perturbation_curves_{setting}_{direction}")
        fig = Figure(name, f"perturbation curves, {direction} test, {setting} class", "perturbation",
                     curves_plotly(runs, setting, direction, methods), "curves")
        if png_dir is not None:
            fig.png = curves_png(runs, setting, direction, methods, png_dir / f"{name}.png")
        figures.append(fig)
    for table in tables:
        if table.test == "accuracy":
            continue
        name = unique(f"{table.test}_{table.setting}_{table.metric}")
        fig = Figure(name, table_title(table), table.test, bars_plotly(table), "bars")
        if png_dir is not None:
            fig.png = bars_png(table, png_dir / f"{name}.png")
        figures.append(fig)
    return figures
