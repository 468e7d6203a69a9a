"""Relevance through the sub-layers every Transformer family shares, built from the rules of
:mod:`methods.lrp.rules`: the attention core, the residual attention and residual MLP sub-layers, the embedding
sum and the read-out. A family's topology (:mod:`methods.families.timm_vit.topology`, ...) records the tensors named in
:class:`BlockTensors` and calls these in the order of its graph.

The active-token optimisation lives here too: tokens whose relevance is zero in every sample (all but [CLS]
in the last block of a [CLS]-read model) stay zero through the token-wise part of a block (MLP, residual Adds,
output projection) and select the query rows of the attention map and of ``q``, so all of these run on the
tokens that carry relevance only; the attention spreads relevance to every token through ``k`` and ``v``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from ..adapters import AttentionLinears, Projection, linear_weight


def attention_relprop(rules, q: Tensor, k: Tensor, v: Tensor, attn: Tensor, relevance_ctx: Tensor,
                      need_qk: bool = True, ctx: Optional[Tensor] = None, mask: Optional[Tensor] = None,
                      scale: Optional[float] = None, mask_add: Optional[bool] = None):
    """Relevance through ``ctx = A @ v`` and ``A = softmax(q @ k^T * scale + mask)`` (``ViT_LRP.py:154-177``).

    ``relevance_ctx`` is ``[B, H, n, d]`` (relevance of the attention output before the head merge, for the
    ``n`` query rows of ``q`` and ``attn``). Returns ``(R_A, R_q, R_k, R_v)`` where ``R_A`` is the reference's
    ``attn_cam`` (after the /2); the softmax and the scale are invisible to LRP (identity). Without the mask's
    Add (``mask_add`` false; default: ``mask is not None``) ``R_A`` feeds ``q @ k^T`` directly (the ViT graph).
    With it, the Add rule first splits ``R_A`` between the scaled scores ``q @ k^T / sqrt(d)`` (``scale`` =
    ``sqrt(d)``, the divisor of TE's BERT) and the additive ``mask`` (broadcastable to ``[B, H, n, N]``, 0 at
    real keys; ``None`` with ``mask_add=True``: all zero, a batch without padding), whose share is dropped
    (TE ``BERT.py`` ``BertSelfAttention.relprop``: ``add.relprop`` after ``save_attn_cam``;
    :meth:`RuleSet.mask_add`). Gradient x input on both matmuls, each operand's relevance halved (conserves
    ``sum R`` when the matmul rule does); ``q @ k^T`` is formed once, for the Add and as the matmul rule's
    product. ``need_qk=False`` stops after ``R_A``/``R_v`` (``R_q = R_k = None``). ``ctx``: the recorded
    ``A @ v`` (``[B, H, n, d]``), if any.
    """
    r_attn, r_v = rules["matmul"](attn, v, relevance_ctx, ab=ctx, scale=0.5)
    if not need_qk:
        return r_attn, None, None, r_v
    kt = k.transpose(-2, -1)
    if not (mask is not None if mask_add is None else mask_add):
        r_q, r_kt = rules["matmul"](q, kt, r_attn, scale=0.5)
        return r_attn, r_q, r_kt.transpose(-2, -1), r_v
    assert scale is not None, "the mask's Add needs the scores' divisor"
    qk = torch.matmul(q, kt)
    if math.frexp(scale)[0] == 0.5:   # a power of two (head_dim 4**k): the scores in qk's storage, then back
        r_scores = rules.mask_add(qk.div_(scale), mask, r_attn)
        qk.mul_(scale)                # exactly q @ k^T again (scaling by a power of two is exact)
    else:
        r_scores = rules.mask_add(qk / scale, mask, r_attn)
    r_q, r_kt = rules["matmul"](q, kt, r_scores, ab=qk, scale=0.5, overwrite_ab=True)
    return r_attn, r_q, r_kt.transpose(-2, -1), r_v


# ------------------------------------------------------------------------------------------ active tokens
def active_tokens(relevance: Tensor) -> Optional[Tensor]:
    """Indices of the tokens (dim 1) with a nonzero relevance in some sample; ``None`` when that is all."""
    active = relevance.ne(0).any(dim=2).any(dim=0)
    if bool(active.all()):
        return None
    return active.nonzero().flatten()


def scatter_tokens(values: Tensor, index: Tensor, tokens: int, dim: int = 1) -> Tensor:
    """Zeros with ``tokens`` entries along ``dim``, ``values`` placed at ``index``."""
    shape = list(values.shape)
    shape[dim] = tokens
    out = values.new_zeros(shape)
    out.index_copy_(dim, index, values)
    return out


def _part(bias: Optional[Tensor], start: int, stop: Optional[int]) -> Optional[Tensor]:
    return None if bias is None else bias[start:stop]


# ------------------------------------------------------------------------------------------ one block
@dataclass
class BlockTensors:
    """What a topology records for one block (inputs of the rule-bearing layers, and outputs the rules read).

    ``x``: block input; ``attn_out``: the attention sub-layer's output (after its output projection);
    ``mlp_in``: the stream the MLP residual adds to (``x + attn_out`` in a pre-norm block; the attention
    LayerNorm's output in a post-norm block); ``mlp_out``: the MLP's output; ``fc1_in``, ``fc1_out`` (optional),
    ``fc2_in``: the MLP linears' inputs/outputs; ``proj_in``: ``A @ v`` with heads merged (the output
    projection's input); ``qkv_in``: the input of the q/k/v projections; ``qkv``: the fused projection's output
    (``None`` with separate projections, whose outputs are ``q``, ``k``, ``v``, each ``[B, N, D]``);
    ``attn``: the post-softmax attention ``[B, H, N, N]``; ``mask``: the additive attention mask that enters
    LRP's Add rule (broadcastable to ``[B, H, N, N]``, 0 at real keys; ``None``: no Add, the ViT graph, unless
    ``mask_add``: then an all-zero mask, a batch without padding) and ``scale`` its scores' divisor
    ``sqrt(head_dim)``. The relevance pass consumes them (a Linear rule may overwrite a recorded output).
    """

    x: Tensor
    attn_out: Tensor
    mlp_in: Optional[Tensor]
    mlp_out: Tensor
    fc1_in: Tensor
    fc1_out: Optional[Tensor]
    fc2_in: Tensor
    proj_in: Tensor
    qkv_in: Tensor
    qkv: Optional[Tensor]
    attn: Tensor
    q: Optional[Tensor] = None
    k: Optional[Tensor] = None
    v: Optional[Tensor] = None
    mask: Optional[Tensor] = None
    scale: Optional[float] = None
    mask_add: Optional[bool] = None


def record_block(rec, adapter, layer: int, layer_outputs: bool) -> None:
    """Hooks for the rule inputs of block ``layer``, from the adapter's hook points and linears (a fused ``qkv``
    or separate ``q``/``k``/``v`` projections): the keys :func:`block_tensors` reads. ``layer_outputs``: also
    the output of ``fc1``, which only rule sets whose Linear rule reads outputs need
    (:attr:`RuleSet.linear_uses_output`)."""
    linears = adapter.linears(layer).attention
    adapter.recording.block_input(rec, layer, ("x", layer))
    if linears.qkv is not None:
        rec.input(linears.qkv, ("qkv_in", layer))
        rec.output(linears.qkv, ("qkv", layer))
    else:
        rec.input(linears.q, ("qkv_in", layer))
        for name in ("q", "k", "v"):
            rec.output(getattr(linears, name), (name, layer))
    rec.input(linears.out, ("proj_in", layer))
    rec.output(linears.out, ("attn_out", layer))
    record_mlp(rec, adapter, layer, layer_outputs)


def record_mlp(rec, adapter, layer: int, layer_outputs: bool) -> None:
    """Hooks for the MLP linears of block ``layer`` (``adapter.linears(layer).mlp``): the keys ``fc1_in``, ``fc1_out``
    (only with ``layer_outputs``), ``fc2_in`` and ``mlp_out`` of :func:`block_tensors`."""
    fc1, fc2 = adapter.linears(layer).mlp
    rec.input(fc1, ("fc1_in", layer))
    if layer_outputs:
        rec.output(fc1, ("fc1_out", layer))
    rec.input(fc2, ("fc2_in", layer))
    rec.output(fc2, ("mlp_out", layer))


#: the per-block keys ``(name, layer)`` that :func:`record_block` and the topologies record
BLOCK_KEYS = ("x", "attn_out", "mlp_in", "mlp_out", "fc1_in", "fc1_out", "fc2_in", "proj_in", "qkv_in", "qkv", "attn",
              "q", "k", "v")


def release_block(acts, layer: int) -> None:
    """Drop block ``layer``'s recorded tensors (:data:`BLOCK_KEYS`) from ``acts``: the relevance pass is done
    with them, and their memory is reused by the blocks below."""
    for name in BLOCK_KEYS:
        acts.pop((name, layer), None)


def folded_linear(linear: Projection, scale: Tensor) -> nn.Linear:
    """``linear`` followed by ``* scale`` as one Linear layer (weight ``diag(scale) W``, bias ``scale b``),
    detached from the model's parameters."""
    weight = linear_weight(linear).detach()
    folded = nn.Linear(weight.shape[1], weight.shape[0], bias=linear.bias is not None, device="meta")
    folded.weight = nn.Parameter(weight * scale.detach()[:, None], requires_grad=False)
    if linear.bias is not None:
        folded.bias = nn.Parameter(linear.bias.detach() * scale.detach(), requires_grad=False)
    return folded


