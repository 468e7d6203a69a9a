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

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from evaluation.metrics import PerStepMean
from evaluation.perturbers import TokenPerturber, build_perturber
from evaluation.ranking import TIES, removal_counts, removal_masks, removal_ranks
from evaluation.result_keys import ResultKey
from methods.config_values import PlainDict

from .base import EvaluationCallback
from .removal_curves import Curve, RemovalCurveTest

PREFIX = "eraser"
#: ERASER's AOPC bins (fractions of the tokens)
ERASER_BINS = (0.01, 0.05, 0.10, 0.20, 0.50)


class Comprehensiveness(PerStepMean):
    """Mean drop of the explained class's probability when the top tokens are removed (higher is better)."""

    higher_is_better = True


class Sufficiency(PerStepMean):
    """Mean drop of the explained class's probability when only the top tokens are kept (lower is better)."""

    higher_is_better = False


class ERASERFaithfulnessTest(RemovalCurveTest):
    """Comprehensiveness, sufficiency and AOPC per method and class setting (module docstring), a definition on
    the removal-curve mechanism (:class:`callbacks.removal_curves.RemovalCurveTest`): two curves over the bins
    (the drop of the explained class's probability with ``r_q`` removed, with ``r_q`` alone), kept as sums
    (:class:`evaluation.metrics.PerStepMean`), each bin's value and their mean (AOPC) read from the mean curve.

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

    PER_SAMPLE = False        # sums of the drops per bin, as the progress files have always held
    COUNT_FORWARDS = False    # 2 * len(bins) * B forwards per map: the clean probability is the run's forward

    def __init__(self, methods: Optional[Sequence[str]] = None, class_settings: Sequence[str] = ("predicted",),
                 bins: Sequence[float] = ERASER_BINS, masking: str = "delete",
                 masking_options: Optional[PlainDict] = None, ties: str = "random", tie_seed: int = 0,
                 forward_batch_size: Optional[int] = None) -> None:
        EvaluationCallback.__init__(self)   # the conventions are ERASER's, not RemovalCurveTest's options
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
        self.score, self.step, self.oracle, self.name, self.owner = "probability", None, False, PREFIX, \
            "eraser faithfulness"
        self.CURVES = tuple(Curve(what, "morf", mode, tuple((f"@{q:g}", hib) for q in self.bins) + (("aopc", hib),))
                            for what, mode, hib in (("comprehensiveness", "delete", Comprehensiveness.higher_is_better),
                                                    ("sufficiency", "insert", Sufficiency.higher_is_better)))
        self.reset()

    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        return []

    def conventions(self) -> Dict[str, Any]:
        return {}   # the run's config holds them

    # -------------------------------------------------------------------------------- the definition
    def build(self, methods: Sequence[str], device=None) -> None:  # type: ignore[override]
        """Comprehensiveness and sufficiency per method and class setting, at the bins."""
        super().build(methods, self.bins, device)

    def build_for(self, methods: Sequence[str], batch: Mapping[str, Any], device: Any) -> None:
        self.build(methods, device)

    def curve_metric(self, curve: Curve, num_points: int) -> Metric:
        return (Comprehensiveness if curve.name == "comprehensiveness" else Sufficiency)(num_points)

    def curve_key(self, method: str, setting: str, curve: str, what: str) -> str:
        metric = curve if what == "curve" else f"{curve}{what}" if what.startswith("@") else f"{what}_{curve}"
        return ResultKey(PREFIX, method, setting, metric).format()

    def summary_functions(self) -> Dict[str, Callable[[Tensor, Sequence[float]], Tensor]]:
        def aopc(mean_curve: Tensor, xs: Sequence[float]) -> Tensor:   # ERASER's mean over the bins
            values = [float(v) for v in mean_curve[0]]
            return torch.tensor([sum(values) / len(values)], dtype=torch.float64)

        def at(i: int) -> Callable[[Tensor, Sequence[float]], Tensor]:
            return lambda mean_curve, xs: mean_curve[:, i]

        return {"aopc": aopc, **{f"@{q:g}": at(i) for i, q in enumerate(self.bins)}}

    def _check_modality(self, batch: Mapping[str, Any]) -> None:
        return None   # the token perturber reads what it needs

    def _counts(self, batch: Mapping[str, Any]) -> Tensor:
        return torch.zeros(0, dtype=torch.long)   # _drops counts int(q * n) itself

    def removal_curves(self, outputs: Mapping[str, Any], batch: Mapping[str, Any], scores: Tensor,
                       ties: Optional[Tensor], classes: Optional[Tensor], counts: Tensor) -> Dict[str, Tensor]:
        full = torch.softmax(outputs["logits"].detach().double(), dim=-1)
        p_full = full.gather(1, classes[:, None].to(full.device))[:, 0]
        return self._drops(dict(batch), scores, classes, p_full, outputs["classifier"], ties)

    def update_curve(self, metric: Metric, batch: Mapping[str, Any], values: Tensor) -> None:
        metric.update(values)

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
