"""Clean top-1 accuracy of the evaluated classifier, as an evaluation callback (result key ``accuracy``).

The accuracy of the clean predictions (``outputs["logits"]``) against ``batch["label"]``, in a float64
torchmetrics state reduced across processes (:class:`evaluation.metrics.CleanAccuracy`; higher is better).
``evaluate.py`` adds it to every run that does not list it.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from torchmetrics import Metric

from evaluation.metrics import CleanAccuracy
from evaluation.result_keys import ResultKey

from .base import EvaluationCallback, Result, outputs_device

KEY = ResultKey("accuracy").format()


class CleanAccuracyTest(EvaluationCallback):
    """``accuracy``: top-1 accuracy of the clean logits against ``batch["label"]``."""

    def __init__(self) -> None:
        super().__init__()
        self._metric = CleanAccuracy()

    def metrics(self) -> List[Metric]:
        return [self._metric]

    def reset(self) -> None:
        self._metric = CleanAccuracy()

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        device = outputs_device(outputs)
        if self._metric.device != device:
            self._metric = self._metric.to(device)
        self._metric.update(outputs["logits"], batch["label"])

    def compute(self) -> Dict[str, Result]:
        return {KEY: float(self._metric.compute())}

    def higher_is_better(self) -> Dict[str, Optional[bool]]:
        return {KEY: CleanAccuracy.higher_is_better}
