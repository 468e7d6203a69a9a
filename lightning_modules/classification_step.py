"""The loss, the logging and the step methods that every classifier LightningModule here shares
(``LinearProbe``, ``TextClassifierModule``; ``CLIPContrastiveModule`` shares the step methods), and the
datamodule check and export metadata of the two that export Hugging Face folders (:class:`FolderExport`).

:func:`classification_loss`: cross-entropy of the logits (computed in float32, also under mixed precision) with
label smoothing in the ``train`` stage only; logged as ``<stage>/loss`` (per step and epoch mean in ``train``,
epoch mean otherwise) and ``<stage>/acc`` (epoch mean of the top-1 accuracy), averaged over processes outside
``train`` (``sync_dist``), weighted by the batch size.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional

import pytorch_lightning as pl
import torch.nn.functional as F
from torch import Tensor

#: the file an export writes beside the model: marks the folder as this module's export (replaceable)
EXPORT_METADATA = "training.json"


def classification_loss(module: pl.LightningModule, logits: Tensor, labels: Tensor, stage: str,
                        label_smoothing: float = 0.0) -> Tensor:
    """The cross-entropy loss of ``logits`` ``[B, C]`` against ``labels`` ``[B]``, logged with the accuracy by
    ``module`` (module docstring)."""
    smoothing = label_smoothing if stage == "train" else 0.0
    loss = F.cross_entropy(logits.float(), labels, label_smoothing=smoothing)
    acc = (logits.argmax(dim=-1) == labels).float().mean()
    on_step = stage == "train"
    module.log(f"{stage}/loss", loss, on_step=on_step, on_epoch=True, prog_bar=True, sync_dist=stage != "train",
               batch_size=labels.shape[0])
    module.log(f"{stage}/acc", acc, on_step=False, on_epoch=True, prog_bar=True, sync_dist=stage != "train",
               batch_size=labels.shape[0])
    return loss


class StageSteps:
    """``training_step``, ``validation_step`` and ``test_step`` of a LightningModule whose ``_step(batch, stage)``
    computes (and logs) the loss of a batch in the stage ``"train"``, ``"val"`` or ``"test"``; list it before
    ``pl.LightningModule`` among the bases."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._step(batch, "test")


class FolderExport:
    """``setup`` checks the trainer's datamodule with the module's ``check_datamodule``. An export fills a
    :func:`~models.checkpoint_io.fresh_export_folder` (an earlier export, its :data:`EXPORT_METADATA`, is
    replaced; any other existing, non-empty path is refused, naming it) and ends with :meth:`write_export_info`."""

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None:
            self.check_datamodule(datamodule)

    def write_export_info(self, folder: Path, datamodule: Any, metadata: Optional[Dict[str, Any]],
                          **info: Any) -> Path:
        """``info``, the datamodule's class, the hyperparameters and ``metadata`` into :data:`EXPORT_METADATA`."""
        info = {**info, "datamodule": type(datamodule).__name__, "hparams": dict(self.hparams), **(metadata or {})}
        (folder / EXPORT_METADATA).write_text(json.dumps(info, indent=2, default=str) + "\n")
        return folder
