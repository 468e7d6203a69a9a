"""Compare evaluation runs side by side (``compare.py``): load runs and their metrics' declared directions
(:mod:`comparison.runs`; runs older than the declarations: :mod:`comparison.directions`), build the tables
(:mod:`comparison.tables`), the figures (:mod:`comparison.figures`: Plotly for the page, matplotlib PNGs), the
config differences (:mod:`comparison.configs`), the self-contained HTML dashboard (:mod:`comparison.html`) and,
online, a W&B report with the same panels (:mod:`comparison.wandb_report`)."""
from comparison.runs import Run, RunLoadError, load_run, load_runs

__all__ = ["Run", "RunLoadError", "load_run", "load_runs"]
