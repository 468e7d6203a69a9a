"""The self-contained HTML dashboard: one file that opens from disk with no server and no network.

Plotly's JavaScript is embedded once in the page (``plotly.offline.get_plotlyjs``), every figure is a ``div`` with
its data inline, the styles are inline; nothing is loaded from elsewhere (no ``src``/``href`` to http(s)).
Sections: the runs (source, kind, group, tags, reference), the settings and config differences, then per test
its tables (best of each row in bold, the run's random map in grey, the delta to the reference coloured by whether
it is better or worse in the metric's declared direction, missing values shaded, non-finite values flagged) and its
figures. With the meta-evaluation (:mod:`comparison.meta`): the sanity checks (method x check, pass / fail per run),
the meta-evaluation table (ranking, Kendall's W, Krippendorff's alpha, rank intervals, separation, oracle rank, the
failed rules), the metric-agreement heatmap (tau-b, contradictory pairs flagged), and a mark on every results table
whose metric fails a rule; the map gallery (:mod:`comparison.gallery`). Run data is text, never markup: every
name, key, config value and title is escaped
(:func:`esc`), and every ``id`` is a slug (:func:`comparison.figures.slug`).
"""
from __future__ import annotations

import html
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from comparison.configs import config_differences, config_summary
from comparison.figures import Figure, color, slug
from comparison.gallery import gallery_sections
from comparison.meta import ALPHA, RELIABILITY_MIN, STABILITY_MIN, Failure, MetaReport
from comparison.runs import Run
from comparison.tables import Table, direction_text, number_text, table_title

STYLE = """
body { font-family: -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 0 1.5em 3em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 2px solid #ddd; padding-top: 0.6em; } h3 { margin-bottom: 0.3em; }
table { border-collapse: collapse; margin: 0.4em 0 1.2em; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: right; vertical-align: top; }
th { background: #f4f4f4; } td.name, th.name { text-align: left; white-space: nowrap; }
td.best .v { font-weight: bold; } td.best { background: #eef7ee; }
td.nonfinite { background: #fde8c8; color: #a40; }
td.missing { background: repeating-linear-gradient(45deg, #fff0f0, #fff0f0 6px, #fbe0e0 6px, #fbe0e0 12px);
             color: #b00; font-style: italic; text-align: center; }
.rnd { color: #888; font-size: 11px; } .better { color: #187a18; } .worse { color: #b81c1c; } .zero { color: #888; }
.note { color: #555; font-size: 13px; } .differs { background: #fff6d8; }
pre.cfg { white-space: pre-wrap; text-align: left; margin: 0; font-size: 11px; max-width: 36em; }
nav a { margin-right: 1em; } .figure { margin: 0.5em 0 1.5em; border: 1px solid #eee; }
.metafail { color: #b81c1c; font-weight: bold; font-size: 12px; } td.pass { background: #eef7ee; }
td.fail { background: #fbe0e0; color: #b81c1c; font-weight: bold; } td.tau { min-width: 3em; text-align: center; }
.gallery td.gcell { padding: 2px; } img.gmap { width: 96px; image-rendering: pixelated; display: block; }
.gtext { max-width: 22em; text-align: left; font-size: 12px; line-height: 1.6; } .gword { padding: 0 2px; }
.swatch { display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.3em; vertical-align: middle; }
"""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _num(value: Optional[float], fmt: str, signed: bool = False) -> str:
    return esc(number_text(value, fmt, signed))


def runs_section(runs: Sequence[Run], reference: str) -> str:
    rows = []
    for i, run in enumerate(runs):
        ref = " (reference)" if run.name == reference else ""
        scalars = sum(1 for v in run.metrics.values() if not isinstance(v, list))
        rows.append(f"<tr><td class='name'><span class='swatch' style='background:{color(i)}'></span>"
                    f"{esc(run.name)}{ref}</td><td class='name'>{esc(run.kind)}</td><td class='name'>"
                    f"{esc(run.source)}</td><td class='name'>{esc(run.group or '')}</td><td class='name'>"
                    f"{esc(', '.join(run.tags))}</td><td>{scalars}</td><td>{'yes' if run.config else 'no'}</td></tr>")
    return ("<table><tr><th class='name'>run</th><th class='name'>kind</th><th class='name'>source</th>"
            "<th class='name'>group</th><th class='name'>tags</th><th>scalars</th><th>config</th></tr>"
            + "".join(rows) + "</table>")


