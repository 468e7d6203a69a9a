"""Where AttnLRP / CP-LRP place their rules in Swin models: the defaults (LayerNorms, GELU, the attention's
q / k / v projections of every block), the patch embedding's convolution as the input embedding, and its
per-patch scores summed over each last-stage token's cell (the layout's grid)."""
from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ...adapters.base import RuleMap


class SwinRules(RuleMap):
    """Both libraries' Swin classifiers (:class:`~.adapter.SwinAdapter`)."""

    adapter: Any

    def input_embedding(self) -> nn.Module:
        """The patch embedding's ``Conv2d`` (before its norm and any absolute position): ``[B, C, rows, cols]``."""
        return self.adapter.patch_projection()

    def embedding_scores(self, products: Tensor) -> Tensor:
        """``embedding * gradient`` ``[B, C, rows, cols]`` summed over the channels and then over each cell of
        ``2^(stages - 1) x 2^(stages - 1)`` patches that one last-stage token covers (the patch merges' cells):
        ``[B, P]`` in the layout's row-major order; a sum, so the total relevance is kept."""
        per_patch = products.sum(dim=1)
        cell = 2 ** (len(self.adapter.stages) - 1)
        batch, rows, cols = per_patch.shape
        return per_patch.reshape(batch, rows // cell, cell, cols // cell, cell).sum(dim=(2, 4)).flatten(1)
