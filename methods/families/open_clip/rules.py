"""Where AttnLRP / CP-LRP place their rules in open_clip's CLIP towers: the explained tower's modules only (the
other tower is not on the path); the input embedding is the patch convolution ``conv1`` (its products summed over
the width per patch) or the token embedding."""
from __future__ import annotations

from typing import Any, List

from torch import Tensor, nn

from ...adapters.base import RuleMap


class OpenCLIPVisionRules(RuleMap):
    """The vision tower ``clip.visual``."""

    adapter: Any

    def scope(self) -> nn.Module:
        return self.adapter.visual

    def input_embedding(self) -> nn.Module:
        return self.adapter.visual.conv1

    def embedding_scores(self, products: Tensor) -> Tensor:
        """The patch convolution's ``[B, D, rows, cols]`` summed over ``D``: ``[B, rows * cols]``."""
        return products.sum(dim=1).flatten(1)


class OpenCLIPTextRules(RuleMap):
    """The text tower: token embedding, transformer, final norm and (a module) the text projection."""

    adapter: Any

    def scope(self) -> nn.Module:
        clip = self.adapter.clip
        modules: List[nn.Module] = [clip.token_embedding, clip.transformer, clip.ln_final]
        if isinstance(clip.text_projection, nn.Module):
            modules.append(clip.text_projection)
        return nn.ModuleList(modules)

    def input_embedding(self) -> nn.Module:
        return self.adapter.clip.token_embedding
