"""What a method that explains a chosen output (``explain=``, ``foil=``) shares: the options, their check and the
per-row resolution of targets and foils (:mod:`methods.explanation_targets` for the targets themselves)."""
from __future__ import annotations

from typing import Optional, Tuple

from torch import Tensor

from .base import AttributionMethod
from .explanation_targets import CONTRASTIVE, check_explain, resolve_foil
from .targets import TargetType, resolve_target


class ExplainedOutput(AttributionMethod):
    """An :class:`AttributionMethod` with the options ``explain`` (``"logit"`` default) and ``foil`` (the default
    foil of a contrastive ``explain``; a call's ``foil=`` overrides it)."""

    def __init__(self, explain: str = "logit", foil: Optional[int] = None):
        self.explain = check_explain(explain)
        if foil is not None and explain not in CONTRASTIVE:
            raise ValueError(f"foil={foil!r} is read only by the contrastive explanation targets {CONTRASTIVE}")
        self.foil = foil

    @property
    def reads_foil(self) -> bool:
        return self.explain in CONTRASTIVE

    @property
    def given_foil(self) -> TargetType:
        """The foil of the call in progress as given (an int or one class per row): the call's, else the
        method's; resolved against the logits by :func:`~methods.explanation_targets.resolve_foil`."""
        return self.call_foil if self.call_foil is not None else self.foil

    def resolve(self, logits: Tensor, target: TargetType) -> Tuple[Tensor, Optional[Tensor]]:
        """The resolved targets and foils of the rows of ``logits`` (the call's foil, else the method's)."""
        return resolve_target(logits, target), resolve_foil(logits, self.given_foil, self.explain)
