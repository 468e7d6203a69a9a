"""A W&B report with the dashboard's panels, built from code (``wandb-workspaces``: ``wandb_workspaces.reports.v2``).

:func:`build_report` only builds the report object (no network); :func:`save_report` sends it (online, needs
``wandb login``). The report holds, for the runs compared (a run set selecting them by W&B run id where known):

* the runs and the config differences (a ``RunComparer`` showing only differing keys, and the settings table);
* per test: the methods x runs tables as Markdown (best marked, random map, deltas), a bar chart per table
  (``BarPlot`` of the table's keys, the ``random`` map among them), and the logged tables: the perturbation
  ``curves`` (key, step, fraction, value) and the per-method tables each evaluate run logs (``<test>_by_method``).
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

from comparison.configs import differences_markdown
from comparison.runs import Run
from comparison.tables import Table, table_markdown, table_title

#: the tests whose per-method table ``<test>_by_method`` the reporter logs (``callbacks.reporter``)
BY_METHOD_TESTS = ("perturbation", "segmentation", "cdam_analysis")


def run_id(run: Run) -> Optional[str]:
    """The W&B id of a run: online runs from their source, offline run folders from their name."""
    if run.kind == "wandb-online":
        return run.source.rsplit("/", 1)[-1]
    if run.kind == "wandb-offline":
        return Path(run.source).name.rsplit("-", 1)[-1]
    return None


def build_report(runs: Sequence[Run], tables: Sequence[Table], project: str, entity: Optional[str] = None,
                 title: str = "run comparison", description: str = ""):
    """The report object (nothing is sent; :func:`save_report` sends it)."""
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    ids = [i for i in (run_id(r) for r in runs) if i]
    filters = expr.And(expr.Metric("ID").isin(ids)) if ids else ""
    where = dict(project=project, **({"entity": entity} if entity else {}))

    def grid(panels: List) -> "wr.PanelGrid":
        return wr.PanelGrid(runsets=[wr.Runset(name="compared runs", filters=filters, **where)], panels=panels)

    blocks: List = [wr.H1(text=title),
                    wr.P(text=f"{len(runs)} runs: " + ", ".join(r.name for r in runs)
                         + (f"; deltas against {tables[0].reference}" if tables else "")),
                    wr.H2(text="config differences"),
                    grid([wr.RunComparer(diff_only="split", layout=wr.Layout(w=24, h=12))]),
                    wr.MarkdownBlock(text=differences_markdown(runs))]
    for test in dict.fromkeys(t.test for t in tables):
        blocks.append(wr.H2(text=test))
        panels: List = []
        for table in (t for t in tables if t.test == test):
            blocks.append(wr.MarkdownBlock(text=table_markdown(table)))
            if test != "accuracy":
                panels.append(wr.BarPlot(title=table_title(table), metrics=[table.keys[r] for r in table.rows],
                                         orientation="v", layout=wr.Layout(w=12, h=8)))
        if test == "perturbation":
            panels.append(wr.WeavePanelSummaryTable(table_name="curves", layout=wr.Layout(w=24, h=10)))
        if test in BY_METHOD_TESTS:
            panels.append(wr.WeavePanelSummaryTable(table_name=f"{test}_by_method", layout=wr.Layout(w=24, h=10)))
        if panels:
            blocks.append(grid(panels))
    return wr.Report(title=title, description=description, blocks=blocks, **where)


def save_report(report, draft: bool = False) -> str:
    """Send the report to W&B (online); returns its URL."""
    report.save(draft=draft)
    return report.url
