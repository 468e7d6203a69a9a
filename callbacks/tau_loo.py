"""Leave-one-out rank correlation test for texts, τ-LOO (ferret's ``TauLOO_Evaluation``; Attanasio et al. 2023,
EACL demo, sec. 3.2): per text, Kendall's τ-b between the map's scores of the removable tokens and the drops of the
explained class's probability when each token is removed alone; higher is better; mean over texts.

Leave-one-out inputs depend on the text only, so they run once per batch for every method and class setting: one
forward per removable token (special tokens never; ``tau_loo/forwards`` = Σ tokens, counted), at a fixed width (as
the faithfulness-correlation test). Removal as the perturbation test's token ``masking`` (``pad``, ``mask``,
``delete``). The scores are the method's raw token scores (ferret correlates its own normalised scores; τ is
invariant to any monotone map of them). A text whose scores or drops are constant is skipped (τ undefined). Images
are refused (the test is defined on token sequences here). Results: ``tau_loo/<method>/<setting>/kendall_tau``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
from torch import Tensor

from evaluation.metric_cards import MetricCard
from evaluation.perturbers import TokenPerturber, build_perturber

from .base import relevance_for
from .faithfulness_correlation import fixed_width_logits
from .sample_scores import SampleScoreTest

FORWARDS = "forwards"


def kendall_tau_b(x: Tensor, y: Tensor) -> Tensor:
    """Kendall's τ-b of two score vectors ``[n]`` (float64; NaN where either is constant): Σ_{i<j} sign(x_i − x_j)
    sign(y_i − y_j) over the square root of the numbers of pairs untied in x and in y."""
    x, y = x.to(torch.float64), y.to(torch.float64)
    sx, sy = torch.sign(x[:, None] - x[None]), torch.sign(y[:, None] - y[None])
    upper = torch.triu(torch.ones_like(sx, dtype=torch.bool), diagonal=1)
    num = (sx * sy)[upper].sum()
    den = torch.sqrt((sx != 0)[upper].sum().to(torch.float64) * (sy != 0)[upper].sum().to(torch.float64))
    return num / den if den > 0 else torch.tensor(float("nan"), dtype=torch.float64)


class TauLOOTest(SampleScoreTest):
    """τ-LOO of every method's token map (module docstring).

    Args:
        methods: method names (default: every method of the module's outputs).
        class_settings: explained classes (default ``predicted``).
        masking: how a removed token goes (``pad``, default; ``mask``; ``delete``: ferret removes the token).
        oracle: add the ground-truth map as method ``oracle`` (:func:`callbacks.sample_scores.oracle_map`).
    """

    counters = (FORWARDS,)
    PREFIX = "tau_loo"
    metric_cards = (
        MetricCard("kendall_tau", "Kendall tau-b between the map's token scores and each token's leave-one-out drop "
                   "of the explained class's probability", "ferret TauLOO_Evaluation (Attanasio et al. 2023)",
                   "n F (n = removable tokens)", True, ("text", "decoder", "clip_text")),
    )

    def __init__(self, methods: Optional[Sequence[str]] = None, class_settings: Sequence[str] = ("predicted",),
                 masking: str = "pad", oracle: bool = False) -> None:
        if masking not in TokenPerturber.REMOVALS:
            raise ValueError(f"tau_loo: masking must be one of {TokenPerturber.REMOVALS}, got {masking!r}")
        self.masking = masking
        super().__init__(methods, class_settings, oracle)

    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        return [f"tau_loo_masking:{init_args.get('masking', 'pad')}"]

    def conventions(self) -> Dict[str, Any]:
        return {"masking": self.masking, "score": "probability", "correlation": "Kendall tau-b"}

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        if not isinstance(batch.get("input_ids"), Tensor):
            raise ValueError("tau_loo: τ-LOO is defined on token sequences (texts, decoders, CLIP's text tower); "
                             f"the batch has no 'input_ids' (got keys {sorted(batch)})")
        outputs = self._indexed_outputs(outputs, batch)
        perturber = build_perturber(self.masking, clamp=False)
        classifier = outputs["classifier"]
        removable = perturber.removable(batch).cpu()
        b, n = removable.shape
        counts = removable.sum(dim=1)
        steps = int(counts.max()) if b else 0
        positions = torch.sort((~removable).to(torch.int8), dim=1, stable=True).indices     # removable first
        removed = torch.zeros(steps, b, n, dtype=torch.bool)
        real = torch.arange(steps)[:, None] < counts[None]                                  # [S, B]
        s_idx, b_idx = real.nonzero(as_tuple=True)
        removed[s_idx, b_idx, positions[b_idx, s_idx]] = True
        inputs = perturber.perturb(batch, removed.to(batch["input_ids"].device), classifier)
        flat = (s_idx * b + b_idx).to(batch["input_ids"].device)
        logits = fixed_width_logits(classifier, classifier.take(inputs, flat), int(classifier.batch_size))
        self._metrics[FORWARDS].update(int(flat.numel()))
        probs = torch.softmax(logits.to(torch.float64), dim=-1).cpu()
        clean = torch.softmax(outputs["logits"].detach().to(torch.float64), dim=-1).cpu()
        for method, setting in self._pairs():
            rel = relevance_for(outputs["relevance"], method, setting, self.PREFIX).detach().to(torch.float64).cpu()
            if rel.shape != removable.shape:
                raise ValueError(f"tau_loo: token scores {tuple(rel.shape)} do not match the batch's tokens "
                                 f"{tuple(removable.shape)}")
            target = outputs["targets"][setting].long().cpu()
            drops = clean[b_idx, target[b_idx]] - probs[torch.arange(len(b_idx)), target[b_idx]]
            values = torch.full((b,), float("nan"), dtype=torch.float64)
            for i in range(b):
                mine = b_idx == i
                if int(mine.sum()) >= 2:
                    values[i] = kendall_tau_b(rel[i, positions[i, s_idx[mine]]], drops[mine])
            self._metrics[f"{method}/{setting}"].update(batch["index"], values[:, None])
