"""``compare.py``'s command line: runs in, dashboard, figures and tables out.

    python compare.py RUN [RUN ...] [--names A B ...] [--reference NAME] [--out DIR] [--title TEXT]
    python compare.py --wandb-project token-attributions [--wandb-entity E] [--wandb-filters JSON] ...
    python compare.py RUN ... --wandb-report --wandb-project P [--wandb-entity E]

A RUN is a run folder (``metrics.json``, ``config.yaml``), its ``metrics.json``, or an offline W&B run folder
(``outputs/wandb/offline-run-*``). ``--wandb-project`` (online) adds the project's runs that match the filters.
Written under ``--out`` (default ``outputs/compare/<date-time>``):

* ``dashboard.html``: the self-contained page (opens from disk; Plotly's JavaScript embedded);
* ``figures/*.png``: the same figures (matplotlib);
* ``tables.md`` / ``tables.csv``: every methods x runs table (Markdown; CSV one row per cell);
* ``config_differences.md``: the settings and every differing config key;
* ``meta.md``: the meta-evaluation of the metrics (:mod:`comparison.meta`): stability, reliability, separation.

The page also shows the sanity checks (method x check, pass / fail), the meta-evaluation table and the
metric-agreement heatmap, marks the results tables whose metric fails the meta-evaluation, and shows the map
gallery: the maps the runs kept of the same samples (``gallery.npz``), across runs and on the randomised models.

    python compare.py sweep CONFIG --seeds 0 1 2 [--out DIR] [-- EVALUATE ARGS]

reruns an evaluation config over seeds into sibling run folders and compares them (:mod:`comparison.sweep`).

``--wandb-report`` also builds a W&B report with the same panels and saves it to ``--wandb-project`` (online).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from comparison.configs import differences_markdown
from comparison.figures import Figure, build_figures
from comparison.gallery import galleries_of
from comparison.html import dashboard
from comparison.meta import MetaReport, meta_evaluate, meta_markdown, sanity_table
from comparison.runs import Run, RunLoadError, load_runs, load_wandb_project
from comparison.sweep import compare_args, sweep
from comparison.tables import Table, build_tables, md_text, tables_csv, tables_markdown
from comparison.wandb_report import build_report, save_report


@dataclass
class Comparison:
    """What :func:`main` built and wrote."""

    runs: List[Run]
    reference: str
    tables: List[Table]
    figures: List[Figure]
    out: Path
    files: Dict[str, Path] = field(default_factory=dict)
    report: Any = None
    meta: Optional[MetaReport] = None
    sanity: Dict[Any, Any] = field(default_factory=dict)
    galleries: Dict[str, Any] = field(default_factory=dict)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compare.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", help="run folders, metrics.json files or offline W&B run folders")
    p.add_argument("--names", nargs="+", default=None, help="a name per run (default: the folder names)")
    p.add_argument("--reference", default=None,
                   help="the run the deltas are taken against: its name, its path as given, or its 0-based index "
                        "(default: the first run)")
    p.add_argument("--out", default=None, help="output folder (default outputs/compare/<date-time>)")
    p.add_argument("--title", default="run comparison", help="title of the dashboard and report")
    p.add_argument("--no-png", action="store_true", help="skip the matplotlib PNGs")
    p.add_argument("--wandb-project", default=None, help="W&B project: add its runs (online) / save the report there")
    p.add_argument("--wandb-entity", default=None, help="W&B entity of the project")
    p.add_argument("--wandb-filters", default=None,
                   help="JSON filters of the project's runs (wandb.Api().runs filters), e.g. "
                        "'{\"group\": \"synthetic_shapes/synthetic\"}'")
    p.add_argument("--wandb-report", action="store_true",
                   help="build a W&B report with the same panels and save it to --wandb-project (online)")
    return p


def resolve_reference(runs: Sequence[Run], given: Optional[str], paths: Sequence[str]) -> str:
    names = [r.name for r in runs]
    if given is None:
        return names[0]
    if given in names:
        return given
    for i, path in enumerate(paths):
        if Path(path).expanduser().resolve() == Path(given).expanduser().resolve():
            return names[i]
    if given.isdigit() and int(given) < len(names):
        return names[int(given)]
    raise SystemExit(f"error: --reference {given!r} is not a run: give one of {names}, a run path or an index")


def main(args: Optional[Sequence[str]] = None) -> Comparison:
    args = list(sys.argv[1:] if args is None else args)
    if args[:1] == ["sweep"]:   # python compare.py sweep CONFIG --seeds ...: evaluate over seeds, then compare
        folders = sweep(args[1:])
        return main(compare_args(folders, folders[0].parent, "--no-png" in args))
    ns = parser().parse_args(args)
    if not ns.runs and not ns.wandb_project:
        raise SystemExit("error: give run folders (or an offline W&B run folder), or --wandb-project")
    if ns.wandb_report and not ns.wandb_project:
        raise SystemExit("error: --wandb-report needs --wandb-project (the project the report is saved in)")
    try:
        runs = load_runs(ns.runs, ns.names) if ns.runs else []
        if ns.wandb_project and (ns.wandb_filters or not ns.runs):
            filters = json.loads(ns.wandb_filters) if ns.wandb_filters else None
            runs += load_wandb_project(ns.wandb_project, filters, ns.wandb_entity)
    except (RunLoadError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    reference = resolve_reference(runs, ns.reference, ns.runs)
    out = Path(ns.out) if ns.out else Path("outputs") / "compare" / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    png_dir = None if ns.no_png else out / "figures"
    if png_dir is not None:
        png_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)

    tables = build_tables(runs, reference)
    figures = build_figures(runs, tables, png_dir)
    try:
        meta = meta_evaluate(runs)
        galleries = galleries_of(runs)
    except RunLoadError as err:
        raise SystemExit(f"error: {err}") from None
    result = Comparison(runs, reference, tables, figures, out, meta=meta, sanity=sanity_table(runs),
                        galleries=galleries)
    texts = {"dashboard.html": dashboard(runs, tables, figures, reference, ns.title, result.meta, result.sanity,
                                         galleries),
             "tables.md": f"# {md_text(ns.title)}\n\n" + tables_markdown(tables),
             "tables.csv": tables_csv(tables),
             "config_differences.md": differences_markdown(runs),
             "meta.md": f"# {md_text(ns.title)}: meta-evaluation of the metrics\n\n" + meta_markdown(result.meta)}
    for name, text in texts.items():
        (out / name).write_text(text, encoding="utf-8")
        result.files[name] = out / name
    if ns.wandb_report:
        result.report = build_report(runs, tables, ns.wandb_project, ns.wandb_entity, ns.title)
        print(f"W&B report: {save_report(result.report)}")
    print(f"compared {len(runs)} runs (reference {reference}): {out / 'dashboard.html'}")
    return result