def config_section(runs: Sequence[Run]) -> str:
    names = [run.name for run in runs]
    head = "".join(f"<th class='name'>{esc(n)}</th>" for n in names)
    rows = []
    for section, label, texts, differs in config_summary(runs):
        cls = " class='differs'" if differs else ""
        cells = "".join(f"<td><pre class='cfg'>{esc(texts[n])}</pre></td>" for n in names)
        rows.append(f"<tr{cls}><td class='name'>{esc(section)}</td><td class='name'>{esc(label)}"
                    f"{' <b>(differs)</b>' if differs else ''}</td>{cells}</tr>")
    out = ["<h3>settings that explain results</h3>",
           "<p class='note'>highlighted: the runs differ in this setting</p>",
           f"<table><tr><th class='name'>section</th><th class='name'>setting</th>{head}</tr>{''.join(rows)}</table>",
           "<h3>every config key that differs</h3>"]
    diffs = config_differences(runs)
    if not diffs:
        out.append("<p class='note'>" + ("none: the configs are equal" if any(r.config for r in runs) else
                                          "no run has a config") + "</p>")
    else:
        body = "".join(f"<tr><td class='name'>{esc(key)}</td>"
                       + "".join(f"<td><pre class='cfg'>{esc(texts[n])}</pre></td>" for n in names) + "</tr>"
                       for key, texts in diffs)
        out.append(f"<table id='config-differences'><tr><th class='name'>key</th>{head}</tr>{body}</table>")
    return "\n".join(out)


def changes_section(tables: Sequence[Table], reference: str, limit: int = 40) -> str:
    """Per run, the values that differ from the reference run's (and those only one of them has)."""
    out = []
    for run in (tables[0].runs if tables else []):
        if run == reference:
            continue
        changed, gaps, compared = [], [], 0
        for table in tables:
            for row in table.rows:
                cell, ref = table.cell(row, run), table.cell(row, reference)
                if cell.missing != ref.missing or cell.non_finite or ref.non_finite:
                    where = (f"missing in {run}" if cell.missing else f"only in {run}" if ref.missing else
                             f"non-finite: {number_text(ref.value, '')} vs {number_text(cell.value, '')}")
                    gaps.append(f"{table_title(table)}: {row} ({where})")
                elif cell.delta is not None:
                    compared += 1
                    if cell.delta != 0:
                        changed.append((table, row, cell, ref))
        head = (f"<h3>{esc(run)} vs {esc(reference)}</h3><p class='note'>{len(changed)} of {compared} values differ"
                f"{'; ' + str(len(gaps)) + ' present in only one of the two' if gaps else ''}</p>")
        rows = []
        for table, row, cell, ref in changed[:limit]:
            hib = table.higher_is_better.get(row)
            good = None if hib is None else (cell.delta > 0) == hib
            cls = {True: "better", False: "worse", None: ""}[good]
            rows.append(f"<tr><td class='name'>{esc(table_title(table))}</td><td class='name'>{esc(row)}</td>"
                        f"<td>{_num(ref.value, table.fmt)}</td><td>{_num(cell.value, table.fmt)}</td>"
                        f"<td class='{cls}'>{_num(cell.delta, table.fmt, signed=True)}</td></tr>")
        more = f"<p class='note'>and {len(changed) - limit} more (tables below)</p>" if len(changed) > limit else ""
        table_html_ = (f"<table class='changes'><tr><th class='name'>table</th><th class='name'>method</th>"
                       f"<th>{esc(reference)}</th><th>{esc(run)}</th><th>Δ</th></tr>{''.join(rows)}</table>"
                       if rows else "")
        gap_html = "".join(f"<li>{esc(g)}</li>" for g in gaps[:limit])
        out.append(head + table_html_ + more + (f"<ul class='note'>{gap_html}</ul>" if gaps else ""))
    return "\n".join(out)


