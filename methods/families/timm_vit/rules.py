"""Where AttnLRP / CP-LRP place their rules in timm ViTs: the defaults, the patch embedding as the input
embedding, the ``map`` pooling head's query and key-value projections as a head attention; gated MLPs (SwiGLU,
GLU) and gated attention have no rule here."""
from __future__ import annotations

from typing import Any, List

from torch import nn

from ...adapters.base import AttentionLinears, RuleMap


class TimmBlocksRules(RuleMap):
    """timm's block models: the patch embedding ``patch_embed`` as the input embedding."""

    adapter: Any

    def input_embedding(self) -> nn.Module:
        return self.adapter.model.patch_embed


class TimmViTRules(TimmBlocksRules):
    """timm ``VisionTransformer``: the ``map`` head's attention; refused gated MLPs and attention."""

    def head_attention_linears(self) -> List[AttentionLinears]:
        """The ``map`` pooling head's query and key-value projections (none for the other read-outs)."""
        pool = getattr(self.adapter.model, "attn_pool", None)
        if self.adapter.readout.kind != "attention_pool" or pool is None:
            return []
        return [AttentionLinears(out=pool.proj, q=pool.q, kv=pool.kv)]

    def problems(self) -> List[str]:
        """Gated MLPs (SwiGLU, GLU) and gated attention have no rule here: the uniform rule on their products is
        not applied."""
        problems = []
        for i, block in enumerate(self.adapter.blocks):
            mlp = getattr(block, "mlp", None)
            if mlp is not None and any(hasattr(mlp, name) for name in ("fc1_g", "fc1_x", "gate")):
                problems.append(f"block {i} gated mlp {type(mlp).__name__}")
            if getattr(getattr(block, "attn", None), "gate", None) is not None:
                problems.append(f"block {i} gated attention")
        return problems
