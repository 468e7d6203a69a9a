"""Adapter for timm's distilled DeiT, ``timm.models.deit.VisionTransformerDistilled``.

The model is a timm ``VisionTransformer`` with a second prefix token, the distillation token at position 1
(after [CLS] at 0), and a second classifier ``head_dist`` on it. Outside distillation training
(``distilled_training`` false, or eval mode) its logits are the mean of the two heads' logits,
``(head(x[:, 0]) + head_dist(x[:, 1])) / 2`` on the final-norm tokens: both tokens feed every logit, with
equal weight. Methods run the model in eval mode (:mod:`methods.model_state`), where the heads are always
averaged, whatever ``distilled_training`` says.

Design notes: ``NOTES.md`` beside this file (adapter.py).
"""
from __future__ import annotations

from typing import Any, List, Optional

import torch
from torch import Tensor, nn

from ...adapters.base import Layout, ModelInputs, ReadOut, register_adapter
from ...adapters.capability import Capability
from ...adapters.library import class_problem
from ..timm_vit.adapter import TimmViTAdapter


@register_adapter
class TimmDeiTAdapter(TimmViTAdapter):
    """Stock timm ``VisionTransformerDistilled`` (DeiT with a distillation token, see the module docstring):
    blocks and hook points as the timm ViT's; read-out ``"weighted"`` (the [CLS] and distillation tokens, 1/2
    each); prefix tokens [CLS] and distillation, never scored."""

    family = "timm VisionTransformerDistilled (DeiT)"

    #: the [CLS] and distillation tokens, 1/2 each (:meth:`readout_weights`)
    readout: Capability[ReadOut] = Capability(lambda adapter: ReadOut(adapter, "weighted", True,
                                                                      adapter.readout_weights))

    @classmethod
    def supports(cls, model: nn.Module) -> Optional[str]:
        return class_problem(model, "timm.models.deit", "VisionTransformerDistilled")

    def distillation_head(self) -> Any:
        """The second head ``head_dist``, reading the distillation token."""
        return self.model.head_dist

    def prefix_parameters(self) -> List[Tensor]:
        """[CLS], then the distillation token (the positional embedding covers both unless ``no_embed_class``)."""
        return [self.model.cls_token, self.model.dist_token]

    def readout_weights(self, inputs: ModelInputs, layout: Layout) -> Tensor:
        """1/2 at [CLS] (position 0) and at the distillation token (position 1), 0 elsewhere."""
        weights = torch.zeros(layout.num_positions)
        weights[:2] = 0.5
        return weights.expand(inputs.batch_size, -1)