def meta_mark(failures: Sequence[Failure]) -> str:
    """The mark of a results table whose metric fails the meta-evaluation: each rule, its measurement as a title."""
    if not failures:
        return ""
    rules = ", ".join(dict.fromkeys(f.rule for f in failures))
    details = "; ".join(f.detail for f in failures)
    return (f"<p class='metafail' data-meta-fail='{esc(rules)}' title='{esc(details)}'>fails the meta-evaluation: "
            f"{esc(rules)} ({esc(details)})</p>")


def table_html(table: Table, failures: Sequence[Failure] = ()) -> str:
    head = "".join(f"<th>{esc(run)}{' (reference)' if run == table.reference else ''}</th>" for run in table.runs)
    body = []
    for row in table.rows:
        hib = table.higher_is_better.get(row)
        cells = []
        for run in table.runs:
            cell = table.cell(row, run)
            if cell.missing:
                cells.append("<td class='missing' data-missing='1'>missing</td>")
                continue
            parts = [f"<span class='v'>{_num(cell.value, table.fmt)}</span>"]
            if cell.random is not None:
                parts.append(f" <span class='rnd'>(random {_num(cell.random, table.fmt)})</span>")
            if cell.delta is not None:
                good = None if hib is None or cell.delta == 0 else (cell.delta > 0) == hib
                cls = "zero" if cell.delta == 0 else {True: "better", False: "worse", None: ""}[good]
                delta = "0" if cell.delta == 0 else _num(cell.delta, table.fmt, signed=True)
                parts.append(f"<br><span class='{cls}'>Δ {delta}</span>")
            cls = "best" if cell.best else "nonfinite" if cell.non_finite else ""
            flag = " <b title='not a finite number'>(non-finite)</b>" if cell.non_finite else ""
            cells.append(f"<td class='{cls}' data-value='{cell.value!r}'>{''.join(parts)}{flag}</td>")
        body.append(f"<tr><td class='name'>{esc(row)}</td>{''.join(cells)}</tr>")
    return (f"<h3>{esc(table_title(table))}</h3>{meta_mark(failures)}"
            f"<p class='note'>{esc(direction_text(table.direction()))}; bold: "
            f"best run of the row; grey: the same run's random map; Δ: difference to {esc(table.reference)} "
            f"(green better, red worse)</p><table class='metrics' data-title='{esc(table_title(table))}'>"
            f"<tr><th class='name'>method</th>{head}</tr>{''.join(body)}</table>")


# ------------------------------------------------------------------------------------------ meta-evaluation
def _tau_color(tau: float) -> str:
    """Red (-1) through white (0) to green (+1); grey when not comparable."""
    if not math.isfinite(tau):
        return "#eeeeee"
    t = max(-1.0, min(1.0, tau))
    r, g, b = (255, int(255 * (1 + t)), int(255 * (1 + t))) if t < 0 else (int(255 * (1 - t)), 255, int(255 * (1 - t)))
    return f"rgb({r},{min(g, 255)},{min(b, 255)})"


def agreement_html(report: MetaReport) -> str:
    """The metric-agreement heatmap: Kendall's tau-b of every pair of metrics' method scores (mean over runs)."""
    names = report.agreement_names
    if len(names) < 2:
        return "<p class='note'>fewer than two metrics of methods: no agreement to show</p>"
    head = "".join(f"<th class='name'>{esc(n)}</th>" for n in names)
    rows = []
    contradictory = set(report.contradictory) | {(b, a) for a, b in report.contradictory}
    for i, a in enumerate(names):
        cells = []
        for j, b in enumerate(names):
            tau = float(report.agreement[i, j])
            flag = " <b title='contradictory: the two metrics rank the methods in opposite orders'>✗</b>" \
                if (a, b) in contradictory else ""
            text = "" if not math.isfinite(tau) else f"{tau:+.2f}"
            cells.append(f"<td class='tau' style='background:{_tau_color(tau)}' data-tau='{text}'>{text}{flag}</td>")
        rows.append(f"<tr><td class='name'>{esc(a)}</td>{''.join(cells)}</tr>")
    pairs = "".join(f"<li>{esc(a)} vs {esc(b)}</li>" for a, b in report.contradictory)
    return ("<p class='note'>Kendall's tau-b between the method rankings of every pair of metrics (each read in its "
            "declared direction, on the methods both score, averaged over the runs); ✗: contradictory (tau &lt; 0)"
            f"</p><table id='meta-agreement'><tr><th class='name'>metric</th>{head}</tr>{''.join(rows)}</table>"
            + (f"<p class='note'>contradictory pairs:</p><ul class='note'>{pairs}</ul>" if pairs else ""))


