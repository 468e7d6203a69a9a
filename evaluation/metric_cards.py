"""What a metric of the catalogue is, declared once by its callback: the README's metric list and the run's
``metrics.meta.json`` are generated from these cards, so the description cannot drift from the code.

A callback class lists its cards in ``metric_cards`` (a tuple of :class:`MetricCard`); ``name`` is the metric
part of its result keys (:mod:`evaluation.result_keys`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

#: the modalities a metric may be defined on: images, text encoders, decoder LMs, CLIP image / text towers
MODALITIES = ("image", "text", "decoder", "clip_image", "clip_text")


@dataclass(frozen=True)
class MetricCard:
    """One metric: its result-key name, one-line definition, reference (paper, equation or code), cost per sample
    (forward passes ``F`` and re-explanations ``E`` as a formula), direction and the modalities it is defined on."""

    name: str
    definition: str
    reference: str
    cost: str
    higher_is_better: Optional[bool]
    modalities: Tuple[str, ...] = MODALITIES

    def __post_init__(self) -> None:
        unknown = [m for m in self.modalities if m not in MODALITIES]
        if unknown or not self.modalities:
            raise ValueError(f"metric card {self.name!r}: modalities must be a non-empty subset of {MODALITIES}, "
                             f"got {list(self.modalities)}")
