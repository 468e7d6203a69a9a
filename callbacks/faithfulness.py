"""ERASER's faithfulness scores of soft rationales (DeYoung et al. 2020, section 4 and the AOPC of its scorer):
comprehensiveness, sufficiency and their areas over the perturbation bins, for text classifiers.

For every method, class setting and sample, with ``y`` the class the map explained (``outputs["targets"]``:
for ``predicted``, the argmax of the clean logits, which is ERASER's "predicted class"), ``p(y | .)`` the
classifier's softmax probability, ``x`` the input and ``r_q`` the top ``q`` fraction of its tokens:

* ``comprehensiveness@q = p(y | x) - p(y | x without r_q)`` (a faithful map's top tokens carry the prediction:
  higher is better);
* ``sufficiency@q = p(y | x) - p(y | r_q alone)`` (the top tokens suffice: lower is better);
* ``aopc_comprehensiveness`` / ``aopc_sufficiency``: the mean over the bins ``q`` (ERASER's AOPC, default bins
  1, 5, 10, 20, 50 %).

Conventions (each an option):

* units: the model's token positions, ranked by the method's token scores (not clamped: ``masking_options:
  {clamp: true}`` clamps at 0 first); ``r_q`` holds ``k = int(q * n)`` tokens, ``n`` each sample's real
  non-special tokens (the truncation of the perturbation test; a short text can have an empty ``r_q`` at
  1 %, which then scores 0); ties in the order of the random map of the sample (``ties="random"``) or by index;
  special tokens are never removed;
* removal ``masking``: ``delete`` (default: the tokens are taken out, as ERASER's text "without the rationale"),
  ``pad`` (input id [PAD], attention mask 0) or ``mask`` ([MASK]) (:class:`evaluation.perturbers.TokenPerturber`);
* the probability is re-computed by ``outputs["classifier"]`` (``forward_batch_size`` sequences per forward).

Results: ``eraser/<method>/<setting>/comprehensiveness@<q>``, ``.../sufficiency@<q>``, ``.../aopc_comprehensiveness``,
``.../aopc_sufficiency`` and the curves ``.../comprehensiveness`` / ``.../sufficiency`` over the bins.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from evaluation.metrics import PerStepMean
from evaluation.perturbers import TokenPerturber, build_perturber
from evaluation.ranking import TIES, removal_counts, removal_masks, removal_ranks
from evaluation.result_keys import ResultKey
from methods.config_values import PlainDict

from .base import EvaluationCallback, OncePerMap, Result, relevance_for, tie_scores

PREFIX = "eraser"
#: ERASER's AOPC bins (fractions of the tokens)
ERASER_BINS = (0.01, 0.05, 0.10, 0.20, 0.50)


class Comprehensiveness(PerStepMean):
    """Mean drop of the explained class's probability when the top tokens are removed (higher is better)."""

    higher_is_better = True


class Sufficiency(PerStepMean):
    """Mean drop of the explained class's probability when only the top tokens are kept (lower is better)."""

    higher_is_better = False


