"""Which direction is better for the metrics of a run written before results described themselves.

A run now carries each key's ``higher_is_better`` in the sidecar ``metrics.meta.json`` (a W&B run: its summary
value ``metrics_meta``), as its callbacks declared it (:mod:`evaluation.reporting`). Older runs have values only:
:func:`declared_directions` gives their keys the directions the callbacks declared when those runs were made,
written down once in :data:`DIRECTIONS`, keyed by (test, perturbation direction, metric with its ``@<k>`` point
written ``@``). Keys it does not list get ``None`` (no direction: no best is marked).
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

from evaluation.result_keys import ResultKey

_SHARES = ("target_share_on_target", "other_share_on_other", "target_share_on_other", "other_share_on_target")

#: (test, direction, metric kind) -> higher_is_better, as the callbacks declared it (keys not listed: ``None``)
DIRECTIONS: Dict[Tuple[str, str, str], Optional[bool]] = {
    ("accuracy", "", "accuracy"): True,
    ("perturbation", "positive", "auc"): False,
    ("perturbation", "negative", "auc"): True,
    **{("segmentation", "", m): True for m in ("pixel_accuracy", "miou", "map", "f1", "f1_rows")},
    # a map's share on its own object: higher is better; on the other object: lower
    **{("cdam_analysis", "", f"discrimination/{s}"): s in _SHARES[:2] for s in _SHARES},
    **{("rationale", "", m): True for m in ("token_f1@", "token_f1_micro@", "token_f1", "token_precision",
                                            "token_recall", "token_f1_micro", "iou_f1", "iou_f1_micro", "auprc")},
    **{("eraser", "", m): True for m in ("comprehensiveness@", "aopc_comprehensiveness")},
    **{("eraser", "", m): False for m in ("sufficiency@", "aopc_sufficiency")},
}


def declared_directions(keys: Iterable[str]) -> Dict[str, Optional[bool]]:
    """``{key: True | False | None}`` for ``keys`` (metrics.json keys) from :data:`DIRECTIONS`."""
    parsed = {key: ResultKey.try_parse(key) for key in keys}
    return {key: None if k is None else DIRECTIONS.get((k.test, k.direction, k.metric_kind))
            for key, k in parsed.items()}
