"""The one way results leave an evaluation run: :class:`ResultsReporter`.

Every :class:`~callbacks.base.EvaluationCallback` hands its computed results to the run's reporter at the end of
the test epoch, on every process (the values are already reduced across processes), with the direction each
metric declares (``higher_is_better``) and the x values of its curves. The reporter then

* logs every scalar through Lightning (``pl_module.log``, no second reduction across processes);
* at the end of the run, on global rank 0 only: writes ``metrics.json`` (sorted keys, NaN as ``null``, warned;
  :func:`evaluation.reporting.write_metrics_json`) when it has an ``output_dir``, and beside it the declarations
  ``metrics.meta.json`` (:func:`evaluation.reporting.metrics_meta`, with the run's ``run_facts`` under ``run``
  when a callback handed them, :mod:`callbacks.run_clock`; a W&B run gets the same JSON as the summary
  value ``metrics_meta``) and the resolved config ``config.yaml`` that LightningCLI saved (its
  ``SaveConfigCallback``; the one in the log dir is overwritten by the next run), logs the curves as one table
  (``curves``) and one table per test with a row per method (``<test>_by_method``, :func:`method_tables`) through
  the trainer's logger and saves the logger, writes the callbacks' per-sample scores as ``per_sample.npz`` beside
  ``metrics.json`` (rows sorted by dataset index; only when a callback has some), prints the results table
  (:func:`evaluation.reporting.results_table`) and ``metrics written to <path>``.

Every key must be a :class:`evaluation.result_keys.ResultKey` string (a malformed one is an error naming it).

``results``, ``higher_is_better`` and ``curve_x`` hold what it was handed (on every process).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import pytorch_lightning as pl
from pytorch_lightning.loggers import WandbLogger

from evaluation.reporting import (
    META_FILE,
    META_SUMMARY_KEY,
    PER_SAMPLE_FILE,
    log_curves,
    metrics_meta,
    results_table,
    write_json,
    write_metrics_json,
    write_per_sample,
)
from evaluation.result_keys import ResultKey


class ResultsReporter(pl.Callback):
    """Collects the evaluation callbacks' results; logs, writes and prints them (module docstring).

    Args:
        output_dir: folder of ``metrics.json`` (``None``: no file).
        print_results: print the results table (and the path of ``metrics.json``) at the end.
    """

    METRICS_FILE = "metrics.json"
    CONFIG_FILE = "config.yaml"

    def __init__(self, output_dir: Optional[os.PathLike] = None, print_results: bool = True) -> None:
        super().__init__()
        self.output_dir = None if output_dir is None else Path(os.path.expanduser(str(output_dir)))
        self.print_results = bool(print_results)
        self.results: Dict[str, Any] = {}
        self.higher_is_better: Dict[str, Optional[bool]] = {}
        self.curve_x: Dict[str, List[float]] = {}
        self.conventions: Dict[str, Dict[str, Any]] = {}
        self.per_sample: Dict[str, tuple] = {}
        #: facts about the run itself (``callbacks.run_clock.RunClock``: model passes, wall time), written under
        #: ``run`` in ``metrics.meta.json`` when given
        self.run_facts: Dict[str, Any] = {}

    @property
    def metrics_path(self) -> Optional[Path]:
        return None if self.output_dir is None else self.output_dir / self.METRICS_FILE

    @staticmethod
    def of(trainer: pl.Trainer) -> "ResultsReporter":
        """The trainer's reporter (an error naming the fix when it has none, or several)."""
        found = [cb for cb in trainer.callbacks if isinstance(cb, ResultsReporter)]
        if len(found) != 1:
            raise RuntimeError(f"an evaluation run needs exactly one callbacks.reporter.ResultsReporter in the "
                               f"trainer's callbacks (evaluate.py adds it); found {len(found)}")
        return found[0]

    # -------------------------------------------------------------------------------- collecting
    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.results, self.higher_is_better, self.curve_x = {}, {}, {}
        self.conventions, self.per_sample = {}, {}

    def report(self, results: Mapping[str, Any], higher_is_better: Optional[Mapping[str, Optional[bool]]] = None,
               curve_x: Optional[Mapping[str, Sequence[float]]] = None,
               pl_module: Optional[pl.LightningModule] = None,
               conventions: Optional[Mapping[str, Any]] = None,
               per_sample: Optional[Mapping[str, tuple]] = None) -> None:
        """Take one callback's results (keys must be new); log the scalars through ``pl_module`` when given.
        ``conventions``: what every one of these keys was computed with (``metrics.meta.json``); ``per_sample``:
        ``{key: (indices, values)}`` for the per-sample sidecar."""
        for key in results:
            ResultKey.parse(key)   # a key that fits no layout: an error naming it
        overlap = set(self.results) & set(results)
        if overlap:
            raise ValueError(f"two evaluation callbacks report the same keys: {sorted(overlap)[:5]}")
        self.results.update(results)
        declared = dict(higher_is_better or {})
        self.higher_is_better.update({key: declared.get(key) for key in results})
        self.curve_x.update({key: list(x) for key, x in (curve_x or {}).items() if key in results})
        if conventions:
            self.conventions.update({key: dict(conventions) for key in results})
        for key, rows in (per_sample or {}).items():
            ResultKey.parse(key)
            if key in self.per_sample:
                raise ValueError(f"two evaluation callbacks report per-sample scores for {key}")
            self.per_sample[key] = rows
        if pl_module is not None:
            for key, value in results.items():
                if isinstance(value, (int, float)):
                    # values are already reduced across ranks by torchmetrics: no second reduction
                    pl_module.log(key, float(value), sync_dist=False, rank_zero_only=False)

    # -------------------------------------------------------------------------------- writing
    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        path = None if self.metrics_path is None else write_metrics_json(self.results, self.metrics_path)
        meta = metrics_meta(self.higher_is_better, self.curve_x, self.conventions)
        if self.run_facts:
            meta["run"] = dict(self.run_facts)
        if path is not None:
            write_json(meta, path.parent / META_FILE)
            if self.per_sample:
                write_per_sample(self.per_sample, path.parent / PER_SAMPLE_FILE)
            write_resolved_config(trainer, path.parent / self.CONFIG_FILE)
        for wandb in (lg for lg in trainer.loggers if isinstance(lg, WandbLogger)):
            wandb.experiment.summary[META_SUMMARY_KEY] = json.dumps(meta, separators=(",", ":"))   # one value
        logger = trainer.logger
        log_curves(logger, self.results, self.curve_x)
        if logger is not None and hasattr(logger, "log_table"):
            for key, (columns, rows) in method_tables(self.results).items():
                logger.log_table(key=key, columns=columns, data=rows)
        if logger is not None:
            logger.save()
        if self.print_results:
            print(results_table(self.results, self.higher_is_better))
            if path is not None:
                print(f"\nmetrics written to {path}", flush=True)


