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

from dataclasses import replace
from typing import Any, Dict, List, Mapping, Optional, Sequence

from evaluation.auc import AUC_CONVENTIONS, DEFAULT_FRACTIONS, check_fractions, curve_x, perturbation_auc
from evaluation.metrics import PerturbationCurve, perturbation_curve
from evaluation.perturbation import perturbation_correctness
from evaluation.perturbers import build_perturber
from evaluation.ranking import DIRECTIONS, TIES
from evaluation.result_keys import ResultKey
from methods.config_values import PlainDict

from .base import EvaluationCallback, OncePerMap, Result, relevance_for, tie_scores

PREFIX = "perturbation"


class PerturbationTest(EvaluationCallback):
    """Positive/negative perturbation curves and AUCs per method and class setting (module docstring).

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

    def __init__(self, methods: Optional[Sequence[str]] = None,
                 class_settings: Sequence[str] = ("predicted", "target"),
                 directions: Sequence[str] = DIRECTIONS, fractions: Sequence[float] = DEFAULT_FRACTIONS,
                 auc: str = "chefer", masking: str = "chefer", forward_batch_size: Optional[int] = None,
                 ties: str = "random", tie_seed: int = 0, masking_options: Optional[PlainDict] = None) -> None:
        super().__init__()
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
        self._metrics: Dict[ResultKey, PerturbationCurve] = {}
        self._built_methods: List[str] = []

    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        return [f"{name}:{init_args.get(name)}" for name in ("auc", "masking", "ties")
                if init_args.get(name) is not None]

    # -------------------------------------------------------------------------------- metrics
    @staticmethod
    def _key(method: str, direction: str, setting: str) -> ResultKey:
        return ResultKey(PREFIX, method, setting, "auc", direction)

    def build(self, methods: Sequence[str], device=None) -> None:
        """One curve metric per method, direction and class setting."""
        self._built_methods = list(methods)
        self._metrics = {
            self._key(m, d, s): perturbation_curve(d, len(self.fractions) + 1)
            for m in methods for d in self.directions for s in self.class_settings
        }
        self._place_metrics(device)

    # -------------------------------------------------------------------------------- update
    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        relevance = outputs["relevance"]
        self._build_at_first_batch(outputs)
        labels = batch["label"]
        classifier, layout = outputs["classifier"], outputs.get("layout")
        clean_correct = outputs["logits"].argmax(dim=-1) == labels
        ties = tie_scores(self.perturber, self.ties, batch, layout, self.tie_seed, "perturbation")

        for method in self._built_methods:
            once = OncePerMap()   # class-agnostic methods give the same tensor for every setting: test it once
            for setting in self.class_settings:
                rel = relevance_for(relevance, method, setting, "perturbation")

                def correctness(rel=rel):
                    scores = self.perturber.unit_scores(rel, batch, layout)
                    return {d: perturbation_correctness(self.perturber, batch, scores, labels, clean_correct,
                                                        self.fractions, d, classifier, ties,
                                                        self.forward_batch_size)
                            for d in self.directions}

                reuse = once.get(rel, correctness)
                for direction in self.directions:
                    self._metrics[self._key(method, direction, setting)].update(reuse[direction])

    # -------------------------------------------------------------------------------- compute
    def compute(self) -> Dict[str, Result]:
        results: Dict[str, Result] = {}
        for key, metric in self._metrics.items():
            curve = [float(v) for v in metric.compute()]  # runs on every rank (torchmetrics syncs the sums)
            results[key.format()] = perturbation_auc(curve, self.fractions, self.auc)
            results[_curve(key)] = curve
        return results

    def higher_is_better(self) -> Dict[str, Optional[bool]]:
        declared: Dict[str, Optional[bool]] = {}
        for key, metric in self._metrics.items():
            declared[key.format()] = metric.higher_is_better
            declared[_curve(key)] = None   # a curve is read through its area
        return declared

    def curve_x(self) -> Dict[str, List[float]]:
        return {_curve(key): curve_x(self.fractions) for key in self._metrics}


def _curve(auc: ResultKey) -> str:
    """The key of the curve whose area is ``auc``."""
    return replace(auc, metric="curve").format()