def block_tensors(acts, layer: int, **extra) -> BlockTensors:
    """The :class:`BlockTensors` of block ``layer`` from what :func:`record_block` recorded (``extra``: the
    fields a topology adds, e.g. ``mlp_in``, ``mask``, ``scale``)."""
    def get(key):
        return acts.get((key, layer))

    fields = dict(x=get("x"), attn_out=get("attn_out"), mlp_in=None, mlp_out=get("mlp_out"), fc1_in=get("fc1_in"),
                  fc1_out=get("fc1_out"), fc2_in=get("fc2_in"), proj_in=get("proj_in"), qkv_in=get("qkv_in"),
                  qkv=get("qkv"), attn=get("attn"), q=get("q"), k=get("k"), v=get("v"))
    fields.update(extra)
    return BlockTensors(**fields)


def residual_mlp_relprop(rules, t: BlockTensors, fc1: Projection, fc2: Projection, relevance: Tensor,
                         rows: Optional[Tensor]) -> Tensor:
    """``y = h + mlp(h')`` (``h' = norm2(h)`` pre-norm, ``h`` post-norm; norms and activations identity): Add,
    the two MLP linears, then the clone of ``h``. ``rows``: the active tokens (``None``: all). Returns the
    relevance at ``h`` for the active rows."""
    def act(tensor):
        return tensor if rows is None or tensor is None else tensor[:, rows]

    x, a, m_out = act(t.x), act(t.attn_out), act(t.mlp_out)
    h = x + a if t.mlp_in is None else act(t.mlp_in)
    r_h, r_m = rules["add"](h, m_out, relevance)
    r_m = rules["linear"](act(t.fc2_in), linear_weight(fc2), r_m, m_out, fc2.bias)
    r_m = rules["linear"](act(t.fc1_in), linear_weight(fc1), r_m, act(t.fc1_out), fc1.bias)
    return rules["clone"](h, [r_h, r_m])


