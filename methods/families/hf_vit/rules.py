"""Where AttnLRP / CP-LRP place their rules in transformers' ViT-like classifiers: the defaults, the patch
embedding as the input embedding, and DINOv2's SwiGLU MLPs (those with a ``gate_proj``) as gated MLPs."""
from __future__ import annotations

from typing import Any, List

from torch import nn

from ...adapters.base import RuleMap


class ViTLikeRules(RuleMap):
    """The patch embedding ``embeddings.patch_embeddings`` as the input embedding."""

    adapter: Any

    def input_embedding(self) -> nn.Module:
        return self.adapter.backbone.embeddings.patch_embeddings


class Dinov2Rules(ViTLikeRules):
    """DINOv2: its SwiGLU MLPs are gated MLPs."""

    def gated_mlps(self) -> List[nn.Module]:
        return [block.mlp for block in self.adapter.blocks if hasattr(block.mlp, "gate_proj")]