def _values(values: Mapping[str, float], fmt: str = ".3f") -> str:
    return "<br>".join(f"{esc(k)}: {esc(format(v, fmt) if math.isfinite(v) else 'NaN')}" for k, v in values.items())


def stability_html(report: MetaReport) -> str:
    """Per metric: Kendall's W across seeds, Krippendorff's alpha per run, the bootstrap rank intervals, the
    separation from the random map, the oracle's rank and the failed rules."""
    if not report.metrics:
        return "<p class='note'>no metric of methods with a declared direction</p>"
    rows = []
    for m in report.metrics:
        intervals = "<br>".join(
            f"{esc(run)}: " + ", ".join(f"{esc(meth)} {mean:.2f} [{lo:g}, {hi:g}]"
                                        for meth, (mean, lo, hi) in sorted(iv.items(), key=lambda x: x[1][0]))
            for run, iv in m.intervals.items())
        separated = "<br>".join(f"{esc(run)}: {sum(s.values())} of {len(s)} differ"
                                + ("" if m.powered.get(run, True) else " (too few samples to separate: not judged)")
                                for run, s in m.separated.items())
        ranks = "<br>".join(f"{esc(run)}: " + " &gt; ".join(esc(k) for k, _ in sorted(r.items(), key=lambda x: x[1]))
                            for run, r in m.ranks.items())
        rules = ", ".join(dict.fromkeys(f.rule for f in m.failures))
        cls = "fail" if m.failures else "pass"
        rows.append(f"<tr data-metric='{esc(m.name)}'><td class='name'>{esc(m.name)}</td>"
                    f"<td class='name'>{'higher' if m.higher_is_better else 'lower'}</td>"
                    f"<td class='name'>{ranks}</td><td>{_values(m.stability)}</td>"
                    f"<td>{_values(m.reliability)}</td><td class='name'>{intervals}</td><td>{separated}</td>"
                    f"<td>{_values(m.oracle_rank, 'g')}</td>"
                    f"<td class='{cls}' title='{esc('; '.join(f.detail for f in m.failures))}'>"
                    f"{esc(rules) if rules else 'pass'}</td></tr>")
    groups = "; ".join(f"{esc(label)}: {esc(', '.join(names))}" for label, names in report.groups.items())
    return (f"<p class='note'>stability: Kendall's W of the method ranking across the runs that differ only in seeds "
            f"(unstable below {STABILITY_MIN}; seed groups: {groups}); reliability: Krippendorff's alpha of the "
            f"per-sample method rankings (unreliable below {RELIABILITY_MIN}); rank intervals: 95% bootstrap over "
            f"the samples; separation: methods whose per-sample scores differ from the random map's (Wilcoxon, "
            f"Holm, alpha {ALPHA})</p><table id='meta-stability'><tr><th class='name'>metric</th>"
            "<th class='name'>better</th><th class='name'>ranking per run</th><th>Kendall's W</th>"
            "<th>Krippendorff's alpha</th><th class='name'>rank intervals</th><th>separation from random</th>"
            "<th>oracle rank</th><th>meta-evaluation</th></tr>" + "".join(rows) + "</table>")


