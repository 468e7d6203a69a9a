"""Where AttnLRP / CP-LRP place their rules in transformers' CLIP-like towers (CLIP; SigLIP builds on them): the
rules act inside the explained tower and its projection only (the other tower is not on the path); the input
embedding is the patch convolution (vision: its products summed over the width per patch) or the token
embedding (text). CLIP's L2 normalisation in the scorer takes the identity rule under :meth:`head_rules`."""
from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ...adapters.base import RuleMap


class CLIPTowerRules(RuleMap):
    """The rules' scope: the tower's modules and its projection."""

    adapter: Any

    def scope(self) -> nn.Module:
        return nn.ModuleList([self.adapter.tower_model, self.adapter.projection()])


class PatchVisionRules(RuleMap):
    """A vision tower's input embedding: the patch convolution ``embeddings.patch_embedding``."""

    adapter: Any

    def input_embedding(self) -> nn.Module:
        return self.adapter.tower_model.embeddings.patch_embedding

    def embedding_scores(self, products: Tensor) -> Tensor:
        """The patch convolution's ``[B, D, rows, cols]`` summed over ``D``: ``[B, rows * cols]``."""
        return products.sum(dim=1).flatten(1)


class TokenTextRules(RuleMap):
    """A text tower's input embedding: ``embeddings.token_embedding``."""

    adapter: Any

    def input_embedding(self) -> nn.Module:
        return self.adapter.tower_model.embeddings.token_embedding


class CLIPVisionRules(PatchVisionRules, CLIPTowerRules):
    """transformers' CLIP vision tower."""


class CLIPTextRules(TokenTextRules, CLIPTowerRules):
    """transformers' CLIP text tower."""