def gated_product_relprop(rules, x: Tensor, relevance: Tensor, gate: Projection, gate_out: Optional[Tensor],
                          up: Optional[Projection] = None, up_out: Optional[Tensor] = None) -> Tensor:
    """Relevance at the input ``x`` of a gated MLP's first layer from ``relevance`` at the product ``act(g) * u``
    (halved in place): the uniform rule (AttnLRP Eq. 7: half to each factor; the activation identity), then the
    Linear rule: through ``gate`` alone when it is fused (its output ``gate_out`` holds both factors, each half
    getting the same relevance), else through ``gate`` and ``up`` reading the same ``x`` (``linear_shared``)."""
    r_half = relevance.mul_(0.5)
    if up is None:
        return rules["linear"](x, linear_weight(gate), torch.cat([r_half, r_half], dim=-1), gate_out, gate.bias)
    return rules.linear_shared(x, [(linear_weight(gate), r_half, gate_out, gate.bias),
                                   (linear_weight(up), r_half.clone(), up_out, up.bias)])


def residual_gated_mlp_relprop(rules, t: BlockTensors, relevance: Tensor, down: Projection, gate: Projection,
                               gate_out: Optional[Tensor], up: Optional[Projection] = None) -> Tensor:
    """``y = h + down(act(gate(h')) * up(h'))`` (pre-norm, ``h = x + attn_out``; the norm and the activation
    identity): the Add, ``down``, :func:`gated_product_relprop` (``up``'s output is ``t.fc1_out``), the clone of
    ``h``. Returns the relevance at ``h``."""
    h = t.x + t.attn_out
    r_h, r_m = rules["add"](h, t.mlp_out, relevance)
    r_p = rules["linear"](t.fc2_in, linear_weight(down), r_m, t.mlp_out, down.bias)
    return rules["clone"](h, [r_h, gated_product_relprop(rules, t.fc1_in, r_p, gate, gate_out, up, t.fc1_out)])


