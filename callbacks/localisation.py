"""Localisation test: pointing game, energy pointing game, relevance mass and rank accuracy, localisation ROC-AUC
of every method's map against the ground-truth region; no forward pass (measures: :mod:`evaluation.localisation`).

Ground truth and units (the ``unit`` option, written to the W&B tags):

* images (``batch["mask"]`` ``[B, H, W]``, the labelled object: synthetic shapes, ImageNet-Segmentation):
  ``pixel`` (default): the raw map (no normalisation) at the mask's size, token maps upsampled bilinearly
  (``align_corners=False``, as :mod:`evaluation.pixel_maps`); the pointing game's tolerance in pixels (default 15,
  TorchRay's); ``patch``: the token scores on the model's patch grid (a pixel-level map summed per patch), a patch
  inside the region when the mask covers at least ``patch_threshold`` of it; tolerance in patches (default 0);
* texts (``batch["word_ids"]`` and the word-level ``batch["rationale"]``: planted words, associative recall,
  ERASER rationales): ``token``: the method's scores of the content tokens (special tokens and padding take no
  part), a token inside the region when its word is a rationale word; tolerance 0 (the maximum's token must be a
  rationale token).

A sample with an empty region is skipped by every metric (Quantus 0.6.0 scores it a pointing-game hit). The
pointing game is averaged per class (the label: the class of the region) and then over the classes seen
(TorchRay's class mean; TorchRay averages over every class of the dataset, 0 for a class never seen). The other
metrics are means over the samples. Results: ``localisation/<method>/<setting>/<metric>``; class setting
``target`` by default (the region is the label's).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from evaluation.localisation import (
    energy_pointing_game,
    localisation_auc,
    pointing_hits,
    relevance_mass_accuracy,
    relevance_rank_accuracy,
)
from evaluation.metric_cards import MetricCard
from evaluation.sample_values import class_mean, nan_mean
from methods.maps import infer_grid, tokens_to_map

from .sample_scores import SampleScoreTest

IMAGE_UNITS = ("pixel", "patch")
TEXT_UNITS = ("token",)
_GT = "image masks (pixel or patch unit), text rationales (token unit)"


class LocalisationTest(SampleScoreTest):
    """Pointing-game family of every method's map against the ground-truth region (module docstring).

    Args:
        methods: method names (default: every method of the module's outputs).
        class_settings: explained classes to test (default ``target``: the region is the label's object).
        unit: ``pixel`` or ``patch`` (images), ``token`` (texts); ``None``: ``pixel`` for images, ``token`` for
            texts.
        tolerance: the pointing game's tolerance in units (``None``: 15 for pixels, TorchRay's; 0 otherwise).
        patch_threshold: the share of a patch the mask must cover for the patch to be inside (``patch`` unit).
        oracle: add the ground-truth map as method ``oracle`` (:func:`callbacks.sample_scores.oracle_map`).
    """

    PREFIX = "localisation"
    metric_cards = (
        MetricCard("pointing_game", "hit if the map's maximum lies within the tolerance of the region (15 px), "
                   "mean per class then over classes; empty regions skipped",
                   "Zhang et al. 2018 (ECCV), sec. 5.1; TorchRay benchmark/pointing_game.py", "0 F",
                   True),
        MetricCard("energy_pointing_game", "share of the positive relevance inside the region",
                   "Wang et al. 2020 (Score-CAM, CVPRW), sec. 5.2", "0 F", True),
        MetricCard("relevance_mass_accuracy", "signed relevance inside the region over the total",
                   "Arras et al. 2022 (CLEVR-XAI), eq. 1", "0 F", True),
        MetricCard("relevance_rank_accuracy", "share of the K = |region| top-scored units inside the region",
                   "Arras et al. 2022 (CLEVR-XAI), eq. 2", "0 F", True),
        MetricCard("roc_auc", "ROC-AUC of the scores as a detector of the region's units (ties 1/2)",
                   "Fawcett 2006; Quantus AUC", "0 F", True),
    )

    def __init__(self, methods: Optional[Sequence[str]] = None, class_settings: Sequence[str] = ("target",),
                 unit: Optional[str] = None, tolerance: Optional[float] = None, patch_threshold: float = 0.5,
                 oracle: bool = False) -> None:
        if unit is not None and unit not in IMAGE_UNITS + TEXT_UNITS:
            raise ValueError(f"localisation: unit must be one of {IMAGE_UNITS + TEXT_UNITS} or None, got {unit!r}")
        if tolerance is not None and tolerance < 0:
            raise ValueError(f"localisation: tolerance must be >= 0, got {tolerance}")
        if not 0 < patch_threshold <= 1:
            raise ValueError(f"localisation: patch_threshold must lie in (0, 1], got {patch_threshold}")
        self.unit, self.tolerance, self.patch_threshold = unit, tolerance, float(patch_threshold)
        super().__init__(methods, class_settings, oracle)

    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        unit = init_args.get("unit") or "auto"
        tolerance = init_args.get("tolerance")
        return [f"localisation_unit:{unit}", f"localisation_tolerance:{'default' if tolerance is None else tolerance}"]

    def conventions(self) -> Dict[str, Any]:
        """The test's conventions (unit, tolerance, class mean, empty regions)."""
        return {"unit": self.unit or "pixel (images) / token (texts)",
                "tolerance": self.tolerance if self.tolerance is not None else "15 px / 0",
                "patch_threshold": self.patch_threshold, "pointing_game_mean": "per class, then over classes seen",
                "empty_region": "skipped", "class_settings": list(self.class_settings)}

    # ------------------------------------------------------------------------------------------ units
    def _image_units(self, rel: Tensor, batch: Dict[str, Any], layout: Any
                     ) -> Tuple[Tensor, Tensor, Tuple[int, int], float]:
        mask = batch["mask"]
        if mask.dim() == 4 and mask.shape[1] == 1:
            mask = mask[:, 0]
        height, width = mask.shape[-2:]
        unit = self.unit or "pixel"
        if unit not in IMAGE_UNITS:
            raise ValueError(f"localisation: unit {unit!r} is not defined on images; use one of {IMAGE_UNITS}")
        rel = torch.nan_to_num(rel.detach().to(torch.float64))
        grid = tuple(layout.grid) if layout is not None else None
        if unit == "pixel":
            if rel.dim() == 2:
                maps = tokens_to_map(rel, grid_size=grid or infer_grid(rel.shape[1], (height, width)),
                                     image_size=(height, width), mode="bilinear")
            elif tuple(rel.shape[-2:]) != (height, width):
                maps = F.interpolate(rel[:, None], size=(height, width), mode="bilinear", align_corners=False)[:, 0]
            else:
                maps = rel
            tolerance = 15.0 if self.tolerance is None else float(self.tolerance)
            return maps.flatten(1), mask.flatten(1) > 0.5, (height, width), tolerance
        if rel.dim() == 2:
            h, w = grid or infer_grid(rel.shape[1], (height, width))
            scores = rel
        else:
            h, w = grid or (None, None)
            if h is None or rel.shape[-2] % h or rel.shape[-1] % w:
                raise ValueError(f"localisation: a pixel map {tuple(rel.shape[-2:])} cannot be pooled to the patch "
                                 f"grid {grid}; use unit='pixel'")
            scores = F.avg_pool2d(rel[:, None], (rel.shape[-2] // h, rel.shape[-1] // w))[:, 0].flatten(1)
            scores = scores * (rel.shape[-2] // h) * (rel.shape[-1] // w)       # sums per patch
        if height % h or width % w:
            raise ValueError(f"localisation: a {height}x{width} mask does not divide into the {h}x{w} patch grid")
        cover = F.avg_pool2d(mask[:, None].to(torch.float64), (height // h, width // w))[:, 0].flatten(1)
        tolerance = 0.0 if self.tolerance is None else float(self.tolerance)
        return scores, cover >= self.patch_threshold - 1e-12, (h, w), tolerance

    def _text_units(self, rel: Tensor, batch: Dict[str, Any]) -> Tuple[Tensor, Tensor, Tensor]:
        unit = self.unit or "token"
        if unit not in TEXT_UNITS:
            raise ValueError(f"localisation: unit {unit!r} is not defined on texts; use one of {TEXT_UNITS}")
        if self.tolerance not in (None, 0, 0.0):
            raise ValueError("localisation: a pointing-game tolerance is not defined on token units (1-D); use 0")
        word_ids, rationale = batch["word_ids"].long(), batch["rationale"].bool()
        if rel.shape != word_ids.shape:
            raise ValueError(f"localisation: token scores {tuple(rel.shape)} do not match word_ids "
                             f"{tuple(word_ids.shape)}")
        valid = word_ids >= 0
        truth = rationale.gather(1, word_ids.clamp(min=0).clamp(max=rationale.shape[1] - 1)) & valid
        return rel.detach().to(torch.float64), truth, valid

    # ------------------------------------------------------------------------------------------ values
    def sample_values(self, relevance: Tensor, outputs: Dict[str, Any], batch: Dict[str, Any]) -> Tensor:
        if "mask" in batch:
            scores, truth, grid, tolerance = self._image_units(relevance, batch, outputs.get("layout"))
            valid = None
            hits = pointing_hits(scores, truth, None, grid, tolerance)
        elif "word_ids" in batch and "rationale" in batch:
            scores, truth, valid = self._text_units(relevance, batch)
            hits = pointing_hits(scores, truth, valid)
        else:
            raise KeyError(f"localisation: the batch has no ground-truth region ('mask' [B, H, W] or 'word_ids' and "
                           f"'rationale'); the test is defined on {_GT}; got keys {sorted(batch)}")
        return self._as_rows(hits, energy_pointing_game(scores, truth, valid),
                             relevance_mass_accuracy(scores, truth, valid),
                             relevance_rank_accuracy(scores, truth, valid), localisation_auc(scores, truth, valid))

    def sample_groups(self, outputs: Dict[str, Any], batch: Dict[str, Any], setting: str) -> Optional[Tensor]:
        return batch["label"]      # the class of the region, whichever class the map explained

    def aggregate(self, name: str, values: Tensor, groups: Tensor) -> Tensor:
        if name == "pointing_game":
            return class_mean(values, groups)
        return nan_mean(values[:, None])[0]
