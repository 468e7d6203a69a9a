"""Perturbation test (Chefer et al. 2021a; reused by 2021b and Beyond Intuition), PROTOCOLS.md section 1.

For every method, class setting (``predicted``: the argmax class was explained; ``target``: the ground truth)
and direction, on every batch:

1. the masking convention's perturber (:mod:`evaluation.perturbers`) turns the raw relevance into unit scores:
   for images, pixel maps (bilinear upsampling, ``align_corners=False``, to the image size from the model's patch
   grid ``outputs["layout"].grid``, min-max normalisation **per sample**); for texts, the token scores clamped
   at 0 (Beyond Intuition's scripts);
2. ``positive`` removes the most relevant units first, ``negative`` negates the scores first (least relevant
   removed first) (:mod:`evaluation.ranking`);
3. for each fraction ``p`` in ``fractions`` (default 0.1, ..., 0.9) the top ``k = int(p * N)`` units are removed
   as the ``masking`` convention says (:mod:`evaluation.perturbers`; images: ``chefer``, the default, or ``mean``;
   texts: ``pad``, ``mask`` or ``delete``, ``N`` each sample's real non-special tokens unless
   ``masking_options: {fraction_of: padded}``);
4. every perturbed input is re-classified by ``outputs["classifier"]`` (``forward_batch_size`` inputs per forward)
   and scored by top-1 accuracy **against the ground-truth label**, whatever class was explained; step 0 is the
   clean accuracy (:func:`evaluation.perturbation.perturbation_correctness`).

Tie-breaking (``ties``, :mod:`evaluation.ranking`): ``random`` (default) orders equal scores by the random
baseline's map of the same sample (``methods.random_baseline``: token scores seeded by ``(tie_seed,
batch["index"])``, turned into unit scores like every map). So a map that ranks nothing (a constant map) is scored
exactly like the ``random`` method with ``seed=tie_seed`` -- the null that "better than a random map" compares
against -- and the order is the same on any number of processes. Under ``index`` a constant map is removed top to
bottom (``y * W + x`` for pixels), which scores unlike the random map: it matters for maps with many equal scores,
such as Grad-CAM's, whose ``relu`` can leave many tokens, and whole images, at zero (measured in
``benchmarks/README.md``). (The references use ``torch.topk``, whose order among ties is unspecified.)

AUC conventions (``auc``: ``chefer``, the default, or ``bi``): :mod:`evaluation.auc`; the raw curve is always
stored.

Results: ``perturbation/<method>/<positive|negative>/<predicted|target>/auc`` (positive: lower is better;
negative: higher is better, as :class:`evaluation.metrics.PositivePerturbationCurve` and
``NegativePerturbationCurve`` declare) and ``.../curve`` (the accuracy at ``[0] + fractions``, in [0, 1]).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torchmetrics import Metric

from evaluation.auc import AUC_CONVENTIONS, DEFAULT_FRACTIONS, check_fractions, curve_x, perturbation_auc
from evaluation.metrics import perturbation_curve
from evaluation.perturbation import perturbation_correctness
from evaluation.perturbers import build_perturber
from evaluation.ranking import DIRECTIONS, TIES
from evaluation.result_keys import ResultKey
from methods.config_values import PlainDict

from .base import EvaluationCallback
from .removal_curves import Curve, RemovalCurveTest

PREFIX = "perturbation"


class PerturbationTest(RemovalCurveTest):
    """Positive/negative perturbation curves and AUCs per method and class setting (module docstring), a
    definition on the removal-curve mechanism (:class:`callbacks.removal_curves.RemovalCurveTest`): one curve per
    direction (accuracy against the label, Chefer's grid, step 0 the clean forward's), kept as sums
    (:class:`evaluation.metrics.PerturbationCurve`), its ``auc`` read from the mean curve (Chefer's script).

    Args:
        methods: method names (default: every method of the module's outputs).
        class_settings: which explained classes to test (``predicted``, ``target``).
        directions: ``positive`` and/or ``negative``.
        fractions: fractions of the units removed (step 0, the clean input, is always added).
        auc: AUC convention reported as ``.../auc``: ``chefer`` (default) or ``bi``.
        masking: how units are removed, a registered masking convention (:mod:`evaluation.perturbers`):
            images: ``chefer`` (pixels set to 0 in [0, 1] space before normalisation, default) or ``mean`` (pixels
            set to the model's mean colour); texts: ``pad`` (input id [PAD], attention mask 0: Beyond Intuition),
            ``mask`` ([MASK]) or ``delete`` (tokens taken out).
        masking_options: options of the masking convention's perturber, e.g. for texts ``{fraction_of: padded}``
            (Beyond Intuition's 20 Newsgroups), ``{remove_special_tokens: true}``, ``{clamp: false}``
            (:class:`evaluation.perturbers.TokenPerturber`).
        forward_batch_size: inputs per forward of the perturbed inputs (default: the classifier's batch size,
            the module's ``forward_batch_size``).
        ties: order among equal scores, ``random`` (default: the random baseline's map with ``seed=tie_seed``,
            from ``batch["index"]``) or ``index``; see the module docstring.
        tie_seed: the random baseline's seed of the ``random`` tie convention.
    """

    NAME = PREFIX
    PER_SAMPLE = False        # sums of correct predictions per step, as the progress files have always held
    COUNT_FORWARDS = False    # S * B forwards per map and direction, S = len(fractions): the clean step is free
    #: direction -> the order its units are removed in
    ORDERS = {"positive": "morf", "negative": "lerf"}

    def __init__(self, methods: Optional[Sequence[str]] = None,
                 class_settings: Sequence[str] = ("predicted", "target"),
                 directions: Sequence[str] = DIRECTIONS, fractions: Sequence[float] = DEFAULT_FRACTIONS,
                 auc: str = "chefer", masking: str = "chefer", forward_batch_size: Optional[int] = None,
                 ties: str = "random", tie_seed: int = 0, masking_options: Optional[PlainDict] = None) -> None:
        EvaluationCallback.__init__(self)   # the conventions are Chefer's, not RemovalCurveTest's options
        self._select(methods, class_settings)
        bad = [d for d in directions if d not in DIRECTIONS]
        if bad or not directions:
            raise ValueError(f"directions must be a non-empty subset of {DIRECTIONS}, got {list(directions)}")
        if auc not in AUC_CONVENTIONS:
            raise ValueError(f"unknown AUC convention {auc!r}; choose one of {AUC_CONVENTIONS}")
        self.fractions = check_fractions(fractions, auc)
        self.masking_options = dict(masking_options or {})
        self.perturber = build_perturber(masking, **self.masking_options)
        if ties not in TIES:
            raise ValueError(f"unknown tie-breaking convention {ties!r}; choose one of {TIES}")
        self.directions = tuple(directions)
        self.auc = auc
        self.masking = masking
        self.forward_batch_size = forward_batch_size
        self.ties = ties
        self.tie_seed = int(tie_seed)
        self.score, self.step, self.oracle, self.name, self.owner = "accuracy", None, False, PREFIX, PREFIX
        self.CURVES = tuple(Curve(d, self.ORDERS[d], "delete", (("auc", perturbation_curve(d, 2).higher_is_better),))
                            for d in self.directions)
        self.reset()

    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        return [f"{name}:{init_args.get(name)}" for name in ("auc", "masking", "ties")
                if init_args.get(name) is not None]

    def conventions(self) -> Dict[str, Any]:
        return {}   # the run's config holds them (comparison.configs reads the callback's init args)

    # -------------------------------------------------------------------------------- the definition
    def cells(self, methods: Sequence[str]) -> List[Tuple[str, str, Curve]]:
        return [(m, s, c) for m in methods for c in self.CURVES for s in self.class_settings]

    def curve_metric(self, curve: Curve, num_points: int) -> Metric:
        return perturbation_curve(curve.name, num_points)

    def curve_key(self, method: str, setting: str, curve: str, what: str) -> str:
        return ResultKey(PREFIX, method, setting, what, curve).format()

    def summary_functions(self) -> Dict[str, Callable[[Tensor, Sequence[float]], Tensor]]:
        def auc(mean_curve: Tensor, xs: Sequence[float]) -> Tensor:
            value = perturbation_auc([float(v) for v in mean_curve[0]], self.fractions, self.auc)
            return torch.tensor([value], dtype=torch.float64)
        return {"auc": auc}

    def _check_modality(self, batch: Mapping[str, Any]) -> None:
        return None   # the masking convention's perturber reads what it needs (images or tokens)

    def build(self, methods: Sequence[str], device=None) -> None:  # type: ignore[override]
        """One curve metric per method, direction and class setting, at ``[0] + fractions``."""
        super().build(methods, curve_x(self.fractions), device)

    def build_for(self, methods: Sequence[str], batch: Mapping[str, Any], device: Any) -> None:
        self.build(methods, device)

    def _counts(self, batch: Mapping[str, Any]) -> Tensor:
        return torch.zeros(0, dtype=torch.long)   # perturbation_correctness counts int(p * n) itself

    def removal_curves(self, outputs: Mapping[str, Any], batch: Mapping[str, Any], scores: Tensor,
                       ties: Optional[Tensor], classes: Optional[Tensor], counts: Tensor) -> Dict[str, Tensor]:
        labels = batch["label"]
        clean_correct = outputs["logits"].argmax(dim=-1) == labels
        return {c.name: perturbation_correctness(self.perturber, batch, scores, labels, clean_correct, self.fractions,
                                                 c.name, outputs["classifier"], ties, self.forward_batch_size)
                for c in self.CURVES}

    def update_curve(self, metric: Metric, batch: Mapping[str, Any], values: Tensor) -> None:
        metric.update(values)

