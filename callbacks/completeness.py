"""Completeness (conservation) test: the sum of a conserving method's relevance against the explained logit
(Montavon et al. 2017, "Explaining nonlinear classification decisions with deep Taylor decomposition", eq. 1:
Σ_p R_p = f(x); Sundararajan et al. 2017's completeness with the baseline output 0); no forward pass (the module's
clean logits).

Which methods conserve, read from their code: ``cp_lrp`` (exactly conservative on a bias-free model; biases and
LayerNorm's stabiliser absorb relevance otherwise) and ``attnlrp`` (AttnLRP's rules conserve up to the softmax
rule's bias term and the stabilisers, ``methods/attnlrp.py``); full ``lrp`` only with ``rules: ours`` (conservative
up to the stabiliser; its default ``orig`` rules roughly double the relevance per Linear layer,
``methods/lrp/rules.py``). The test defaults to :data:`CONSERVING` and takes any method named in ``methods``.
On the input side the sum covers what the method returns: at ``level: tokens`` / ``patches`` the position
embeddings, [CLS] and register tokens keep their own share, so the ratio measures the share that reaches the
scored units.

Per sample: ``ratio`` = Σ a / logit (1: everything conserved; no direction) and ``relative_error`` =
|Σ a − logit| / |logit| (lower is better); NaN where the logit is 0. Results:
``completeness/<method>/<setting>/<ratio|relative_error>``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
from torch import Tensor

from evaluation.metric_cards import MetricCard

from .base import relevance_for
from .sample_scores import SampleScoreTest

#: the registered methods whose relevance is conserved by construction (module docstring)
CONSERVING = ("attnlrp", "cp_lrp")


class CompletenessTest(SampleScoreTest):
    """Σ relevance against the explained logit for conserving methods (module docstring).

    Args:
        methods: the methods to test (default :data:`CONSERVING`; add ``lrp`` when it runs with ``rules: ours``).
        class_settings: explained classes (default ``predicted``).
    """

    PREFIX = "completeness"
    metric_cards = (
        MetricCard("ratio", "sum of the relevance over the explained logit (1: conserved)",
                   "Montavon et al. 2017, eq. 1 (conservation)", "0 F", None),
        MetricCard("relative_error", "|sum of the relevance - explained logit| / |logit|",
                   "Montavon et al. 2017, eq. 1; Quantus Completeness (baseline output 0)", "0 F", False),
    )

    def __init__(self, methods: Optional[Sequence[str]] = CONSERVING, class_settings: Sequence[str] = ("predicted",)
                 ) -> None:
        if methods is None or not list(methods):
            raise ValueError(f"completeness: name the conserving methods to test (e.g. {list(CONSERVING)}); it is "
                             "not defined on methods whose relevance is not conserved")
        super().__init__(methods, class_settings)

    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        return ["completeness:logit"]

    def conventions(self) -> Dict[str, Any]:
        return {"reference": "explained logit (baseline output 0)", "sum": "over the method's returned units"}

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        if not isinstance(batch.get("index"), Tensor):
            raise KeyError(f"{self.PREFIX}: the batch has no 'index' (each sample's dataset index); got keys "
                           f"{sorted(batch)}")
        self._build_at_first_batch(outputs)
        logits = outputs["logits"].detach().to(torch.float64).cpu()
        for method, setting in self._pairs():
            rel = relevance_for(outputs["relevance"], method, setting, self.PREFIX)
            total = torch.nan_to_num(rel.detach().to(torch.float64)).flatten(1).sum(dim=1).cpu()
            logit = logits.gather(1, outputs["targets"][setting].long().cpu()[:, None])[:, 0]
            safe = torch.where(logit != 0, logit, torch.ones_like(logit))
            nan = torch.full_like(logit, float("nan"))
            ratio = torch.where(logit != 0, total / safe, nan)
            error = torch.where(logit != 0, (total - logit).abs() / safe.abs(), nan)
            self._metrics[f"{method}/{setting}"].update(batch["index"], self._as_rows(ratio, error))