def residual_attention_relprop(rules, t: BlockTensors, linears: AttentionLinears, heads: int, relevance: Tensor,
                               rows: Optional[Tensor], need_below: bool) -> Tuple[Optional[Tensor], Tensor]:
    """``y = x + attn(x')`` (``x' = norm1(x)`` pre-norm, ``x`` post-norm): Add, the output projection, the
    attention core (:func:`attention_relprop`), the q/k/v projection and the clone of ``x``. ``relevance`` is
    the relevance at ``y`` for the active ``rows`` (``None``: all tokens). Returns ``(R at the block input, dense
    [B, N, D], or None when not ``need_below``; R_A [B, H, N, N], dense with zero rows off the active rows)``.
    """
    def act(tensor):
        return tensor if rows is None else tensor[:, rows]

    x, a = act(t.x), act(t.attn_out)
    r_x, r_a = rules["add"](x, a, relevance)
    ctx = act(t.proj_in)                           # A @ v (query rows of the active tokens), heads merged
    out = linears.out
    r_ctx = rules["linear"](ctx, linear_weight(out), r_a, a, out.bias)
    batch, tokens = t.x.shape[:2]
    fused = linears.qkv is not None

    def heads_first(tensor: Tensor) -> Tensor:     # [B, n, H*d] -> [B, H, n, d]
        return tensor.reshape(batch, tensor.shape[1], heads, -1).transpose(1, 2)

    if fused:
        assert t.qkv is not None, "a fused projection records qkv"
        q, k, v = t.qkv.reshape(batch, tokens, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    else:
        assert t.q is not None and t.k is not None and t.v is not None, "separate projections record q, k, v"
        q, k, v = heads_first(t.q), heads_first(t.k), heads_first(t.v)
    query_rows = slice(None) if rows is None else rows
    mask = t.mask
    if mask is not None and rows is not None and mask.shape[-2] != 1:
        mask = mask[..., rows, :]
    r_attn, r_q, r_k, r_v = attention_relprop(rules, q[:, :, query_rows], k, v, t.attn[:, :, query_rows],
                                              heads_first(r_ctx), need_qk=need_below, ctx=heads_first(ctx),
                                              mask=mask, scale=t.scale, mask_add=t.mask_add)
    if rows is not None:
        r_attn = scatter_tokens(r_attn, rows, tokens, dim=2)
        r_x = scatter_tokens(r_x, rows, tokens)
    if not need_below:
        return None, r_attn
    r_in = projections_relprop(rules, t, linears, (r_q, r_k, r_v), rows)
    return rules["clone"](t.x, [r_x, r_in]), r_attn


def projections_relprop(rules, t: BlockTensors, linears: AttentionLinears, r_qkv: Tuple[Tensor, Tensor, Tensor],
                        rows: Optional[Tensor]) -> Tensor:
    """The Linear rule of the q/k/v projections onto their input ``t.qkv_in`` ``[B, N, D]``, from the relevance
    at ``q`` (the active ``rows`` only; ``None``: all tokens), ``k`` and ``v`` (every token), each
    ``[B, H, n, d]``: one rule per separate projection, summed, or one on the fused ``qkv``."""
    r_q, r_k, r_v = r_qkv
    batch, tokens = t.x.shape[:2]
    x_in = t.qkv_in
    if linears.qkv is None:
        assert linears.q is not None and linears.k is not None and linears.v is not None
        assert t.q is not None and t.k is not None and t.v is not None
        # The Linear rule per projection (TE's BERT: query, key, value relprops, then their clone), summed
        # (RuleSet.linear_shared: one pass over the shared input for all three).
        def merged(r: Tensor) -> Tensor:           # [B, H, n, d] -> [B, n, H*d]
            return r.transpose(1, 2).reshape(batch, r.shape[2], -1)

        def term(linear: Projection, r: Tensor, out: Tensor):
            return linear_weight(linear), merged(r), out, linear.bias

        if rows is None:
            return rules.linear_shared(x_in, [term(linears.q, r_q, t.q), term(linears.k, r_k, t.k),
                                              term(linears.v, r_v, t.v)])
        r_in = rules.linear_shared(x_in, [term(linears.k, r_k, t.k), term(linears.v, r_v, t.v)])
        r_in[:, rows] += rules["linear"](x_in[:, rows], linear_weight(linears.q), merged(r_q), t.q[:, rows],
                                         linears.q.bias)
        return r_in
    assert t.qkv is not None
    weight, bias, qkv_out = linear_weight(linears.qkv), linears.qkv.bias, t.qkv
    if rows is None:
        r_all = torch.stack([r.transpose(1, 2) for r in (r_q, r_k, r_v)], dim=2).reshape(batch, tokens, -1)
        return rules["linear"](x_in, weight, r_all, qkv_out, bias)
    # The Linear rule is a sum over output units: the q units (relevance on the active rows only) and the
    # k, v units (every token) are two smaller applications of it.
    dim = weight.shape[0] // 3
    r_kv = torch.stack([r.transpose(1, 2) for r in (r_k, r_v)], dim=2).reshape(batch, tokens, -1)
    r_in = rules["linear"](x_in, weight[dim:], r_kv, qkv_out[..., dim:], _part(bias, dim, None))
    r_in[:, rows] += rules["linear"](x_in[:, rows], weight[:dim], r_q.transpose(1, 2).reshape(
        batch, len(rows), -1), qkv_out[:, rows, :dim], _part(bias, 0, dim))
    return r_in


def block_relprop(rules, t: BlockTensors, linears: AttentionLinears, mlp: Tuple[Projection, Projection], heads: int,
                  relevance: Tensor, need_below: bool) -> Tuple[Optional[Tensor], Tensor]:
    """Relevance through one Transformer block (residual MLP, then residual attention), on the active tokens.
    Returns ``(R at the block input or None, R_A [B, H, N, N])``."""
    rows = active_tokens(relevance)
    r = relevance if rows is None else relevance[:, rows]
    r = residual_mlp_relprop(rules, t, mlp[0], mlp[1], r, rows)
    return residual_attention_relprop(rules, t, linears, heads, r, rows, need_below)


# ------------------------------------------------------------------------------------------ embeddings, read-out
def embedding_sum_relprop(rules, tokens: Tensor, position: Tensor, relevance: Tensor) -> Tensor:
    """``e = tokens + position``: the Add rule; the positional embedding's share is dropped (it is no input)."""
    r_tokens, _ = rules["add"](tokens, position, relevance)
    return r_tokens


def conv_relprop(rules, pixels: Tensor, conv: nn.Conv2d, r_patches: Tensor) -> Tensor:
    """From the patch tokens (``[B, P, D]``, row-major over the grid of the pixels' size over the stride) to the
    pixels ``[B, C, H, W]``: the patch convolution's z^B rule (``input_conv``; ``padding="valid"``: none)."""
    gh, gw = pixels.shape[-2] // conv.stride[0], pixels.shape[-1] // conv.stride[1]
    r_grid = r_patches.transpose(1, 2).reshape(r_patches.shape[0], -1, gh, gw)
    padding = (0, 0) if conv.padding == "valid" else conv.padding
    return rules["input_conv"](pixels, conv.weight, r_grid, conv.stride, padding)


def patch_embedding_relprop(rules, pixels: Tensor, conv: nn.Conv2d, patches: Tensor, relevance: Tensor,
                            prefix: Sequence[Tensor] = (), position: Optional[Tensor] = None) -> Tensor:
    """From the tokens entering the blocks to the pixels ``[B, C, H, W]``. The tokens: the ``prefix`` tokens
    (parameters ``[1, k, D]`` each: [CLS], registers), then the patch tokens ``patches`` ``[B, P, D]``, plus
    ``position`` (broadcastable; ``None``: no position embedding, or one already in ``patches``); ``relevance``
    ``[B, n, D]`` at them. The Add rule with the position share dropped, the prefix tokens dropped (no input),
    then :func:`conv_relprop`."""
    batch = patches.shape[0]
    if position is not None:
        tokens = torch.cat([t.expand(batch, -1, -1) for t in prefix] + [patches], dim=1) if prefix else patches
        relevance = embedding_sum_relprop(rules, tokens, position.expand_as(tokens), relevance)
    return conv_relprop(rules, pixels, conv, relevance[:, relevance.shape[1] - patches.shape[1]:])


def record_patch_embedding(rec, conv: nn.Conv2d) -> None:
    """Record the patch convolution's input (``"pixels"``) and output (``"patch_grid"``, ``[B, D, gh, gw]``) for
    :func:`recorded_patches_relprop`."""
    rec.input(conv, "pixels")
    rec.output(conv, "patch_grid")


def recorded_patches_relprop(rules, acts, conv: nn.Conv2d, relevance: Tensor, class_embedding: Optional[Tensor],
                             position_table: Tensor) -> Tensor:
    """:func:`patch_embedding_relprop` from what :func:`record_patch_embedding` recorded: the tokens are the class
    token ``class_embedding`` (``[D]``; ``None``: none) then the patches, plus the first rows of
    ``position_table`` (``[n, D]``, one per token)."""
    patches = acts["patch_grid"].flatten(2).transpose(1, 2)           # [B, D, gh, gw] -> [B, P, D]
    prefix = [] if class_embedding is None else [class_embedding.to(patches).view(1, 1, -1)]
    position = position_table.to(patches)[None, :patches.shape[1] + len(prefix)]
    return patch_embedding_relprop(rules, acts["pixels"].to(patches), conv, patches, relevance, prefix, position)


def score_relprop(rules, embedding: Tensor, score_weight: Tensor, relevance_logits: Tensor) -> Tensor:
    """A CLIP-like scorer's logits ``logit_scale.exp() * <z / ||z||, e_c>`` (a ``logit_bias``, a constant, gets no
    relevance): the Linear rule of ``score_weight`` (``logit_scale.exp() * E``) on the L2-normalised ``embedding``
    ``z`` ``[B, D]`` (the normalisation identity, as LayerNorm). Returns the relevance at ``z``."""
    normed = embedding / embedding.norm(p=2, dim=-1, keepdim=True)
    return rules["linear"](normed, score_weight.to(embedding), relevance_logits)


def position_readout_relprop(rules, hidden: Tensor, positions: Tensor, relevance_pooled: Tensor) -> Tensor:
    """Relevance of the hidden states ``[B, N, D]`` from that of the rows read at ``positions`` ``[B]`` (one per
    sample: an EOS, the last position): the selection rule."""
    positions = positions.to(hidden.device)
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    out = torch.zeros_like(hidden)
    out[rows, positions] = rules["select"](hidden[rows, positions], relevance_pooled)
    return out


def readout_relprop(rules, hidden: Tensor, relevance_latent: Tensor, readout: str,
                    content: slice = slice(None)) -> Tensor:
    """Relevance of the final hidden states ``[B, N, D]`` from the relevance of the pooled latent ``[B, D]``:
    ``class_token``: the selection rule onto position 0; ``mean_content``: the mean-pool rule over the
    ``content`` positions."""
    out = torch.zeros_like(hidden)
    if readout == "class_token":
        out[:, 0] = rules["select"](hidden[:, 0], relevance_latent)
    elif readout == "mean_content":
        out[:, content] = rules["mean_pool"](hidden[:, content], relevance_latent)
    else:
        raise TypeError(f"LRP has no read-out rule for {readout!r} yet")
    return out
