"""Complexity test: sparseness (Gini), complexity (entropy) and effective complexity of every method's map; no
forward pass (measures: :mod:`evaluation.complexity`).

Units (``unit``): images ``patch`` (default: the token scores on the model's patch grid, a pixel-level map summed
per patch, so token and pixel methods are measured on the same units) or ``pixel`` (token maps upsampled
bilinearly to the image size, raw values); texts ``token`` (the content tokens: special tokens and padding take no
part). Every measure uses ``|a|``; effective complexity counts the units above ``threshold`` times the map's
maximum magnitude (default 1e-5). Means over samples (an all-zero map is skipped). Results:
``complexity/<method>/<setting>/<sparseness|entropy|effective_complexity>`` (``entropy``: Bhatt's
"complexity", named for what it computes: a result key's metric cannot repeat its test). The CDAM analysis' ``sparsity``
(share of units under 5 % of the maximum) is a different quantity under its own key.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
from torch import Tensor

from evaluation.complexity import complexity, effective_complexity, sparseness
from evaluation.map_units import image_units
from evaluation.metric_cards import MetricCard

from .sample_scores import SampleScoreTest

UNITS = ("patch", "pixel", "token")


class ComplexityTest(SampleScoreTest):
    """Sparseness, complexity and effective complexity of every method's map (module docstring).

    Args:
        methods: method names (default: every method of the module's outputs).
        class_settings: explained classes to test (default ``predicted``).
        unit: ``patch`` or ``pixel`` (images), ``token`` (texts); ``None``: ``patch`` for images, ``token`` for texts.
        threshold: effective complexity's threshold, relative to the map's maximum magnitude.
        oracle: add the ground-truth map as method ``oracle`` (:func:`callbacks.sample_scores.oracle_map`).
    """

    PREFIX = "complexity"
    metric_cards = (
        MetricCard("sparseness", "Gini index of the sorted |a| (1: one unit holds all)",
                   "Chalasani et al. 2020 (ICML), sec. 5", "0 F", True),
        MetricCard("entropy", "complexity: entropy of |a| / sum |a| (natural log)", "Bhatt et al. 2020 (IJCAI), eq. 4",
                   "0 F", False),
        MetricCard("effective_complexity", "number of units with |a| > threshold * max |a| (threshold 1e-5)",
                   "Nguyen & Martinez 2020, sec. 3.3", "0 F", False),
    )

    def __init__(self, methods: Optional[Sequence[str]] = None, class_settings: Sequence[str] = ("predicted",),
                 unit: Optional[str] = None, threshold: float = 1e-5, oracle: bool = False) -> None:
        if unit is not None and unit not in UNITS:
            raise ValueError(f"complexity: unit must be one of {UNITS} or None, got {unit!r}")
        if not 0 <= threshold < 1:
            raise ValueError(f"complexity: threshold must lie in [0, 1), got {threshold}")
        self.unit, self.threshold = unit, float(threshold)
        super().__init__(methods, class_settings, oracle)

    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        return [f"complexity_unit:{init_args.get('unit') or 'auto'}",
                f"complexity_threshold:{init_args.get('threshold', 1e-5)}"]

    def conventions(self) -> Dict[str, Any]:
        return {"unit": self.unit or "patch (images) / token (texts)", "magnitude": "abs",
                "effective_threshold": f"{self.threshold} x max|a|", "class_settings": list(self.class_settings)}

    def sample_values(self, relevance: Tensor, outputs: Dict[str, Any], batch: Dict[str, Any]) -> Tensor:
        if isinstance(batch.get("image"), Tensor) and "word_ids" not in batch:
            unit = self.unit or "patch"
            if unit == "token":
                raise ValueError("complexity: unit 'token' is not defined on images; use 'patch' or 'pixel'")
            scores, valid = image_units(relevance, batch["image"].shape[-2:], outputs.get("layout"), unit), None
        elif isinstance(batch.get("word_ids"), Tensor):
            if (self.unit or "token") != "token":
                raise ValueError(f"complexity: unit {self.unit!r} is not defined on texts; use 'token'")
            scores, valid = relevance.detach().to(torch.float64), batch["word_ids"] >= 0
            if scores.shape != valid.shape:
                raise ValueError(f"complexity: token scores {tuple(scores.shape)} do not match word_ids "
                                 f"{tuple(valid.shape)}")
        else:
            raise KeyError(f"complexity: the batch has neither 'image' nor 'word_ids'; got keys {sorted(batch)}")
        return self._as_rows(sparseness(scores, valid), complexity(scores, valid),
                             effective_complexity(scores, valid, self.threshold))
