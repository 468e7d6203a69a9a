"""Publish one HTML page of a callback: into the run folder (``ResultsReporter``'s output directory, when the run
has one) and, under a W&B logger, as ``wandb.Html`` under a key."""
from __future__ import annotations

import pytorch_lightning as pl

from .reporter import ResultsReporter


def publish_html_page(trainer: pl.Trainer, filename: str, wandb_key: str, page: str) -> None:
    """Write ``page`` (a whole HTML document) to ``<run folder>/<filename>`` and log it to W&B as ``wandb_key``."""
    try:
        folder = ResultsReporter.of(trainer).output_dir
    except (LookupError, ValueError, RuntimeError):
        folder = None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / filename).write_text(page, encoding="utf-8")
    logger = trainer.logger
    experiment = getattr(logger, "experiment", None) if logger is not None else None
    if experiment is not None and type(logger).__name__ == "WandbLogger":
        import wandb

        experiment.log({wandb_key: wandb.Html(page)})
