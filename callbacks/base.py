"""Common shape of the evaluation callbacks.

The evaluation LightningModule's ``test_step`` returns, for every batch, a dict

    {"relevance":      {method_name: {class_setting: Tensor}},  # raw scores: [B, P] tokens or [B, H, W] pixels
     "targets":        {class_setting: LongTensor[B]},            # the class each setting explained
     "logits":         Tensor[B, C],                              # clean logits
     "class_specific": {method_name: bool},                       # False: the same tensor for every setting
     "layout":         the model's layout of the token scores (``.grid`` = (h, w) for images),
     "classifier":     evaluation.classifier.Classifier}          # the one way to classify (perturbed) inputs

and the batch (a dict with at least ``image`` in [0, 1] and ``label``; ``index``: each sample's dataset index).
A callback reads only these two: it never calls the module.

Data flow:

* **class settings**: a callback *declares* the class settings it needs in ``required_class_settings``; whoever
  builds the run (``evaluate.py``) passes their union (:meth:`EvaluationCallback.declared_class_settings`) to the
  module before the test starts;
* **metrics**: built at the first batch of a run (for the methods given, or every method of the outputs),
  torchmetrics ``Metric`` states accumulated in :meth:`update`; at the end of the test epoch :meth:`compute` runs
  **on every rank** (torchmetrics synchronises the states across processes; every process gets at least one
  batch, ``datamodules.unrepeated.UnrepeatedTestData``);
* **results**: handed, with each key's ``higher_is_better`` and the curves' x values, to the run's
  :class:`~callbacks.reporter.ResultsReporter`, the one way results leave a run (logger, ``metrics.json``, the
  printed table).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

import pytorch_lightning as pl
import torch
from torch import Tensor
from torchmetrics import Metric

from evaluation.method_specs import CLASS_SETTINGS

Result = Union[float, List[float]]


def outputs_device(outputs: Dict[str, Any]) -> torch.device:
    """The device of a ``test_step`` output (its logits, else its first relevance tensor)."""
    logits = outputs.get("logits")
    if isinstance(logits, Tensor):
        return logits.device
    return next(iter(next(iter(outputs["relevance"].values())).values())).device


class EvaluationCallback(pl.Callback):
    """Base class: subclasses implement ``update``, ``compute``, ``metrics``, ``reset`` and ``higher_is_better``."""

    #: class settings ("predicted", "target", "other") the callback needs the module to explain
    required_class_settings: tuple = ()

    @staticmethod
    def declared_class_settings(callbacks: Iterable[Any], base: Sequence[str] = ()) -> tuple:
        """The union of ``base`` and the settings the ``EvaluationCallback``s among ``callbacks`` declare, in the
        order of :data:`CLASS_SETTINGS`."""
        wanted = set(base)
        for callback in callbacks:
            if isinstance(callback, EvaluationCallback):
                wanted |= set(callback.required_class_settings)
        return tuple(s for s in CLASS_SETTINGS if s in wanted)

    # -- to implement -------------------------------------------------------------------------------------
    def metrics(self) -> List[Metric]:
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the metrics of a previous run (they are built again at the first batch)."""
        raise NotImplementedError

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        raise NotImplementedError

    def compute(self) -> Dict[str, Result]:
        raise NotImplementedError

    def higher_is_better(self) -> Dict[str, Optional[bool]]:
        """``{result key: True | False | None}`` as the metrics declare it (``None``: neither direction)."""
        raise NotImplementedError

    def curve_x(self) -> Dict[str, List[float]]:
        """``{result key: x values}`` of the list-valued results (default: none)."""
        return {}

    # -- Lightning hooks ----------------------------------------------------------------------------------
    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.reset()

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        with torch.no_grad():
            self.update(outputs, batch)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from .reporter import ResultsReporter

        results = self.compute()  # every rank: torchmetrics reduces the states across processes
        ResultsReporter.of(trainer).report(results, self.higher_is_better(), self.curve_x(), pl_module)
