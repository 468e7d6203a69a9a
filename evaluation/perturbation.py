"""One direction of the perturbation test on one batch, for any kind of input (PROTOCOLS.md sections 1, 2, 5).

For unit scores ``[B, N]`` (from a :class:`~evaluation.perturbers.Perturber`): rank the units
(:func:`~evaluation.ranking.removal_ranks`, negated scores in the ``negative`` direction, the tie-breaking scores
negated with them), remove ``k = int(p * n)`` top-ranked units for every fraction ``p``, classify the ``S * B``
perturbed inputs with the run's :class:`~evaluation.classifier.Classifier` and compare with the labels. Column
0 of the result is the clean prediction's correctness, so the curve starts at the clean accuracy. The score is
top-1 accuracy **against the ground-truth label**, whatever class was explained.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import torch
from torch import Tensor

from .perturbers import Perturber
from .ranking import direction_sign, removal_counts, removal_masks, removal_ranks


def perturbation_correctness(perturber: Perturber, batch: Mapping[str, Any], scores: Tensor, labels: Tensor,
                             clean_correct: Tensor, fractions: Sequence[float], direction: str, classifier: Any,
                             tie_scores: Optional[Tensor] = None, batch_size: Optional[int] = None) -> Tensor:
    """Correctness ``[B, 1 + len(fractions)]`` (bool) of one direction.

    Args:
        perturber: what a unit is and how it is removed.
        batch: the batch the perturber reads its inputs from.
        scores: unit scores ``[B, N]`` (``perturber.unit_scores``).
        labels: ground truth ``[B]``; clean_correct: bool ``[B]``, the clean prediction's correctness.
        fractions: fractions of the units removed at each step (increasing).
        direction: ``positive`` (most relevant first) or ``negative`` (least relevant first).
        classifier: classifies the perturbed inputs (``classifier.predict(inputs, batch_size=...)``).
        tie_scores: the order among equal scores (``random`` ties), ``[B, N]``; ``None``: by index.
        batch_size: inputs per forward (``None``: the classifier's default).
    """
    sign = direction_sign(direction)
    ranks = removal_ranks(sign * scores, None if tie_scores is None else sign * tie_scores,
                          perturber.removable(batch))
    counts = removal_counts(fractions, perturber.num_units(batch))
    removed = removal_masks(ranks, counts)                                        # [S, B, N]
    steps, b = removed.shape[:2]
    preds = classifier.predict(perturber.perturb(batch, removed, classifier), batch_size=batch_size)
    correct = preds.reshape(steps, b) == labels[None]
    return torch.cat([clean_correct[:, None], correct.T], dim=1)
