"""Attention- and gradient-based attribution methods on stock timm Vision Transformers.

Every method here is batched with one target per sample: gradients are taken of the *sum over the batch* of each
sample's target logit with ``torch.autograd.grad`` with respect to activations, which gives each sample its own
gradient because samples never interact in an eval-mode Transformer. Token scores are returned raw, as the
reference code computes them, for the patch tokens in row-major grid order (``[B, P]``).

Layer indices (``start_layer``) are 0-based everywhere: the index of the first block included. The Beyond
Intuition code counts from 1 for its own methods; its ``start_layer=S`` is ``start_layer=S-1`` here.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from .adapters import ActivationRecorder
from .base import AttributionMethod, check_start_layer
from .registry import register_method
from .targets import class_score, resolve_target

READOUTS = ("auto", "cls", "mean_patches")


def _readout_rows(relevance: Tensor, adapter, readout: str) -> Tensor:
    """Patch-column scores of an ``[B, N, N]`` token-to-token relevance matrix.

    ``cls``: the [CLS] row (the prediction reads the [CLS] token). ``mean_patches``: the mean over the patch rows
    (Beyond Intuition's ``mae=True`` read-out for global-average-pooled models). ``auto`` picks ``cls`` for
    ``global_pool='token'`` and ``mean_patches`` for ``'avg'``.
    """
    readout = _resolve_readout(adapter, readout)
    p = adapter.num_prefix_tokens
    if readout == "cls":
        return relevance[:, 0, p:]
    return relevance[:, p:, p:].mean(dim=1)


def _check_readout(readout: str) -> str:
    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
    return readout


def _resolve_readout(adapter, readout: str) -> str:
    _check_readout(readout)
    if readout == "auto":
        readout = "cls" if adapter.global_pool == "token" else "mean_patches"
    if readout == "cls" and not adapter.has_class_token:
        raise ValueError("readout='cls' needs a model with a class token")
    return readout


def _identity(batch: int, tokens: int, like: Tensor) -> Tensor:
    return torch.eye(tokens, dtype=like.dtype, device=like.device).expand(batch, tokens, tokens).clone()


def _attention_and_gradients(adapter, inputs: Tensor, target, layers: Sequence[int], gradient_of: str = "logit"):
    """One forward (autograd only from the first of ``layers``) and one ``autograd.grad``.

    Returns the post-softmax attention maps ``A_l`` ``[B, H, N, N]`` of ``layers``, their gradients
    ``dy/dA_l`` with ``y`` the target logit (or softmax probability with ``gradient_of='probability'``),
    the logits and the resolved targets.
    """
    layers = list(layers)
    with ActivationRecorder() as rec:
        for layer in layers:
            rec.output(adapter.attention_probs_module(layer), layer, require_grad=True)
        logits = adapter.forward(inputs, grad_from_block=min(layers))
        attentions = [rec[layer] for layer in layers]
    target = resolve_target(logits, target)
    scores = logits.softmax(dim=-1) if gradient_of == "probability" else logits
    if gradient_of not in ("logit", "probability"):
        raise ValueError(f"gradient_of must be 'logit' or 'probability', got {gradient_of!r}")
    grads = torch.autograd.grad(class_score(scores, target), attentions)
    return [a.detach() for a in attentions], list(grads), logits.detach(), target


@register_method("raw_attention")
class RawAttention(AttributionMethod):
    """Raw attention of the last block (Chefer et al. 2021a, baseline "raw attention").

    ``mean_h A_{L-1}[h, 0, patches]``: post-softmax attention (after dropout, identity in eval) of the last block,
    [CLS] query row, patch key columns, mean over heads (TE ``ViT_LRP.py`` ``last_layer_attn``; its clamp at 0 is a
    no-op on probabilities). Class-agnostic. ``readout``: ``cls`` (the reference), ``mean_patches`` (mean over the patch
    query rows), ``auto`` (default: ``cls`` for ``global_pool='token'``, ``mean_patches`` for ``'avg'``, whose
    prediction never reads the [CLS] token).
    """

    class_specific = False

    def __init__(self, layer: int = -1, readout: str = "auto"):
        self.layer = layer
        self.readout = _check_readout(readout)

    def attribute(self, adapter, inputs, target):
        layer = check_start_layer(self.layer, adapter.depth, self.name)
        with ActivationRecorder() as rec, torch.no_grad():
            rec.output(adapter.attention_probs_module(layer), "attn")
            adapter.forward(inputs, grad_from_block=adapter.depth)
            attention = rec["attn"].mean(dim=1)
        return _readout_rows(attention, adapter, self.readout)


@register_method("rollout")
class Rollout(AttributionMethod):
    """Attention rollout (Abnar & Zuidema 2020, eq. 1) as the TE reference computes it.

    Per block ``l >= start_layer``: ``M_l = mean_h A_l + I``, row-normalised (``M_l / M_l.sum(-1)``); the product
    ``M_{L-1} ... M_{start}`` read at the [CLS] row, patch columns (TE ``ViT_explanation_generator.py``
    ``compute_rollout_attention``). ``start_layer`` is 0-based (the TE evaluation scripts pass 1).
    ``row_normalize=False`` gives the unnormalised variant. Class-agnostic; rows of the result's matrix sum to one.
    ``readout`` as for ``raw_attention`` (``auto``: [CLS] row for token pooling, patch-row mean for average pooling).
    """

    class_specific = False

    def __init__(self, start_layer: int = 0, row_normalize: bool = True, readout: str = "auto"):
        self.start_layer = start_layer
        self.row_normalize = row_normalize
        self.readout = _check_readout(readout)

    def rollout_matrix(self, adapter, inputs) -> Tensor:
        start = check_start_layer(self.start_layer, adapter.depth, self.name)
        layers = range(start, adapter.depth)
        with ActivationRecorder() as rec, torch.no_grad():
            for layer in layers:
                rec.output(adapter.attention_probs_module(layer), layer, transform=lambda a: a.mean(dim=1))
            adapter.forward(inputs, grad_from_block=adapter.depth)
            joint = None
            for layer in layers:
                m = rec[layer]
                m = m + torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
                if self.row_normalize:
                    m = m / m.sum(dim=-1, keepdim=True)
                joint = m if joint is None else m @ joint
        return joint

    def attribute(self, adapter, inputs, target):
        return _readout_rows(self.rollout_matrix(adapter, inputs), adapter, self.readout)


@register_method("gradcam")
class AttentionGradCAM(AttributionMethod):
    """Grad-CAM on the last attention map, as Chefer et al. 2021a's baseline code computes it.

    ``relu(mean_h(w_h * A_{L-1}[h, 0, patches]))`` with the per-head weight ``w_h`` = mean over the [CLS] row's
    patch columns of ``dy_c/dA_{L-1}[h]`` (TE ``generate_cam_attn``): head mean **first**, clamp **after** (unlike
    Transformer Attribution / Generic Attribution). ``y_c`` is the pre-softmax logit. The reference min-max
    normalises inside the method (NaN for an all-zero map); this returns the raw clamped values: an all-zero
    map stays all zeros.

    Read-out (``readout``): ``cls`` is the reference. On a global-average-pooled model the [CLS] row of the last
    attention never reaches the logits (its gradient is zero, so the ``cls`` map is all zeros); ``mean_patches``
    uses the patch query rows instead (``w_h`` = mean gradient over patch rows and patch columns, map = mean over
    patch rows). ``auto`` (default) picks ``cls`` for ``global_pool='token'`` and ``mean_patches`` for ``'avg'``.
    """

    def __init__(self, layer: int = -1, readout: str = "auto"):
        _check_readout(readout)
        self.layer = layer
        self.readout = readout

    def attribute(self, adapter, inputs, target):
        layer = check_start_layer(self.layer, adapter.depth, self.name)
        (attn,), (grad,), _, _ = _attention_and_gradients(adapter, inputs, target, [layer])
        p = adapter.num_prefix_tokens
        rows = slice(0, 1) if _resolve_readout(adapter, self.readout) == "cls" else slice(p, None)
        a = attn[:, :, rows, p:]
        g = grad[:, :, rows, p:]
        weights = g.mean(dim=(-1, -2), keepdim=True)
        return (a * weights).mean(dim=1).mean(dim=1).clamp(min=0)


def _generic_update(attn: Tensor, grad: Tensor, head_reduction: str) -> Tensor:
    """``Ā = E_h[(∇A ⊙ A)^+]`` (Chefer et al. 2021b, eq. 5) with the order of clamp and head mean named."""
    if head_reduction == "clamp_then_mean":
        return (grad * attn).clamp(min=0).mean(dim=1)
    if head_reduction == "mean_then_clamp":
        return (grad * attn).mean(dim=1).clamp(min=0)
    raise ValueError(f"head_reduction must be 'clamp_then_mean' or 'mean_then_clamp', got {head_reduction!r}")


@register_method("generic_attribution")
class GenericAttribution(AttributionMethod):
    """Generic Attention-model Explainability (Chefer, Gur & Wolf 2021b, eqs. 5-6) for a ViT.

    ``R = I``; for each block ``l >= start_layer`` in forward order ``R = R + Ā_l R`` with
    ``Ā_l = E_h[(∇A_l ⊙ A_l)^+]`` (clamp, then head mean: the MM reference notebook, default
    ``head_reduction='clamp_then_mean'``). The Beyond Intuition repository's ``generate_genattr`` takes the head
    mean before the clamp: ``head_reduction='mean_then_clamp'``. No row normalisation. ``∇A`` is the gradient of
    the target's pre-softmax logit, so the logit scale matters when more than one block is used. Read-out: [CLS]
    row, patch columns (``readout='auto'`` switches to the patch-row mean on average-pooled models).
    ``start_layer`` is 0-based (MM uses all blocks: 0; BI's 1-based ``start_layer=2`` is 1).
    """

    def __init__(self, start_layer: int = 0, head_reduction: str = "clamp_then_mean", readout: str = "auto"):
        _generic_update(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1), head_reduction)
        self.start_layer = start_layer
        self.head_reduction = head_reduction
        self.readout = _check_readout(readout)

    def attribute(self, adapter, inputs, target):
        start = check_start_layer(self.start_layer, adapter.depth, self.name)
        attns, grads, _, _ = _attention_and_gradients(adapter, inputs, target, range(start, adapter.depth))
        relevance = _identity(attns[0].shape[0], attns[0].shape[-1], attns[0])
        for attn, grad in zip(attns, grads):
            relevance = relevance + _generic_update(attn, grad, self.head_reduction) @ relevance
        return _readout_rows(relevance, adapter, self.readout)


def _attention_perception_headwise(attn: Tensor, grad: Tensor) -> Tensor:
    """Beyond Intuition's head-wise perception ``Ã = Σ_h w_h A_h`` (Chen et al. 2023, §3.2, head importance).

    As the authors' code computes it (``generate_ours``): ``I_h = mean_ij |(A_h^T ∇A_h)_ij|`` — the mean absolute
    entry of the matrix product, not the paper's inner product ``<A_h, ∇A_h>`` — and ``w_h = I_h / Σ_h' I_h'``
    normalised **per sample** (their code normalises over the whole batch because it runs batch size 1).
    """
    importance = (attn.transpose(-1, -2) @ grad).abs().mean(dim=(-1, -2))  # [B, H]
    weights = importance / importance.sum(dim=1, keepdim=True)
    return (weights[:, :, None, None] * attn).sum(dim=1)


def _attention_perception_tokenwise(attn: Tensor, block_input: Tensor, values: Tensor, proj_weight: Tensor,
                                    norm1_output: Optional[Tensor] = None) -> Tensor:
    """Beyond Intuition's token-wise perception ``Ā diag(s)`` (Chen et al. 2023, §3.2, token importance).

    ``s_j = ||(v_j W_o^T)|| / ||z_j||`` with ``v = LN1(z) W_v^T + b_v`` (heads merged, the output projection's
    bias left out) and ``z`` the block input **before** ``norm1`` — the code's choice (``generate_ours_c``). With
    ``norm1_output`` given, the denominator is ``||LN1(z)_j||`` instead (the same Z on both sides).
    """
    vproj = values @ proj_weight.transpose(0, 1)
    denominator = block_input if norm1_output is None else norm1_output
    scale = vproj.norm(dim=-1) / denominator.norm(dim=-1)  # [B, N]
    return attn.mean(dim=1) * scale[:, None, :]


class _BeyondIntuition(AttributionMethod):
    """Shared machinery of Chen et al. 2023 ("Beyond Intuition"): ``T = F ⊙ P`` (eq. 8).

    * attention perception ``P = Π_{l=L-1..start} (I + Ã_l)`` (``R = R + Ã_l R`` in forward order, no row
      normalisation), ``Ã_l`` head-wise or token-wise (subclasses);
    * reasoning feedback ``F = E_h[( (1/K) Σ_k ∇A_{L-1}(α_k x) )^+]``: the mean over ``K = steps`` points
      ``α_k = linspace(0, 1, K)`` (both ends included, baseline = the all-zero normalised image) of the gradient of
      the target's logit w.r.t. the **last** block's post-softmax attention, clamped at 0 after the step mean and
      then averaged over heads (``generate_ours`` lines 209-229). The α = 1 point is the clean pass, reused. The
      K-1 other points are batched (``ig_batch_size`` bounds the images per forward to cap memory) and need
      autograd only through the last block.
    * read-out ``(F ⊙ P)[:, 0, patches]`` for [CLS] models, ``(F ⊙ P)[:, patches, patches].mean(1)`` (the ``mae``
      read-out) for global average pooling (``readout='auto'`` picks by the model).
    * ``reasoning_feedback=False`` returns ``|P|`` read out the same way (their ``ssl=True`` branch).
    * ``gradient_of='probability'`` differentiates the softmax probability (InterpretDL's CV default) instead of
      the logit (the authors' code).

    ``start_layer`` is 0-based: the authors' 1-based ``start_layer=S`` (blocks ``>= S-1`` used) is ``S-1`` here.
    """

    def __init__(self, start_layer: int = 0, steps: int = 20, readout: str = "auto", reasoning_feedback: bool = True,
                 gradient_of: str = "logit", ig_batch_size: Optional[int] = None):
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        _check_readout(readout)
        if gradient_of not in ("logit", "probability"):
            raise ValueError(f"gradient_of must be 'logit' or 'probability', got {gradient_of!r}")
        self.start_layer = start_layer
        self.steps = steps
        self.readout = readout
        self.reasoning_feedback = reasoning_feedback
        self.gradient_of = gradient_of
        self.ig_batch_size = ig_batch_size

    # -- subclasses: one clean pass giving the perception updates, the last block's attention gradient, targets
    def perception_pass(self, adapter, inputs, target, start):  # pragma: no cover - abstract
        raise NotImplementedError

    def _last_attention_gradients(self, adapter, inputs: Tensor, target: Tensor) -> Tensor:
        """Sum over the α_k < 1 of ``∇A_{L-1}(α_k x)``, batched over steps and samples."""
        last = adapter.depth - 1
        alphas = torch.linspace(0, 1, self.steps, dtype=torch.float64)[:-1].tolist()
        if not alphas:
            return 0
        batch = inputs.shape[0]
        chunk_steps = len(alphas) if self.ig_batch_size is None else max(1, self.ig_batch_size // batch)
        total = 0
        for i in range(0, len(alphas), chunk_steps):
            chunk = torch.tensor(alphas[i:i + chunk_steps], dtype=inputs.dtype, device=inputs.device)
            scaled = (chunk[:, None, None, None, None] * inputs[None]).flatten(0, 1)
            with ActivationRecorder() as rec:
                rec.output(adapter.attention_probs_module(last), "attn", require_grad=True)
                logits = adapter.forward(scaled, grad_from_block=last)
            scores = logits.softmax(-1) if self.gradient_of == "probability" else logits
            (grad,) = torch.autograd.grad(class_score(scores, target.repeat(len(chunk))), rec["attn"])
            total = total + grad.unflatten(0, (len(chunk), batch)).sum(dim=0)
        return total

    def attribute(self, adapter, inputs, target):
        start = check_start_layer(self.start_layer, adapter.depth, self.name)
        updates, last_grad, target = self.perception_pass(adapter, inputs, target, start)
        relevance = _identity(updates[0].shape[0], updates[0].shape[-1], updates[0])
        for update in updates:
            relevance = relevance + update @ relevance
        if not self.reasoning_feedback:
            return _readout_rows(relevance, adapter, self.readout).abs()
        feedback_sum = last_grad + self._last_attention_gradients(adapter, inputs, target)
        feedback = (feedback_sum / self.steps).clamp(min=0).mean(dim=1)
        return _readout_rows(feedback * relevance, adapter, self.readout)

    def _gradients(self, adapter, inputs, target, layers):
        return _attention_and_gradients(adapter, inputs, target, layers, gradient_of=self.gradient_of)


@register_method("beyond_intuition_head")
class BeyondIntuitionHead(_BeyondIntuition):
    __doc__ = (
        "Beyond Intuition, head-wise (Chen et al. 2023, 'Ours-H'): ``Ã_l = Σ_h w_h A_h`` with gradient-based head\n"
        "    weights (see ``_attention_perception_headwise``) times the reasoning feedback.\n\n"
        "    Default ``start_layer=3`` = the authors' 1-based 4 used by their perception test for ViT-B.\n\n    "
        + _BeyondIntuition.__doc__
    )

    def __init__(self, start_layer: int = 3, **options):
        super().__init__(start_layer=start_layer, **options)

    def perception_pass(self, adapter, inputs, target, start):
        layers = list(range(start, adapter.depth))
        attns, grads, _, target = self._gradients(adapter, inputs, target, layers)
        updates = [_attention_perception_headwise(a, g) for a, g in zip(attns, grads)]
        return updates, grads[-1], target


@register_method("beyond_intuition_token")
class BeyondIntuitionToken(_BeyondIntuition):
    __doc__ = (
        "Beyond Intuition, token-wise (Chen et al. 2023, 'Ours-T'): ``Ã_l = mean_h A_h diag(s)`` with the value-norm\n"
        "    token scale ``s`` (see ``_attention_perception_tokenwise``) times the reasoning feedback.\n\n"
        "    Default ``start_layer=6`` = the authors' 1-based 7 used by their perturbation test for ViT-B.\n"
        "    ``token_scale_denominator='norm1_output'`` uses ``||LN1(z)||`` instead of the code's ``||z||``.\n\n    "
        + _BeyondIntuition.__doc__
    )

    def __init__(self, start_layer: int = 6, token_scale_denominator: str = "block_input", **options):
        if token_scale_denominator not in ("block_input", "norm1_output"):
            raise ValueError("token_scale_denominator must be 'block_input' or 'norm1_output', "
                             f"got {token_scale_denominator!r}")
        super().__init__(start_layer=start_layer, **options)
        self.token_scale_denominator = token_scale_denominator

    def perception_pass(self, adapter, inputs, target, start):
        last = adapter.depth - 1
        layers = list(range(start, adapter.depth))
        dim = adapter.embed_dim
        with ActivationRecorder() as rec:
            for layer in layers:
                rec.input(adapter.block(layer), ("z", layer))
                rec.output(adapter.value_module(layer), ("v", layer), transform=lambda o: o[..., 2 * dim:3 * dim])
                rec.output(adapter.norm1(layer), ("ln", layer))
                rec.output(adapter.attention_probs_module(layer), ("a", layer), require_grad=(layer == last))
            logits = adapter.forward(inputs, grad_from_block=last)
        target = resolve_target(logits, target)
        scores = logits.softmax(-1) if self.gradient_of == "probability" else logits
        (last_grad,) = torch.autograd.grad(class_score(scores, target), rec[("a", last)])
        use_ln = self.token_scale_denominator == "norm1_output"
        updates = [
            _attention_perception_tokenwise(
                rec[("a", l)].detach(), rec[("z", l)].detach(), rec[("v", l)].detach(),
                adapter.attention_output_weight(l).detach(), rec[("ln", l)].detach() if use_ln else None)
            for l in layers
        ]
        return updates, last_grad, target


@register_method("cdam")
class CDAM(AttributionMethod):
    """Class-Discriminative Attention Maps (Brocki & Chung, eq. 2): gradient × activation at the last block.

    ``S_i = Σ_d T_id ∂f/∂T_id`` for patch tokens ``i`` ([CLS] excluded), signed, not normalised (CDAM notebook
    cells 17-21). ``f`` is the target's pre-softmax logit or, with ``concept=v``, the dot product ``<z, v>`` of the
    final pre-logits latent ``z`` (final-LN [CLS] for ``global_pool='token'``) with the concept vector (cells
    23-26; unnormalised, not a cosine). Autograd runs through the last block only.

    ``tokens`` — which ``T``:

    * ``"norm1"`` (the reference code): the output of the last block's ``norm1``, the tokens entering the final
      attention. Only the attention consumes it, so for a [CLS]-pooled model the gradient holds every path from a
      patch token to the output; for an average-pooled model it misses each token's own residual path to the
      pooled latent (on the synthetic benchmark's average-pooled ViT that map is worse than a random one).
    * ``"block_input"``: the residual stream entering the last block (the paper's "tokens input to the final
      block" read literally): the attention path and the residual path.
    * ``"auto"`` (default): ``"norm1"`` for ``global_pool='token'`` (the reference's models, golden-tested),
      ``"block_input"`` for average-pooled models, which the reference does not cover.
    """

    TOKENS = ("auto", "norm1", "block_input")

    def __init__(self, concept: Optional[Sequence[float]] = None, tokens: str = "auto"):
        if tokens not in self.TOKENS:
            raise ValueError(f"cdam: tokens must be one of {self.TOKENS}, got {tokens!r}")
        if concept is not None:
            concept = torch.as_tensor(concept).detach().flatten()
        self.concept = concept
        self.tokens = tokens
        self.class_specific = concept is None

    def attribute(self, adapter, inputs, target):
        last = adapter.depth - 1
        tokens = self.tokens
        if tokens == "auto":
            tokens = "norm1" if adapter.global_pool == "token" else "block_input"
        with ActivationRecorder() as rec:
            if tokens == "norm1":
                rec.output(adapter.norm1(last), "tokens", require_grad=True)
            else:
                rec.input(adapter.block(last), "tokens", require_grad=True)
            out = adapter.forward(inputs, grad_from_block=last, pre_logits=self.concept is not None)
            tokens = rec["tokens"]
        if self.concept is None:
            score = class_score(out, resolve_target(out, target))
        else:
            if self.concept.numel() != out.shape[-1]:
                raise ValueError(f"cdam: concept vector has {self.concept.numel()} entries but the model's "
                                 f"pre-logits latent has {out.shape[-1]}")
            score = (out @ self.concept.to(out)).sum()
        (grad,) = torch.autograd.grad(score, tokens)
        return (tokens.detach() * grad).sum(dim=-1)[:, adapter.num_prefix_tokens:]


@register_method("token_ablation")
class TokenAblation(AttributionMethod):
    """Token ablation map (TAM; Brocki & Chung): ``TAM_i = f_c(x) - f_c(x without patch token i)``.

    Patch token ``i`` is dropped from the sequence after the positional embedding (so the other tokens keep their
    positions) and the shortened sequence runs through all blocks, the final norm and the head; ``f_c`` is the
    target's logit (predicted class by default, as in the CDAM notebook). The ``P`` ablated sequences are batched,
    at most ``batch_size`` sequences per forward.
    """

    def __init__(self, batch_size: int = 256):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size

    @torch.no_grad()
    def attribute(self, adapter, inputs, target):
        tokens = adapter.embed(inputs)
        logits = adapter.head(adapter.run_blocks(tokens))
        target = resolve_target(logits, target)
        clean = logits.gather(1, target[:, None])
        batch, n, _ = tokens.shape
        prefix = adapter.num_prefix_tokens
        keep_all = torch.arange(n, device=tokens.device)
        result = torch.empty(batch, n - prefix, dtype=logits.dtype, device=logits.device)
        per_forward = max(1, self.batch_size // batch)
        for start in range(prefix, n, per_forward):
            removed = torch.arange(start, min(n, start + per_forward), device=tokens.device)
            keep = keep_all[None, :].expand(len(removed), n)
            keep = keep[keep != removed[:, None]].reshape(len(removed), n - 1)
            ablated = tokens[:, keep].flatten(0, 1)  # [B * r, N - 1, D]
            out = adapter.head(adapter.run_blocks(ablated)).unflatten(0, (batch, len(removed)))
            result[:, removed - prefix] = clean - out.gather(2, target[:, None, None].expand(-1, len(removed), 1))[..., 0]
        return result