class ERASERFaithfulnessTest(EvaluationCallback):
    """Comprehensiveness, sufficiency and AOPC per method and class setting (module docstring).

    Args:
        methods: method names (default: every method of the module's outputs).
        class_settings: which explained classes (``predicted``: ERASER's; ``target``).
        bins: fractions ``q`` of the tokens in the rationale (ERASER's 1, 5, 10, 20, 50 % by default).
        masking: token removal, ``delete`` (default), ``pad`` or ``mask``.
        masking_options: options of :class:`~evaluation.perturbers.TokenPerturber` (default ``{clamp: false}``;
            ``fraction_of`` must stay ``real``).
        ties: ``random`` (default) or ``index``; tie_seed: the random map's seed.
        forward_batch_size: sequences per forward (default: the classifier's).
    """

    def __init__(self, methods: Optional[Sequence[str]] = None, class_settings: Sequence[str] = ("predicted",),
                 bins: Sequence[float] = ERASER_BINS, masking: str = "delete",
                 masking_options: Optional[PlainDict] = None, ties: str = "random", tie_seed: int = 0,
                 forward_batch_size: Optional[int] = None) -> None:
        super().__init__()
        self._select(methods, class_settings)
        bins = [float(q) for q in bins]
        if not bins or any(not 0.0 < q <= 1.0 for q in bins) or sorted(set(bins)) != bins:
            raise ValueError(f"bins must be increasing fractions in (0, 1], got {bins}")
        if ties not in TIES:
            raise ValueError(f"unknown tie-breaking convention {ties!r}; choose one of {TIES}")
        options = {"clamp": False, **dict(masking_options or {})}
        if options.get("fraction_of", "real") != "real":
            raise ValueError("ERASER's bins are fractions of each text's real tokens: fraction_of must be 'real'")
        self.perturber = build_perturber(masking, **options)
        if not isinstance(self.perturber, TokenPerturber):
            raise ValueError(f"masking {masking!r} is not a token removal; choose one of {TokenPerturber.REMOVALS}")
        self.bins, self.masking, self.ties, self.tie_seed = bins, masking, ties, int(tie_seed)
        self.forward_batch_size = forward_batch_size
        self._metrics: Dict[ResultKey, Metric] = {}
        self._built_methods: List[str] = []

    # -------------------------------------------------------------------------------- metrics
    @staticmethod
    def _key(method: str, setting: str, what: str) -> ResultKey:
        return ResultKey(PREFIX, method, setting, what)

    def build(self, methods: Sequence[str], device=None) -> None:
        self._built_methods = list(methods)
        self._metrics = {}
        for m in methods:
            for s in self.class_settings:
                self._metrics[self._key(m, s, "comprehensiveness")] = Comprehensiveness(len(self.bins))
                self._metrics[self._key(m, s, "sufficiency")] = Sufficiency(len(self.bins))
        self._place_metrics(device)

    # -------------------------------------------------------------------------------- update
    def _drops(self, batch: Dict[str, Any], scores: Tensor, classes: Tensor, p_full: Tensor, classifier: Any,
               tie_scores: Optional[Tensor]) -> Dict[str, Tensor]:
        """``{"comprehensiveness": [B, S], "sufficiency": [B, S]}`` of one map."""
        removable = self.perturber.removable(batch)
        ranks = removal_ranks(scores, tie_scores, removable)
        top = removal_masks(ranks, removal_counts(self.bins, self.perturber.num_units(batch))) & removable[None]
        steps, b = top.shape[:2]
        rows = torch.arange(b, device=classes.device).repeat(steps)
        out = {}
        for what, removed in (("comprehensiveness", top), ("sufficiency", removable[None] & ~top)):
            inputs = self.perturber.perturb(batch, removed, classifier)
            probs = classifier.probabilities(inputs, batch_size=self.forward_batch_size)
            p = probs[torch.arange(steps * b, device=probs.device), classes[rows].to(probs.device)]
            out[what] = (p_full[:, None] - p.reshape(steps, b).T.to(p_full)).to(torch.float64)
        return out

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        relevance = outputs["relevance"]
        self._build_at_first_batch(outputs)
        classifier = outputs["classifier"]
        full = torch.softmax(outputs["logits"].detach().double(), dim=-1)
        ties = tie_scores(self.perturber, self.ties, batch, outputs.get("layout"), self.tie_seed, "eraser faithfulness")
        for method in self._built_methods:
            once = OncePerMap()   # the same map explaining the same classes: its drops are computed once
            for setting in self.class_settings:
                rel = relevance_for(relevance, method, setting, "eraser faithfulness")
                classes = outputs["targets"][setting]

                def drops(rel=rel, classes=classes):
                    scores = self.perturber.unit_scores(rel, batch, outputs.get("layout"))
                    p_full = full.gather(1, classes[:, None].to(full.device))[:, 0]
                    return self._drops(batch, scores, classes, p_full, classifier, ties)

                reuse = once.get(rel, drops, key=classes)
                for what, values in reuse.items():
                    self._metrics[self._key(method, setting, what)].update(values)

    # -------------------------------------------------------------------------------- compute
    def compute(self) -> Dict[str, Result]:
        results: Dict[str, Result] = {}
        for key, metric in self._metrics.items():
            curve = [float(v) for v in metric.compute()]
            results[key.format()] = curve
            for q, value in zip(self.bins, curve):
                results[replace(key, metric=f"{key.metric}@{q:g}").format()] = value
            results[replace(key, metric=f"aopc_{key.metric}").format()] = float(sum(curve) / len(curve))
        return results

    def higher_is_better(self) -> Dict[str, Optional[bool]]:
        declared: Dict[str, Optional[bool]] = {}
        for key, metric in self._metrics.items():
            declared[key.format()] = None
            for q in self.bins:
                declared[replace(key, metric=f"{key.metric}@{q:g}").format()] = metric.higher_is_better
            declared[replace(key, metric=f"aopc_{key.metric}").format()] = metric.higher_is_better
        return declared

    def curve_x(self) -> Dict[str, List[float]]:
        return {key.format(): list(self.bins) for key in self._metrics}
