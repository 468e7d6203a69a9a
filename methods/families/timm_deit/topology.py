"""LRP topology of timm's distilled DeiT (``VisionTransformerDistilled``): the timm ViT graph
(:mod:`methods.families.timm_vit.topology`) with a second prefix token and a second head.

Graph (forward order): ``patch_embed.proj`` (Conv2d, z^B rule) -> [CLS] and distillation tokens concat ->
``+ pos_embed`` (Add; the positional embedding covers both prefix tokens unless ``no_embed_class``) -> blocks ->
``norm`` (identity) -> ``head`` on position 0 and ``head_dist`` on position 1 (Linear each) -> the mean of the two
logit vectors (Add of the two heads' outputs; the constant 1/2 is invisible to the rules, which split relevance in
proportion to the operands). Relevance reaches the final hidden states at positions 0 and 1 only (selection rule).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ...adapters import ActivationRecorder
from ...lrp.topology import refuse, register_topology
from ..timm_vit.topology import TimmViTTopology
from .adapter import TimmDeiTAdapter


@register_topology(TimmDeiTAdapter)
class TimmDeiTTopology(TimmViTTopology):
    """Relevance pass over a stock timm ``VisionTransformerDistilled`` through its
    :class:`~methods.adapters.TimmDeiTAdapter` (see the module docstring)."""

    @staticmethod
    def check(adapter: Any) -> None:
        """The timm ViT's checks, and ``head_dist`` a Linear layer."""
        TimmViTTopology.check(adapter)
        head_dist = adapter.distillation_head()
        if not isinstance(head_dist, nn.Linear):
            refuse(type(adapter.model).__name__, [f"head_dist {type(head_dist).__name__} (need nn.Linear)"])

    def record_head(self, rec: ActivationRecorder, layer_outputs: bool) -> None:
        """The timm ViT's hooks, and the inputs and outputs of both heads."""
        super().record_head(rec, layer_outputs)
        head, head_dist = self.adapter.classifier(), self.adapter.distillation_head()
        rec.output(head, "head_out")
        rec.input(head_dist, "head_dist_in")
        rec.output(head_dist, "head_dist_out")

    @torch.no_grad()
    def head_relprop(self, rules, acts, relevance_logits: Tensor) -> Tensor:
        """Relevance at the output of the final ``norm`` ``[B, N, D]``: the Add of the two heads' logits, each
        head's Linear rule, the selection of positions 0 ([CLS]) and 1 (distillation)."""
        head, head_dist = self.adapter.classifier(), self.adapter.distillation_head()
        r_cls, r_dist = rules["add"](acts["head_out"], acts["head_dist_out"], relevance_logits)
        hidden = acts["norm_out"]
        out = torch.zeros_like(hidden)
        out[:, 0] = rules["select"](hidden[:, 0], rules["linear"](acts["head_in"], head.weight, r_cls))
        out[:, 1] = rules["select"](hidden[:, 1], rules["linear"](acts["head_dist_in"], head_dist.weight, r_dist))
        return out
