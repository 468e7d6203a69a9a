"""Saliency and Input x Gradient at a named input point, and what every gradient baseline at a point shares.

* ``saliency`` (Simonyan et al. 2014, "Deep Inside Convolutional Networks", Eq. 3; Captum ``Saliency``): the
  gradient ``g = dy/dx`` of the explained output ``y`` w.r.t. the input ``x`` at ``point``, reduced per token /
  patch by ``reduction``: ``"abs"`` (default; Captum's ``abs=True``, the sum of ``|g|`` over the width),
  ``"signed"`` (the sum of ``g``) or ``"l2"`` (``||g||_2`` over the width, as ALTI's and DecompX's baselines).
* ``input_x_gradient`` (Shrikumar et al. 2016, "Not Just a Black Box"; Captum ``InputXGradient``): ``x * g``
  summed over the width (signed). At ``point="embedding"`` this is exactly :mod:`methods.attnlrp` with its rules
  off (``attnlrp`` with ``rules=False``).

``point`` and the pixel-to-patch reduction: :mod:`methods.input_points`; ``explain`` (``"logit"`` default,
``"probability"``, ``"log_probability"``, ``"logit_difference"``, ``"probability_difference"``, with ``foil=``):
:mod:`methods.explanation_targets`. Scores are raw (sign kept), ``[B, P]`` for images, ``[B, N]`` for sequences
(exactly 0 at padding); one forward and one backward. The attention stays as the model was built (never read).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .adapters import ModelAdapter, ModelInputs
from .explained_output import ExplainedOutput
from .explanation_targets import explained_score
from .input_points import check_choice, logits_at, point_values, reduce_scores, resolve_point
from .registry import register_method
from .targets import TargetType, resolve_target

SALIENCY_REDUCTIONS = {"abs": "sum", "signed": "sum", "l2": "l2"}


class PointAttribution(ExplainedOutput):
    """A method whose scores are an element-wise map at an input point, reduced per token / patch.

    Subclasses implement :meth:`elementwise`; :attr:`score_reduction` names the reduction
    (:func:`methods.input_points.reduce_scores`). Options shared: ``point``, ``explain``, ``foil`` (the default
    foil of a contrastive ``explain``; a call's ``foil=`` overrides it)."""

    reads_attention = False
    score_reduction = "sum"

    def __init__(self, point: str = "auto", explain: str = "logit", foil: Optional[int] = None):
        super().__init__(explain, foil)
        self.point = point

    def check_adapter(self, adapter: ModelAdapter) -> None:
        super().check_adapter(adapter)
        resolve_point(adapter, self.point, self.name)

    def gradient(self, adapter: ModelAdapter, inputs: ModelInputs, point: str, values: Tensor,
                 target: TargetType, foil: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """``d y / d values`` with ``values`` at ``point`` of ``inputs`` (one row per row), the resolved targets
        and foils (``target``: as the call takes it, or resolved per row; ``foil``: resolved per row, else
        resolved here)."""
        values = values.detach().requires_grad_(True)
        with torch.enable_grad():
            logits = logits_at(adapter, inputs, point, values)
        if foil is None:
            target, foil = self.resolve(logits, target)
        else:
            target = resolve_target(logits, target)
        (grad,) = torch.autograd.grad(explained_score(logits, target, self.explain, foil), values)
        return grad, target, foil

    def elementwise(self, adapter: ModelAdapter, inputs: ModelInputs, point: str, x: Tensor,
                    target: TargetType, foil: Optional[Tensor] = None) -> Tensor:
        """The element-wise attribution of ``x`` (the values at ``point`` of each row of ``inputs``)."""
        raise NotImplementedError

    def attribute(self, adapter: ModelAdapter, inputs: ModelInputs, target: TargetType) -> Tensor:
        for p in adapter.model.parameters():   # restored by preserved_model_state; no weight gradients
            p.requires_grad_(False)
        point = resolve_point(adapter, self.point, self.name)
        x = point_values(adapter, inputs, point)
        values = self.elementwise(adapter, inputs, point, x, target)
        return reduce_scores(adapter, inputs, point, values, self.score_reduction)


@register_method("saliency")
class Saliency(PointAttribution):
    """Saliency (Simonyan et al. 2014, Eq. 3; Captum ``Saliency``): the gradient of the explained output at
    ``point``, reduced by ``reduction`` (``"abs"`` default, ``"signed"``, ``"l2"``); see
    :mod:`methods.gradient_baselines` for every convention."""

    tags = ("generic_baseline", "gradient", "opt_in")

    def __init__(self, reduction: str = "abs", point: str = "auto", explain: str = "logit",
                 foil: Optional[int] = None):
        super().__init__(point, explain, foil)
        self.reduction = check_choice(reduction, tuple(SALIENCY_REDUCTIONS), "reduction", "saliency")
        self.score_reduction = SALIENCY_REDUCTIONS[reduction]

    def elementwise(self, adapter, inputs, point, x, target, foil=None):
        grad = self.gradient(adapter, inputs, point, x, target, foil)[0]
        return grad.abs() if self.reduction == "abs" else grad


@register_method("input_x_gradient")
class InputXGradient(PointAttribution):
    """Input x Gradient (Shrikumar et al. 2016; Captum ``InputXGradient``): ``x * dy/dx`` at ``point``, summed
    over the width; see :mod:`methods.gradient_baselines` for every convention."""

    tags = ("generic_baseline", "gradient", "opt_in")

    def elementwise(self, adapter, inputs, point, x, target, foil=None):
        return x * self.gradient(adapter, inputs, point, x, target, foil)[0]
