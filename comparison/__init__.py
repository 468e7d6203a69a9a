"""Compare evaluation runs side by side (``compare.py``): load runs (:mod:`comparison.runs`), build tables,
figures, config differences, the HTML dashboard and, online, a W&B report with the same panels."""
from comparison.runs import Run, RunLoadError, load_run, load_runs

__all__ = ["Run", "RunLoadError", "load_run", "load_runs"]
