"""Occlusion: the logit drop when one token is removed from the sequence."""
from __future__ import annotations

import torch

from .base import AttributionMethod
from .registry import register_method
from .targets import resolve_target


@register_method("token_ablation")
class TokenAblation(AttributionMethod):
    """Token ablation map (TAM; Brocki & Chung): ``TAM_i = f_c(x) - f_c(x without token i)``.

    Content token ``i`` is dropped from the sequence after the embedding (so the other tokens keep their
    positional embeddings; ``adapter.inputs.drop_positions`` also shortens the attention mask) and the shortened
    sequence runs through all blocks, the final norm and the head; ``f_c`` is the target's logit (predicted
    class by default, as in the CDAM notebook). Positions that are not removed (prefix tokens, padding; for
    sequences every position that is not a content token of its sample: [CLS], [SEP]) score 0. The ablated
    sequences are batched, at most ``batch_size`` sequences per forward.
    """

    def __init__(self, batch_size: int = 256):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size

    @torch.no_grad()
    def attribute(self, adapter, inputs, target):
        context = adapter.inputs.context(inputs)
        hidden = adapter.embed(inputs)
        logits = adapter.head(adapter.run_blocks(hidden, context), context)
        target = resolve_target(logits, target)
        clean = logits.gather(1, target[:, None])
        batch, n, _ = hidden.shape
        layout = adapter.inputs.layout(inputs)
        positions = layout.batch_content_positions(n, hidden.device)   # every content position of the batch
        result = torch.zeros(batch, n, dtype=logits.dtype, device=logits.device)
        per_forward = max(1, self.batch_size // batch)
        for start in range(0, len(positions), per_forward):
            removed = positions[start:start + per_forward]
            shortened, short_context = adapter.inputs.drop_positions(hidden, context, removed)
            out = adapter.head(adapter.run_blocks(shortened, short_context), short_context)
            out = out.unflatten(0, (batch, len(removed)))
            result[:, removed] = clean - out.gather(2, target[:, None, None].expand(-1, len(removed), 1))[..., 0]
        # a position removed for the batch may be a special token or padding of some sample: 0 there
        return layout.output(layout.content_scores(result))
