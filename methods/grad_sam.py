"""Grad-SAM (Barkan et al., CIKM 2021): gradient-weighted self-attention maps, on Generic Attribution's machinery.

No authors' code is published (``../shared/reference/methods_catalogue.md``): this is the paper's equation; the
third-party versions disagree (element-wise vs matrix product, mean vs sum over the rows).
"""
from __future__ import annotations

from typing import List

from torch import Tensor

from .attcat import QUERY_ROWS, mean_over_query_rows, real_query_rows
from .attention_gradients import stream_attention_gradients
from .base import AttributionMethod, check_start_layer
from .gradient_methods import generic_update
from .registry import OPT_IN, register_method
from .rollout import carry_to_readout_space


@register_method("grad_sam")
class GradSAM(AttributionMethod):
    """Grad-SAM (Barkan et al. 2021, Eqs. 2-3): ``S_j = mean_{l >= start} mean_i mean_h (A^l_h ⊙ ReLU(∇A^l_h))_ij``.

    ``A^l`` block ``l``'s post-softmax attention, ``∇A^l`` the gradient of the target's logit w.r.t. it (one
    forward and one backward, streamed as Generic Attribution's: :func:`methods.attention_gradients.
    stream_attention_gradients`); since ``A >= 0``, ``A ⊙ ReLU(∇A) = (A ⊙ ∇A)^+``, Generic Attribution's
    ``clamp_then_mean`` update, here averaged over the query rows ``i`` (``query_rows="real"``: the real tokens of
    a padded batch, so a padded row equals the row alone; ``"all"``) and over the blocks instead of composed with
    the residual. Every position reported, no [CLS] zeroing, not normalised. Blocks in another token space than
    the read-out's (Swin) carry their rows up through the transitions before the mean.
    """

    tags = ("transformer_2022", "gradient", OPT_IN)
    layer_options = ("start_layer",)

    def __init__(self, start_layer: int = 0, query_rows: str = "real", recompute_attention: bool = True):
        if query_rows not in QUERY_ROWS:
            raise ValueError(f"grad_sam: query_rows must be one of {QUERY_ROWS}, got {query_rows!r}")
        self.start_layer = start_layer
        self.query_rows = query_rows
        self.recompute_attention = bool(recompute_attention)

    def attribute(self, adapter, inputs, target):
        start = check_start_layer(self.start_layer, adapter, self.name)
        layout = adapter.inputs.layout(inputs)
        rows = real_query_rows(layout, inputs, self.query_rows)
        per_layer: List[Tensor] = []

        def fold(layer: int, attn: Tensor, grad: Tensor) -> None:
            row = mean_over_query_rows(generic_update(attn, grad, "clamp_then_mean"), rows)
            per_layer.append(carry_to_readout_space(adapter, row, layer))

        stream_attention_gradients(adapter, inputs, target, range(start, len(adapter.blocks)), fold,
                                   recompute=self.recompute_attention)
        return layout.output(sum(per_layer[1:], per_layer[0]) / len(per_layer))