def sanity_html(sanity: Mapping[Tuple[str, str], Mapping[str, Optional[float]]], runs: Sequence[str]) -> str:
    """Method x check, pass / fail per run (the ``sanity/.../*_pass`` keys)."""
    head = "".join(f"<th>{esc(r)}</th>" for r in runs)
    rows = []
    for (method, check), values in sanity.items():
        cells = []
        for run in runs:
            v = values.get(run)
            if v is None:
                cells.append("<td class='missing'>missing</td>")
            elif not math.isfinite(v):
                cells.append("<td class='nonfinite' data-sanity='nan'>not judged</td>")
            else:
                cells.append(f"<td class='{'pass' if v else 'fail'}' data-sanity='{'pass' if v else 'fail'}'>"
                             f"{'pass' if v else 'fail'}</td>")
        rows.append(f"<tr><td class='name'>{esc(method)}</td><td class='name'>{esc(check)}</td>{''.join(cells)}</tr>")
    return ("<p class='note'>randomisation sanity checks: a map that depends on the model passes</p>"
            f"<table id='sanity-table'><tr><th class='name'>method</th><th class='name'>check</th>{head}</tr>"
            + "".join(rows) + "</table>")


def meta_sections(report: Optional[MetaReport], sanity: Mapping, runs: Sequence[str]) -> List[Tuple[str, str, str]]:
    """``[(id, heading, html)]`` of the meta-evaluation sections the runs have."""
    out = []
    if sanity:
        out.append(("sanity checks", "sanity checks", sanity_html(sanity, runs)))
    if report is not None and report.metrics:
        out.append(("meta-evaluation", "meta-evaluation of the metrics", stability_html(report)))
        out.append(("metric agreement", "metric agreement", agreement_html(report)))
    return out


def figure_html(figure: Figure) -> str:
    div = figure.plotly.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{slug(figure.name)}",
                                config={"displaylogo": False, "responsive": True})
    return f"<div class='figure' data-figure='{esc(figure.name)}'>{div}</div>"


def dashboard(runs: Sequence[Run], tables: Sequence[Table], figures: Sequence[Figure], reference: str,
              title: str = "run comparison", meta: Optional[MetaReport] = None,
              sanity: Optional[Mapping] = None, galleries: Optional[Mapping[str, Any]] = None) -> str:
    """The whole page (module docstring); ``galleries``: ``{run name: gallery}`` (:mod:`comparison.gallery`)."""
    from plotly.offline import get_plotlyjs

    failures: Dict[Tuple[str, str, str], List[Failure]] = meta.failures() if meta is not None else {}
    extra = meta_sections(meta, sanity or {}, [r.name for r in runs])
    at = 1 if sanity else 0     # the gallery next to the sanity table that scores its randomised maps
    extra[at:at] = gallery_sections(runs, dict(galleries or {}))
    sections: List[str] = [f"<h2 id='{slug(sid)}'>{esc(heading)}</h2>{body}" for sid, heading, body in extra]
    tests = list(dict.fromkeys([t.test for t in tables] + [f.section for f in figures]))
    for test in tests:
        parts = [f"<h2 id='{slug(test)}'>{esc(test)}</h2>"]
        parts += [table_html(t, failures.get((t.test, t.setting, t.metric), ())) for t in tables if t.test == test]
        parts += [figure_html(f) for f in figures if f.section == test]
        sections.append("\n".join(parts))
    nav = "".join(f"<a href='#{slug(t)}'>{esc(t)}</a>" for t in ["runs", "changes", "config"]
                  + [sid for sid, _, _ in extra] + tests)
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{esc(title)}</title>"
            f"<style>{STYLE}</style>\n<script type='text/javascript'>{get_plotlyjs()}</script>\n</head><body>"
            f"<h1>{esc(title)}</h1><nav>{nav}</nav>"
            f"<h2 id='runs'>runs</h2>{runs_section(runs, reference)}"
            f"<h2 id='changes'>what differs from {esc(reference)}</h2>{changes_section(tables, reference)}"
            f"<h2 id='config'>config differences</h2>{config_section(runs)}"
            + "\n".join(sections) + "</body></html>\n")
