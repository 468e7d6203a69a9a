"""Gradient-weighted attention methods: Grad-CAM on attention, Generic Attribution and CDAM.

Batched with one target per sample (see :mod:`methods.attention_gradients`); scores are returned raw in the
layout of the inputs (``[B, P]`` patch scores for images). Layer indices are 0-based.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from .adapters import ActivationRecorder
from .attention_gradients import attention_and_gradients
from .base import AttributionMethod, check_start_layer
from .readout import check_readout, mean_over_content, read_out
from .registry import register_method
from .rollout import accumulate_residual
from .targets import class_score, resolve_target


@register_method("gradcam")
class AttentionGradCAM(AttributionMethod):
    """Grad-CAM on the last attention map, as Chefer et al. 2021a's baseline code computes it.

    ``relu(mean_h(w_h * A_{L-1}[h, r, content]))`` with the per-head weight ``w_h`` = mean over the content
    columns of the read-out row ``r`` of ``dy_c/dA_{L-1}[h]`` (TE ``generate_cam_attn``): head mean **first**,
    clamp **after** (unlike Transformer Attribution / Generic Attribution). ``y_c`` is the pre-softmax logit.
    The reference min-max normalises inside the method (NaN for an all-zero map); this returns the raw clamped
    values: an all-zero map stays all zeros.

    Read-out (``readout``, :func:`methods.readout.read_out`): ``class_token`` (alias ``cls``) is the reference.
    On a global-average-pooled model the [CLS] row of the last attention never reaches the logits (its gradient
    is zero, so that map is all zeros); ``mean_content`` (alias ``mean_patches``) uses the mean of the content
    query rows instead, for both the weights and the map. ``auto`` (default) is the model's own read-out.
    """

    def __init__(self, layer: int = -1, readout: str = "auto"):
        self.layer = layer
        self.readout = check_readout(readout)

    def attribute(self, adapter, inputs, target):
        layer = check_start_layer(self.layer, adapter.depth, self.name)
        (attn,), (grad,), _, _ = attention_and_gradients(adapter, inputs, target, [layer])
        layout = adapter.layout(inputs)
        attn_rows = layout.output(read_out(attn, adapter, inputs, self.readout, layout))    # [B, H, P]
        weights = mean_over_content(read_out(grad, adapter, inputs, self.readout, layout), layout)  # [B, H]
        return (attn_rows * weights[..., None]).mean(dim=1).clamp(min=0)


HEAD_REDUCTIONS = ("clamp_then_mean", "mean_then_clamp")


def generic_update(attn: Tensor, grad: Tensor, head_reduction: str) -> Tensor:
    """``Ā = E_h[(∇A ⊙ A)^+]`` (Chefer et al. 2021b, eq. 5) with the order of clamp and head mean named."""
    if head_reduction == "clamp_then_mean":
        return (grad * attn).clamp(min=0).mean(dim=1)
    if head_reduction == "mean_then_clamp":
        return (grad * attn).mean(dim=1).clamp(min=0)
    raise ValueError(f"head_reduction must be one of {HEAD_REDUCTIONS}, got {head_reduction!r}")


@register_method("generic_attribution")
class GenericAttribution(AttributionMethod):
    """Generic Attention-model Explainability (Chefer, Gur & Wolf 2021b, eqs. 5-6).

    ``R = I``; for each block ``l >= start_layer`` in forward order ``R = R + Ā_l R``
    (:func:`methods.rollout.accumulate_residual`) with ``Ā_l = E_h[(∇A_l ⊙ A_l)^+]`` (clamp, then head mean:
    the MM reference notebook, default ``head_reduction='clamp_then_mean'``). The Beyond Intuition repository's
    ``generate_genattr`` takes the head mean before the clamp: ``head_reduction='mean_then_clamp'``. No row
    normalisation. ``∇A`` is the gradient of the target's pre-softmax logit, so the logit scale matters when
    more than one block is used. Read-out row, content columns (``readout`` as for ``raw_attention``).
    ``start_layer`` is 0-based (MM uses all blocks: 0; BI's 1-based ``start_layer=2`` is 1).
    """

    def __init__(self, start_layer: int = 0, head_reduction: str = "clamp_then_mean", readout: str = "auto"):
        if head_reduction not in HEAD_REDUCTIONS:
            raise ValueError(f"head_reduction must be one of {HEAD_REDUCTIONS}, got {head_reduction!r}")
        self.start_layer = start_layer
        self.head_reduction = head_reduction
        self.readout = check_readout(readout)

    def attribute(self, adapter, inputs, target):
        start = check_start_layer(self.start_layer, adapter.depth, self.name)
        attns, grads, _, _ = attention_and_gradients(adapter, inputs, target, range(start, adapter.depth))
        relevance = accumulate_residual([generic_update(a, g, self.head_reduction) for a, g in zip(attns, grads)])
        layout = adapter.layout(inputs)
        return layout.output(read_out(relevance, adapter, inputs, self.readout, layout))


@register_method("cdam")
class CDAM(AttributionMethod):
    """Class-Discriminative Attention Maps (Brocki & Chung, eq. 2): gradient × activation at the last block.

    ``S_i = Σ_d T_id ∂f/∂T_id`` for the content positions ``i`` ([CLS] excluded for images), signed, not
    normalised (CDAM notebook cells 17-21). ``f`` is the target's pre-softmax logit or, with ``concept=v``, the
    dot product ``<z, v>`` of the final pre-logits latent ``z`` (the final-norm [CLS] token for a [CLS] read-out)
    with the concept vector (cells 23-26; unnormalised, not a cosine). Autograd runs through the last block only.

    ``tokens`` — which ``T``:

    * ``"attention_input"`` (alias ``"norm1"``; the reference code): the hidden states entering the last
      block's attention (the ``norm1`` output of a pre-norm block). Only the attention consumes it, so for a
      [CLS]-read model the gradient holds every path from a token to the output; for an average-pooled model it
      misses each token's own residual path to the pooled latent (on the synthetic benchmark's average-pooled
      ViT that map is worse than a random one).
    * ``"block_input"``: the residual stream entering the last block (the paper's "tokens input to the final
      block" read literally): the attention path and the residual path.
    * ``"auto"`` (default): ``"attention_input"`` for a class-token read-out (the reference's models,
      golden-tested), ``"block_input"`` otherwise (average-pooled models, which the reference does not cover).
    """

    TOKENS = ("auto", "attention_input", "block_input")
    TOKEN_ALIASES = {"norm1": "attention_input"}

    def __init__(self, concept: Optional[Sequence[float]] = None, tokens: str = "auto"):
        tokens = self.TOKEN_ALIASES.get(tokens, tokens)
        if tokens not in self.TOKENS:
            raise ValueError(f"cdam: tokens must be one of {self.TOKENS} (or 'norm1'), got {tokens!r}")
        if concept is not None:
            concept = torch.as_tensor(concept).detach().flatten()
        self.concept = concept
        self.tokens = tokens
        self.class_specific = concept is None

    def attribute(self, adapter, inputs, target):
        last = adapter.depth - 1
        tokens = self.tokens
        if tokens == "auto":
            tokens = "attention_input" if adapter.readout == "class_token" else "block_input"
        with ActivationRecorder() as rec:
            if tokens == "attention_input":
                adapter.record_attention_input(rec, last, "tokens", require_grad=True)
            else:
                adapter.record_block_input(rec, last, "tokens", require_grad=True)
            out = adapter.forward(inputs, grad_from_block=last, pre_logits=self.concept is not None)
            hidden = rec["tokens"]
        if self.concept is None:
            score = class_score(out, resolve_target(out, target))
        else:
            if self.concept.numel() != out.shape[-1]:
                raise ValueError(f"cdam: concept vector has {self.concept.numel()} entries but the model's "
                                 f"pre-logits latent has {out.shape[-1]}")
            score = (out @ self.concept.to(out)).sum()
        (grad,) = torch.autograd.grad(score, hidden)
        return adapter.layout(inputs).output((hidden.detach() * grad).sum(dim=-1))
