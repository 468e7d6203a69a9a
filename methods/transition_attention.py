"""Transition Attention Maps (Yuan et al., IJCAI 2021): attention transitions times integrated attention gradients.

Reference: XianrenYty/Transition_Attention_Maps, ``baselines/ViT/interpret_methods.py::transition_attention_maps``
(commit 8329327). Named ``transition_attention`` here: CDAM's "token ablation map" is ``token_ablation``.
"""
from __future__ import annotations

from typing import Optional

import torch

from .adapters import ActivationRecorder
from .attention_gradients import target_score
from .beyond_intuition import _BeyondIntuition
from .readout import check_readout_space, read_out, set_class_token_score
from .registry import OPT_IN, register_method
from .rollout import accumulate_residual
from .targets import resolve_target


@register_method("transition_attention")
class TransitionAttentionMaps(_BeyondIntuition):
    """Transition Attention Maps (Yuan et al. 2021, Eqs. 6-11, as the reference code computes them).

    States: ``s = read(Ā_{L-1}) (I + Ā_{L-2}) ... (I + Ā_start)`` with ``Ā_l`` block ``l``'s post-softmax attention,
    mean over heads (the code's ``states = states.bmm(attn) + states`` from block ``L-2`` down to ``start_layer``;
    no identity on the last block, no normalisation). Weights: ``w = read(E_h[((1/K) Σ_k ∇A_{L-1}(α_k x))^+])``,
    ``α_k = linspace(0, 1, K)`` (both ends; ``steps = K = 20``), the gradient of the target's logit w.r.t. the
    last block's attention, clamped after the step mean, then the head mean (the code's ``with_integral=True``;
    ``integrated=False``: the clean pass's gradient only). Map: ``s ⊙ w``, content columns (the code's
    ``states[:, 0, 1:]``). ``first_state=True``: ``s = read(Ā_{L-1})`` (the code's option).
    ``start_layer``: 0-based first block; default (``None``) 4 as the code, or the last block on a model with at
    most 4 blocks. ``α x``: the adapter's interpolation (pixels; embeddings for text), batched as Beyond
    Intuition's (``ig_batch_size``). The read-out (``readout``) as for ``raw_attention``; text: every position,
    ``class_token_score`` ``auto`` = ``keep`` (the code has no text variant and zeroes nothing).
    """

    tags = ("transformer_2022", "gradient", "path", OPT_IN)
    #: the code's ``start_layer=4`` (0-based in its ``range(start_layer, num_blocks - 1)``) for every layout
    default_start_layers = {"vit": 4, "bert": 4}

    def __init__(self, start_layer: Optional[int] = None, steps: int = 20, integrated: bool = True,
                 first_state: bool = False, readout: str = "auto", ig_batch_size="auto",
                 class_token_score: str = "auto"):
        super().__init__(start_layer=start_layer, steps=steps, readout=readout, ig_batch_size=ig_batch_size,
                         class_token_score=class_token_score)
        self.integrated = bool(integrated)
        self.first_state = bool(first_state)

    def resolved_start_layer(self, adapter) -> int:
        if self.start_layer is None:
            return min(self.default_start_layers[adapter.inputs.layout_class.reference], len(adapter.blocks) - 1)
        return super().resolved_start_layer(adapter)

    def attribute(self, adapter, inputs, target):
        layout = adapter.inputs.layout(inputs)
        start = self.resolved_start_layer(adapter)
        last = len(adapter.blocks) - 1
        check_readout_space(adapter, start, inputs, self.name)
        layers = range(start, len(adapter.blocks))
        with ActivationRecorder() as rec:
            for layer in layers:
                adapter.recording.attention(rec, layer, layer, require_grad=layer == last)
            logits = adapter.forward(inputs, grad_from_block=last)
        target = resolve_target(logits, target)
        last_attention = rec[last]
        (gradient,) = torch.autograd.grad(target_score(logits, target), last_attention)
        state = read_out(last_attention.detach().mean(dim=1), adapter, inputs, self.readout, layout)
        if not self.first_state and last > start:
            below = accumulate_residual([rec[layer].mean(dim=1) for layer in range(start, last)])
            state = (state[:, None, :] @ below)[:, 0]
        if self.integrated:
            gradient = (gradient + self._last_attention_gradients(adapter, inputs, target)) / self.steps
        weight = read_out(gradient.clamp(min=0).mean(dim=1), adapter, inputs, self.readout, layout)
        row = state * weight
        return layout.output(set_class_token_score(row, adapter, layout, self.class_token_score, "keep"))
