"""Explanation targets: which scalar of the model's output a method explains (``explain=``).

Inseq's step functions (Sarti et al. 2023, "Inseq: An Interpretability Toolkit for Sequence Generation Models",
``inseq/attr/step_functions.py``) and the contrastive explanations of Yin & Neubig 2022 ("Interpreting Language
Models with Contrastive Explanations", EMNLP, Eq. 3-4), per row ``b`` with target class ``t_b`` and foil ``f_b``:

* ``"logit"`` (default, every method's number before this option existed): ``z_t``;
* ``"probability"``: ``softmax(z)_t`` (Inseq ``probability``; ViT-Shapley, TIS and AtMan explain it);
* ``"log_probability"``: ``log_softmax(z)_t``;
* ``"logit_difference"``: ``z_t - z_f`` (Inseq ``contrast_logits_diff``);
* ``"probability_difference"``: ``softmax(z)_t - softmax(z)_f`` (Inseq ``contrast_prob_diff``, Yin & Neubig's
  gradient-norm / input-x-gradient contrast).

The foil is given like ``target``: an ``int`` for every row or a ``LongTensor[B]`` (one per row); it is read only by
the two contrastive targets, which need one. Rows never interact, so the gradient of the batch sum of the
per-row scores w.r.t. any per-row tensor is each row's own gradient.
"""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from .targets import TargetType, resolve_target

EXPLAINED = ("logit", "probability", "log_probability", "logit_difference", "probability_difference")
#: the targets that contrast the explained class with a foil class
CONTRASTIVE = ("logit_difference", "probability_difference")


def check_explain(explain: str, option: str = "explain") -> str:
    """``explain`` if it names an explanation target (:data:`EXPLAINED`), else ``ValueError`` naming the option."""
    if explain not in EXPLAINED:
        raise ValueError(f"{option} must be one of {EXPLAINED}, got {explain!r}")
    return explain


#: what a decomposition of the logit explains (linear in it): a logit, or its difference with a foil's
LOGIT_EXPLAINED = ("logit", "logit_difference")


class ExplainsALogit:
    """``explain`` of the methods that decompose a logit (ALTI-Logit, DecompX): :data:`LOGIT_EXPLAINED` only; the
    foil is read by ``logit_difference``."""

    explain: str = "logit"

    def set_logit_explain(self, explain: str, name: str) -> None:
        if check_explain(explain) not in LOGIT_EXPLAINED:
            raise ValueError(f"{name} explains a logit, linear in the decomposition: explain must be one of "
                             f"{LOGIT_EXPLAINED}, got {explain!r}")
        self.explain = explain

    @property
    def reads_foil(self) -> bool:
        return self.explain == "logit_difference"


def resolve_foil(logits: Tensor, foil: TargetType, explain: str) -> Optional[Tensor]:
    """``LongTensor[B]`` foil classes for a contrastive ``explain`` (``ValueError`` when none is given), ``None``
    otherwise (``ValueError`` when one is given: it would be silently ignored)."""
    if explain not in CONTRASTIVE:
        if foil is not None:
            raise ValueError(f"a foil is read only by the contrastive explanation targets {CONTRASTIVE}; "
                             f"explain={explain!r} does not")
        return None
    if foil is None:
        raise ValueError(f"explain={explain!r} contrasts the target with a foil class: give foil= (an int or one "
                         "class per sample, like target)")
    return resolve_target(logits, foil)


def explained_scores(logits: Tensor, target: Tensor, explain: str = "logit",
                     foil: Optional[Tensor] = None) -> Tensor:
    """Per-row explained score ``[B]`` of ``logits`` ``[B, C]`` (module docstring); ``target`` and ``foil``
    resolved ``LongTensor[B]`` (:func:`~methods.targets.resolve_target`, :func:`resolve_foil`)."""
    check_explain(explain)
    if explain in ("probability", "probability_difference"):
        values = logits.softmax(dim=-1)
    elif explain == "log_probability":
        values = logits.log_softmax(dim=-1)
    else:
        values = logits
    score = values.gather(-1, target[:, None])[:, 0]
    if explain in CONTRASTIVE:
        if foil is None:
            raise ValueError(f"explain={explain!r} needs a foil")
        score = score - values.gather(-1, foil.to(device=values.device)[:, None])[:, 0]
    return score


def explained_score(logits: Tensor, target: Tensor, explain: str = "logit",
                    foil: Optional[Tensor] = None) -> Tensor:
    """The batch sum of :func:`explained_scores`: the scalar whose gradient w.r.t. a per-row tensor is each row's
    own gradient."""
    return explained_scores(logits, target, explain, foil).sum()


def repeat_rows(values: Optional[Tensor], times: int) -> Optional[Tensor]:
    """``values`` ``[B]`` repeated ``times`` times, copy-major (``[S * B]``), as the step copies are laid out."""
    return None if values is None else values.repeat(times)

