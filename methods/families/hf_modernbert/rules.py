"""Where AttnLRP / CP-LRP place their rules in transformers' ModernBERT: LayerNorms and the GELU activations found
by type (the defaults), the token embedding ``tok_embeddings`` as the input embedding, and, placed here
(:meth:`ModernBertRules.product_rules`), the attention factors at the fused ``Wqkv`` output and the rule on the
GeGLU product ``act(input) * gate`` whose two factors are the halves of one ``Wi`` output."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Tuple

import torch

from ...adapters.gradient_rules import input_gradient_scaled, output_gradient_scaled
from ..hf_text.rules import TextRules


class ModernBertRules(TextRules):
    """The rule placement of :class:`~methods.families.hf_modernbert.adapter.HFModernBertAdapter`; the input
    embedding is BERT's (``get_input_embeddings()``: ``tok_embeddings``)."""

    adapter: Any

    def product_rules(self, attention: Tuple[float, float, float], gate: str,
                      gamma: Optional[float] = None) -> Optional[contextlib.AbstractContextManager[None]]:
        """The gradient factors ``(q, k, v)`` on the thirds of every block's ``Wqkv`` output (as on any fused
        projection) and, in every GeGLU MLP, the uniform rule on the product (``gate="uniform"``: ``Wo``'s input
        gradient times 1/2) or the activated branch held constant (``gate="constant"``: the first half of ``Wi``'s
        output, the one ``act`` reads, LXT's ``cp_gated_mlp_forward``). Every linear layer is a module, so the
        gamma rule needs nothing here."""
        if gate not in ("uniform", "constant"):
            raise ValueError(f"gate rule must be 'uniform' or 'constant', got {gate!r}")
        return self._product_rules(attention, gate)

    @contextlib.contextmanager
    def _product_rules(self, attention: Tuple[float, float, float], gate: str) -> Iterator[None]:
        handles = []
        try:
            for block in self.adapter.blocks:
                third = block.attn.Wqkv.out_features // 3
                device = block.attn.Wqkv.weight.device
                factors = torch.tensor([attention[0]] * third + [attention[1]] * third + [attention[2]] * third,
                                       device=device)
                handles.append(block.attn.Wqkv.register_forward_hook(output_gradient_scaled(factors)))
                if gate == "uniform":
                    handles.append(block.mlp.Wo.register_forward_pre_hook(input_gradient_scaled(0.5)))
                else:
                    half = block.mlp.Wi.out_features // 2
                    held = torch.tensor([0.0] * half + [1.0] * half, device=device)
                    handles.append(block.mlp.Wi.register_forward_hook(output_gradient_scaled(held)))
            yield
        finally:
            for handle in handles:
                handle.remove()
