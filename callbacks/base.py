"""Common shape of the evaluation callbacks.

The evaluation LightningModule's ``test_step`` returns, for every batch, a dict

    {"relevance": {method_name: {class_setting: Tensor}},   # raw scores: [B, P] tokens or [B, H, W] pixels
     "targets":   {class_setting: LongTensor[B]},             # the class each setting explained
     "logits":    Tensor[B, C]}                               # clean logits

and the batch (a dict with at least ``image`` in [0, 1] and ``label``). A callback accumulates torchmetrics
``Metric`` states in :meth:`update`, and at the end of the test epoch :meth:`compute` runs **on every rank**
(torchmetrics synchronises the states across processes), the scalars are logged through Lightning and the full
results (scalars and curves) are kept in ``self.results`` for ``metrics.json``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Union

import pytorch_lightning as pl
import torch
from torchmetrics import Metric

Result = Union[float, List[float]]


class EvaluationCallback(pl.Callback):
    """Base class: subclasses implement ``update`` and ``compute`` and list their metrics in ``metrics()``."""

    #: class settings ("predicted", "target", "other") the callback needs the module to explain
    required_class_settings: tuple = ()

    def __init__(self) -> None:
        super().__init__()
        self.results: Dict[str, Result] = {}

    # -- to implement -------------------------------------------------------------------------------------
    def metrics(self) -> List[Metric]:
        raise NotImplementedError

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any], pl_module: pl.LightningModule) -> None:
        raise NotImplementedError

    def compute(self) -> Dict[str, Result]:
        raise NotImplementedError

    # -- Lightning hooks ----------------------------------------------------------------------------------
    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for metric in self.metrics():
            metric.to(pl_module.device)
            metric.reset()

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        with torch.no_grad():
            self.update(outputs, batch, pl_module)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.results = self.compute()
        for key, value in self.results.items():
            if isinstance(value, (int, float)):
                # values are already reduced across ranks by torchmetrics: no second reduction
                pl_module.log(key, float(value), sync_dist=False, rank_zero_only=False)