def method_tables(results: Mapping[str, Any]) -> Dict[str, tuple]:
    """``{"<test>_by_method": (columns, rows)}``: per test, one row per method (for the CDAM analysis' Pearson
    correlations, per method pair ``a__vs__b``) and one column per metric (``None`` where a method has none)."""
    cells: Dict[str, Dict[str, Dict[str, float]]] = {}
    for key, value in sorted(results.items()):
        k = ResultKey.parse(key)
        if not k.method or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        cells.setdefault(k.test, {}).setdefault(k.method, {})[k.column] = float(value)
    tables = {}
    for test, by_method in cells.items():
        metrics = sorted({m for row in by_method.values() for m in row})
        tables[f"{test}_by_method"] = (["method"] + metrics,
                                       [[method] + [row.get(m) for m in metrics] for method, row in by_method.items()])
    return tables


def write_resolved_config(trainer: pl.Trainer, path: Path) -> Optional[Path]:
    """The resolved config of a LightningCLI run (its ``SaveConfigCallback``'s) at ``path``; ``None`` when the run
    was not started from a LightningCLI."""
    from pytorch_lightning.cli import SaveConfigCallback

    saver = next((cb for cb in trainer.callbacks if isinstance(cb, SaveConfigCallback)), None)
    if saver is None:
        return None
    path.write_text(saver.parser.dump(saver.config, skip_none=False))
    return path
