"""Where AttnLRP / CP-LRP place their rules in transformers' decoder LMs: RMSNorms found by type (the identity
rule with the statistics as the stock module computes them), the token embedding as the input embedding, the
Llama-like gated MLPs ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``, Gemma 3's final logit soft-capping under
:meth:`head_rules`; attention-logit soft-capping has no rule."""
from __future__ import annotations

from typing import Any, List

from torch import nn

from ...adapters.base import RuleMap


class DecoderRules(RuleMap):
    """The token embedding (the adapter's ``input_embedding``: ``embed_tokens``; GPT-2's ``wte``)."""

    adapter: Any

    def input_embedding(self) -> nn.Module:
        return self.adapter.input_embedding()


class RopeDecoderRules(DecoderRules):
    """Llama-like decoders: every block's MLP is a gated MLP."""

    def gated_mlps(self) -> List[nn.Module]:
        """Every block's MLP (``down_proj(act_fn(gate_proj(x)) * up_proj(x))``)."""
        return [block.mlp for block in self.adapter.blocks]


class Gemma3Rules(RopeDecoderRules):
    """Gemma 3: attention-logit soft-capping is refused."""

    def problems(self) -> List[str]:
        if getattr(self.adapter.config, "attn_logit_softcapping", None) is not None:
            return ["attention-logit soft-capping (config.attn_logit_softcapping): no rule for the tanh inside the "
                    "attention function"]
        return []
