"""Segmentation test (Chefer et al. 2021a; Beyond Intuition uses the same metric code), PROTOCOLS.md section 3.

Per method (class setting ``predicted`` by default, as the references), the map is upsampled bilinearly to the
mask size (from the model's patch grid ``outputs["layout"].grid``) and min-max normalised per image
(:func:`evaluation.pixel_maps.pixel_maps`), then scored against ``batch["mask"]`` by
:class:`evaluation.segmentation.SegmentationMetrics` (binarisation at the mean of the normalised map, dataset-level
pixel accuracy and mIoU, per-image mAP, F1 and the references' row-F1; every one: higher is better).

Results: ``segmentation/<method>/<pixel_accuracy|miou|map|f1|f1_rows>``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from evaluation.method_specs import CLASS_SETTINGS
from evaluation.pixel_maps import pixel_maps
from evaluation.result_keys import ResultKey
from evaluation.segmentation import METRIC_NAMES, SegmentationMetrics

from .base import EvaluationCallback, Result, relevance_for

PREFIX = "segmentation"


class SegmentationTest(EvaluationCallback):
    """Segmentation metrics of every method's map against ``batch["mask"]`` (module docstring).

    Args:
        methods: method names (default: every method of the module's outputs).
        class_setting: the explained class whose map is scored (reference: ``predicted``).
    """

    def __init__(self, methods: Optional[Sequence[str]] = None, class_setting: str = "predicted") -> None:
        super().__init__()
        if class_setting not in CLASS_SETTINGS:
            raise ValueError(f"class_setting must be 'predicted', 'target' or 'other', got {class_setting!r}")
        self.methods: Optional[List[str]] = list(methods) if methods is not None else None
        self.class_setting = class_setting
        self.required_class_settings = (class_setting,)
        self._metrics: Dict[str, SegmentationMetrics] = {}

    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        return [f"segmentation:{init_args.get('class_setting') or 'predicted'}"]

    def build(self, methods: Sequence[str], device=None) -> None:
        """One set of segmentation metrics per method."""
        self._metrics = {m: SegmentationMetrics() for m in methods}
        self._place_metrics(device)

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        if "mask" not in batch:
            raise KeyError("segmentation: the batch has no 'mask' (ground-truth segmentation [B, H, W]); use a "
                           "datamodule with masks (ImageNetSegmentationDataModule, SyntheticShapesDataModule)")
        relevance = outputs["relevance"]
        self._build_at_first_batch(outputs)
        gt = batch["mask"]
        if gt.dim() == 4 and gt.shape[1] == 1:
            gt = gt[:, 0]
        layout = outputs.get("layout")
        grid = None if layout is None else tuple(layout.grid)
        for method, metric in self._metrics.items():
            rel = relevance_for(relevance, method, self.class_setting, "segmentation")
            metric.update(pixel_maps(rel, gt.shape[-2:], grid), gt)

    def compute(self) -> Dict[str, Result]:
        results: Dict[str, Result] = {}
        for method, metric in self._metrics.items():
            for name, value in metric.compute().items():  # runs on every rank (torchmetrics syncs the sums)
                results[ResultKey(PREFIX, method, metric=name).format()] = float(value)
        return results

    def higher_is_better(self) -> Dict[str, Optional[bool]]:
        return {ResultKey(PREFIX, method, metric=name).format(): metric.higher_is_better
                for method, metric in self._metrics.items() for name in METRIC_NAMES}
