"""Gradient-weighted attention methods: Grad-CAM on attention, Generic Attribution and CDAM.

Batched with one target per sample (see :mod:`methods.attention_gradients`); scores are returned raw in the
layout of the inputs (``[B, P]`` patch scores for images). Layer indices are 0-based. Each takes ``explain``
(:mod:`methods.explanation_targets`: ``"logit"``, the default and the authors' choice, ``"probability"``,
``"log_probability"``, ``"logit_difference"`` / ``"probability_difference"`` against ``foil``): the output whose
gradient they read.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch
from torch import Tensor

from .adapters import ActivationRecorder
from .attention_gradients import attention_and_gradients, stream_attention_gradients
from .base import check_start_layer
from .explained_output import ExplainedOutput
from .explanation_targets import explained_score
from .readout import (
    check_class_token_score,
    check_readout,
    check_readout_space,
    read_out,
    read_out_identity,
    set_class_token_score,
)
from .registry import register_method
from .rollout import ReadoutResidual, carry_to_readout_space


@register_method("gradcam")
class AttentionGradCAM(ExplainedOutput):
    """Grad-CAM on the last attention map, as Chefer et al. 2021a's baseline code computes it.

    ``relu(mean_h(w_h * A_{L-1}[h, r, content]))`` with the per-head weight ``w_h`` = mean over the content
    columns of the read-out row ``r`` of ``dy_c/dA_{L-1}[h]`` (TE ``generate_cam_attn``): head mean **first**,
    clamp **after** (unlike Transformer Attribution / Generic Attribution). ``y_c`` is the pre-softmax logit.
    The reference min-max normalises inside the method (NaN for an all-zero map); this returns the raw clamped
    values by default: an all-zero map stays all zeros.

    Read-out (``readout``, :func:`methods.readout.read_out`): ``class_token`` (alias ``cls``) is the reference.
    On a global-average-pooled model the [CLS] row of the last attention never reaches the logits (its gradient
    is zero, so that map is all zeros); ``mean_content`` (alias ``mean_patches``) uses the mean of the content
    query rows instead, for both the weights and the map. ``auto`` (default) is the model's own read-out.

    Options for the authors' BERT variant (TE ``BERT/ExplanationGenerator.py`` ``generate_attn_gradcam``):

    * ``gradient_mean``: ``"readout_row"`` (TE's ViT code, above), ``"matrix"`` (TE's BERT code: ``w_h`` = the
      mean of ``dy_c/dA[h]`` over the whole ``N x N`` map, and the map ``relu(mean_h(w_h A_h))`` is read at the
      read-out row afterwards), ``"auto"`` (default): ``"matrix"`` for token sequences, ``"readout_row"`` for
      images.
    * ``include_padding``: in ``"matrix"`` mode the mean (and the min-max) runs over the real positions only
      (default ``False``: a padded sample gets the scores it gets alone); ``True`` takes all ``N x N`` entries,
      padding included, as the authors' batch-1 code does on a padded input.
    * ``minmax``: ``True`` min-max normalises as the reference does (over the whole map in ``"matrix"`` mode,
      over the read-out row's content entries otherwise; NaN for a constant map); default ``False``.
    * ``class_token_score`` (sequences): ``auto`` = ``zero`` (TE sets the [CLS]->[CLS] entry to 0), ``keep``.
    * ``explain`` / ``foil``: the output ``y_c`` differentiated (module docstring; default the logit).
    """

    GRADIENT_MEANS = ("auto", "readout_row", "matrix")
    #: ``gradient_mean="auto"`` by the layout's reference code (``Layout.reference``)
    AUTO_GRADIENT_MEAN = {"vit": "readout_row", "bert": "matrix"}
    layer_options = ("layer",)

    def __init__(self, layer: int = -1, readout: str = "auto", gradient_mean: str = "auto",
                 include_padding: bool = False, minmax: bool = False, class_token_score: str = "auto",
                 explain: str = "logit", foil: Optional[int] = None):
        super().__init__(explain, foil)
        if gradient_mean not in self.GRADIENT_MEANS:
            raise ValueError(f"gradcam: gradient_mean must be one of {self.GRADIENT_MEANS}, got {gradient_mean!r}")
        self.layer = layer
        self.readout = check_readout(readout)
        self.gradient_mean = gradient_mean
        self.include_padding = bool(include_padding)
        self.minmax = bool(minmax)
        self.class_token_score = check_class_token_score(class_token_score)

    def attribute(self, adapter, inputs, target):
        layer = check_start_layer(self.layer, adapter, self.name, "layer")
        check_readout_space(adapter, layer, inputs, self.name)
        (attn,), (grad,), _, _ = attention_and_gradients(adapter, inputs, target, [layer], self.explain,
                                                         self.given_foil)
        layout = adapter.inputs.layout(inputs)
        mode = self.AUTO_GRADIENT_MEAN[layout.reference] if self.gradient_mean == "auto" else self.gradient_mean
        if mode == "matrix":
            positions = layout.real_positions(grad, self.include_padding)
            pairs = (positions[:, :, None] & positions[:, None, :])[:, None].to(grad.dtype)   # [B, 1, N, N]
            weights = (grad * pairs).sum(dim=(-1, -2)) / pairs.sum(dim=(-1, -2))             # [B, H]
            cam = (attn * weights[..., None, None]).mean(dim=1).clamp(min=0)                  # [B, N, N]
            if self.minmax:
                inside = pairs[:, 0].bool()
                low = cam.masked_fill(~inside, float("inf")).amin(dim=(-1, -2), keepdim=True)
                high = cam.masked_fill(~inside, float("-inf")).amax(dim=(-1, -2), keepdim=True)
                cam = (cam - low) / (high - low)
            row = read_out(cam, adapter, inputs, self.readout, layout)
        else:
            attn_rows = read_out(attn, adapter, inputs, self.readout, layout)                   # [B, H, N]
            weights = layout.mean_over_content(read_out(grad, adapter, inputs, self.readout, layout))  # [B, H]
            row = (attn_rows * weights[..., None]).mean(dim=1).clamp(min=0)
            if self.minmax:
                inside = layout.content_positions(row)
                low = row.masked_fill(~inside, float("inf")).amin(dim=-1, keepdim=True)
                high = row.masked_fill(~inside, float("-inf")).amax(dim=-1, keepdim=True)
                row = (row - low) / (high - low)
        row = set_class_token_score(row, adapter, layout, self.class_token_score, "zero")
        return layout.output(row)


HEAD_REDUCTIONS = ("clamp_then_mean", "mean_then_clamp")


def generic_update(attn: Tensor, grad: Tensor, head_reduction: str) -> Tensor:
    """``Ā = E_h[(∇A ⊙ A)^+]`` (Chefer et al. 2021b, eq. 5) with the order of clamp and head mean named."""
    if head_reduction == "clamp_then_mean":
        return (grad * attn).clamp_(min=0).mean(dim=1)
    if head_reduction == "mean_then_clamp":
        return (grad * attn).mean(dim=1).clamp_(min=0)
    raise ValueError(f"head_reduction must be one of {HEAD_REDUCTIONS}, got {head_reduction!r}")


@register_method("generic_attribution")
class GenericAttribution(ExplainedOutput):
    """Generic Attention-model Explainability (Chefer, Gur & Wolf 2021b, eqs. 5-6).

    ``R = I``; for each block ``l >= start_layer`` in forward order ``R = R + Ā_l R``
    (:func:`methods.rollout.accumulate_residual`) with ``Ā_l = E_h[(∇A_l ⊙ A_l)^+]`` (clamp, then head mean:
    the MM reference notebook, default ``head_reduction='clamp_then_mean'``). The Beyond Intuition repository's
    ``generate_genattr`` takes the head mean before the clamp: ``head_reduction='mean_then_clamp'``. No row
    normalisation. ``∇A`` is the gradient of the target's pre-softmax logit, so the logit scale matters when
    more than one block is used. Read-out row, content columns (``readout`` as for ``raw_attention``).
    ``start_layer`` is 0-based (MM uses all blocks: 0; BI's 1-based ``start_layer=2`` is 1). Beyond
    Intuition's BERT ``generate_genattr`` reads the last layer only with the head mean first:
    ``start_layer=-1, head_reduction='mean_then_clamp'``. Sequences: ``class_token_score`` ``auto`` = ``zero``
    (the [CLS]->[CLS] entry set to 0, as BI's BERT code does), ``keep``.

    Streaming: only the read-out row of ``R`` is formed, ``r = read(I)`` then ``r <- r + r Ā_l`` for ``l`` from
    the last block down (:class:`methods.rollout.ReadoutResidual`, ``O(L N^2)``; equal to ``read(R)`` up to float
    rounding), inside the backward pass: each block's ``Ā_l`` is formed as soon as its gradient arrives and
    dropped once folded in (:func:`methods.attention_gradients.stream_attention_gradients`). Beyond the eager
    attention's maps that the autograd graph saves (one ``[B, H, N, N]`` per block, released as the backward
    passes it) it holds one block's map, gradient and ``Ā_l`` at a time, and never an ``N x N`` composition.
    Given a sample's maps and gradients, its row is the same to the bit alone or in any batch, at any number of
    threads (per-sample float64 products, ``tests/test_streaming.py``); the gradients themselves are not: a
    float32 model's head rounds a sample differently in a batch of 1 to 3 than in a larger one (MKL on the CPU),
    which the evaluation evens out by running every batch at the loader's size
    (:meth:`lightning_modules.evaluation.AttributionEvaluationModule._call_width`).

    ``recompute_attention`` (default ``True``): on the models whose adapter can (``attention_recompute``), each
    block's probabilities are recomputed in the backward rather than saved by the forward (memory: one block's
    map at a time; time: one more eager attention per block); ``False`` keeps them (same values, bit for bit).
    ``explain`` / ``foil``: the output whose gradient ``∇A`` is (module docstring; default the logit).
    """

    layer_options = ("start_layer",)

    def __init__(self, start_layer: int = 0, head_reduction: str = "clamp_then_mean", readout: str = "auto",
                 class_token_score: str = "auto", recompute_attention: bool = True, explain: str = "logit",
                 foil: Optional[int] = None):
        super().__init__(explain, foil)
        if head_reduction not in HEAD_REDUCTIONS:
            raise ValueError(f"head_reduction must be one of {HEAD_REDUCTIONS}, got {head_reduction!r}")
        self.start_layer = start_layer
        self.head_reduction = head_reduction
        self.readout = check_readout(readout)
        self.class_token_score = check_class_token_score(class_token_score)
        self.recompute_attention = bool(recompute_attention)

    def attribute(self, adapter, inputs, target):
        start = check_start_layer(self.start_layer, adapter, self.name)
        layout = adapter.inputs.layout(inputs)
        composed: List[ReadoutResidual] = []

        def fold(layer: int, attn: Tensor, grad: Tensor) -> None:
            update = generic_update(attn, grad, self.head_reduction)
            if not composed:
                composed.append(ReadoutResidual(read_out_identity(adapter, inputs, self.readout, layout, update)))
            composed[0].add(update)
            if layer > start:
                composed[0].through(adapter.token_flow.transition(layer, update))

        stream_attention_gradients(adapter, inputs, target, range(start, len(adapter.blocks)), fold, self.explain,
                                   recompute=self.recompute_attention, foil=self.given_foil)
        row = carry_to_readout_space(adapter, composed[0].row(), start)
        return layout.output(set_class_token_score(row, adapter, layout, self.class_token_score, "zero"))


@register_method("cdam")
class CDAM(ExplainedOutput):
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

    ``explain`` / ``foil`` (without ``concept``): ``f`` is the explained output instead of the logit (module
    docstring); the map is linear in ``∂f/∂T``, so a logit difference's map is the target's minus the foil's.
    """

    TOKENS = ("auto", "attention_input", "block_input")
    TOKEN_ALIASES = {"norm1": "attention_input"}

    def __init__(self, concept: Optional[Union[Tensor, Sequence[float]]] = None, tokens: str = "auto",
                 explain: str = "logit", foil: Optional[int] = None):
        super().__init__(explain, foil)
        if concept is not None and explain != "logit":
            raise ValueError(f"cdam: explain={explain!r} explains a class output; with concept= the explained "
                             "output is the concept score <z, v>")
        tokens = self.TOKEN_ALIASES.get(tokens, tokens)
        if tokens not in self.TOKENS:
            raise ValueError(f"cdam: tokens must be one of {self.TOKENS} (or 'norm1'), got {tokens!r}")
        self.concept = None if concept is None else torch.as_tensor(concept).detach().flatten()
        self.tokens = tokens
        self.class_specific = concept is None

    def attribute(self, adapter, inputs, target):
        last = len(adapter.blocks) - 1
        tokens = self.tokens
        if tokens == "auto":
            tokens = "attention_input" if adapter.readout.kind == "class_token" else "block_input"
        with ActivationRecorder() as rec:
            if tokens == "attention_input":
                adapter.recording.attention_input(rec, last, "tokens", require_grad=True)
            else:
                adapter.recording.block_input(rec, last, "tokens", require_grad=True)
            out = adapter.forward(inputs, grad_from_block=last, pre_logits=self.concept is not None)
            hidden = rec["tokens"]
        if self.concept is None:
            target, foil = self.resolve(out, target)
            score = explained_score(out, target, self.explain, foil)
        else:
            if self.concept.numel() != out.shape[-1]:
                raise ValueError(f"cdam: concept vector has {self.concept.numel()} entries but the model's "
                                 f"pre-logits latent has {out.shape[-1]}")
            score = (out @ self.concept.to(out)).sum()
        (grad,) = torch.autograd.grad(score, hidden)
        return adapter.inputs.layout(inputs).output((hidden.detach() * grad).sum(dim=-1))
