"""Per-family graph walks: which activations to record and in which order the rules apply.

A walk knows a model family's residual/attention structure and nothing about the rules: it records the inputs
of every rule-bearing layer with forward hooks during the model's own forward pass, then walks the graph
backwards calling ``rules[layer_type](...)`` (see :mod:`methods.lrp.rules`). Supporting a new family (Hugging
Face BERT's post-norm encoder, CLIP towers) means writing a new walk class and adding it to ``WALKS`` —
the attention core (:meth:`AttentionCore`) and all rules are shared.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from ..adapters import ActivationRecorder


def attention_relprop(rules, q: Tensor, k: Tensor, v: Tensor, attn: Tensor, relevance_ctx: Tensor,
                      need_qk: bool = True, ctx: Optional[Tensor] = None):
    """Relevance through ``ctx = A @ v`` and ``A = softmax(q @ k^T * scale)`` (``ViT_LRP.py:154-177``).

    ``relevance_ctx`` is ``[B, H, N, d]`` (relevance of the attention output before the head merge). Returns
    ``(R_A, R_q, R_k, R_v)`` where ``R_A`` is the reference's ``attn_cam`` (after the /2); the softmax and the
    scale are invisible to LRP (identity), so ``R_A`` feeds ``q @ k^T`` directly. Gradient x input on both
    matmuls, each operand's relevance halved (conserves ``sum R`` when the matmul rule does).
    ``need_qk=False`` stops after ``R_A``/``R_v`` (``R_q = R_k = None``). ``ctx``: the recorded ``A @ v``
    (``[B, H, N, d]``), if any.
    """
    r_attn, r_v = rules["matmul"](attn, v, relevance_ctx, ab=ctx, scale=0.5)
    if not need_qk:
        return r_attn, None, None, r_v
    r_q, r_kt = rules["matmul"](q, k.transpose(-2, -1), r_attn, scale=0.5)
    return r_attn, r_q, r_kt.transpose(-2, -1), r_v


class TimmViTWalk:
    """Stock timm ``VisionTransformer``: pre-norm blocks ``x + attn(norm1(x))``, ``h + mlp(norm2(h))``.

    Graph (forward order): ``patch_embed.proj`` (Conv2d, z^B rule) -> prefix tokens concat -> ``+ pos_embed``
    (Add) -> blocks -> ``norm`` (identity) -> pool ([CLS] select or token mean) -> ``fc_norm`` (identity) ->
    ``head`` (Linear). Inside a block: Clone(x) -> norm1 (id) -> qkv (Linear) -> q@k^T (matmul) -> softmax (id)
    -> A@v (matmul) -> proj (Linear) -> Add(x, .) -> Clone(h) -> norm2 (id) -> fc1 (Linear) -> act (id) ->
    fc2 (Linear) -> Add(h, .).
    """

    family = "timm VisionTransformer"

    # ------------------------------------------------------------------ validation
    @staticmethod
    def check(adapter) -> None:
        """Raise ``TypeError`` naming what has no LRP rule here (layer scale, q/k norm, gated attention,
        non-standard blocks or MLPs, attention pooling, dynamic positional embeddings)."""
        from timm.models.vision_transformer import Attention, Block
        from timm.layers import Mlp

        m = adapter.model
        name = type(m).__name__
        problems = []
        if getattr(m, "attn_pool", None) is not None:
            problems.append("attention pooling (attn_pool)")
        if getattr(m, "pos_embed", None) is None:
            problems.append("no absolute positional embedding")
        if getattr(m, "dynamic_img_size", False):
            problems.append("dynamic_img_size")
        if not isinstance(m.head, nn.Linear):
            problems.append(f"head {type(m.head).__name__} (need nn.Linear)")
        proj = getattr(m.patch_embed, "proj", None)
        if not isinstance(proj, nn.Conv2d) or proj.groups != 1 or tuple(proj.dilation) != (1, 1):
            problems.append("patch embedding without a plain Conv2d proj")
        for i, blk in enumerate(adapter.blocks):
            if type(blk) is not Block:
                problems.append(f"block {i} is {type(blk).__name__} (need timm Block)")
                continue
            for attr in ("ls1", "ls2"):
                if not isinstance(getattr(blk, attr), nn.Identity):
                    problems.append(f"block {i} layer scale {attr}")
            attn = blk.attn
            if type(attn) is not Attention:
                problems.append(f"block {i} attention {type(attn).__name__}")
                continue
            for attr in ("q_norm", "k_norm", "norm"):
                if not isinstance(getattr(attn, attr, nn.Identity()), nn.Identity):
                    problems.append(f"block {i} attn.{attr}")
            if getattr(attn, "gate", None) is not None:
                problems.append(f"block {i} gated attention")
            if type(blk.mlp) is not Mlp or not isinstance(getattr(blk.mlp, "norm", nn.Identity()), nn.Identity):
                problems.append(f"block {i} mlp {type(blk.mlp).__name__}")
        if problems:
            raise TypeError(
                f"LRP rules are not defined for this {type(m).__module__}.{name}: {'; '.join(problems[:6])}; "
                f"supported families: {', '.join(WALKS)} (stock pre-norm Block/Attention/Mlp, Identity layer "
                f"scale and q/k norm, [CLS] or average pooling, Linear head)"
            )

    def __init__(self, adapter):
        self.check(adapter)
        self.adapter = adapter
        self.model = adapter.model

    # ------------------------------------------------------------------ recording
    def record(self, rec: ActivationRecorder, blocks: Sequence[int], to_input: bool,
               grad_blocks: Sequence[int] = (), layer_outputs: bool = True) -> None:
        """Hooks for the rule inputs of ``blocks`` (and of the embedding when ``to_input``); the attention
        probabilities of ``grad_blocks`` are made differentiable (for ``d logit / d A``). ``layer_outputs``:
        also the outputs of the Linear layers that nothing else needs (``fc1``), for rule sets whose Linear rule
        reads them (:attr:`RuleSet.linear_uses_output`)."""
        m = self.model
        for l in blocks:
            rec.output(self.adapter.attention_probs_module(l), ("attn", l), require_grad=l in grad_blocks)
        rec.input(m.head, "head_in")
        rec.output(m.norm, "norm_out")
        for l in blocks:
            blk = self.adapter.blocks[l]
            rec.input(blk, ("x", l))
            rec.input(blk.attn.qkv, ("qkv_in", l))
            rec.output(blk.attn.qkv, ("qkv", l))
            rec.input(blk.attn.proj, ("proj_in", l))
            rec.output(blk.attn, ("attn_out", l))
            rec.input(blk.mlp.fc1, ("fc1_in", l))
            if layer_outputs:
                rec.output(blk.mlp.fc1, ("fc1_out", l))
            rec.input(blk.mlp.fc2, ("fc2_in", l))
            rec.output(blk.mlp, ("mlp_out", l))
        if to_input:
            rec.input(m.patch_embed.proj, "pixels")
            rec.output(m.patch_embed, "patch_tokens")

    # ------------------------------------------------------------------ relevance pass
    @torch.no_grad()
    def head_relprop(self, rules, acts, relevance_logits: Tensor) -> Tensor:
        """Relevance at the output of the final ``norm`` (``[B, N, D]``): head Linear, then pooling."""
        m = self.model
        r = rules["linear"](acts["head_in"], m.head.weight, relevance_logits)   # fc_norm, head_drop: identity
        tokens = acts["norm_out"]
        out = torch.zeros_like(tokens)
        p = self.adapter.num_prefix_tokens
        if self.adapter.global_pool == "token":
            out[:, 0] = rules["select"](tokens[:, 0], r)
        else:
            first = 0 if getattr(m, "pool_include_prefix", False) else p
            out[:, first:] = rules["mean_pool"](tokens[:, first:], r)
        return out   # norm: identity

    @torch.no_grad()
    def block_relprop(self, rules, acts, layer: int, relevance: Tensor, need_below: bool):
        """Relevance through block ``layer``. Returns ``(R at the block input or None, attn_cam [B,H,N,N])``.

        Tokens whose relevance is zero in every sample (all but [CLS] in the last block of a [CLS]-pooled model)
        stay zero through the token-wise part (MLP, residual Adds, output projection) and select the query rows of
        the attention map and of ``q``, so all of these run on the tokens that carry relevance only; the
        attention spreads it to every token through ``k`` and ``v``. ``R_A`` is returned dense (zero rows).
        The block's recorded layer outputs are consumed: a Linear rule may overwrite the output it is given.
        """
        blk = self.adapter.blocks[layer]
        active = _active_tokens(relevance)

        def act(key):
            t = acts[(key, layer)]
            return t if active is None else t[:, active]

        x, a, m_out = act("x"), act("attn_out"), act("mlp_out")
        r_tok = relevance if active is None else relevance[:, active]
        h = x + a
        r_h, r_m = rules["add"](h, m_out, r_tok)
        r_m = rules["linear"](act("fc2_in"), blk.mlp.fc2.weight, r_m, m_out, blk.mlp.fc2.bias)
        fc1_out = act("fc1_out") if ("fc1_out", layer) in acts else None
        r_m = rules["linear"](act("fc1_in"), blk.mlp.fc1.weight, r_m, fc1_out, blk.mlp.fc1.bias)  # act, drop, norm2: id
        r = rules["clone"](h, [r_h, r_m])
        r_x, r_a = rules["add"](x, a, r)
        ctx = act("proj_in")                            # A @ v (query rows of the active tokens), heads merged
        r_ctx = rules["linear"](ctx, blk.attn.proj.weight, r_a, a, blk.attn.proj.bias)  # proj_drop: id
        batch, tokens = relevance.shape[:2]
        heads = blk.attn.num_heads
        qkv_out = acts[("qkv", layer)]
        q, k, v = qkv_out.reshape(batch, tokens, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        attn = acts[("attn", layer)]
        rows = slice(None) if active is None else active   # query rows that carry relevance

        def heads_first(t: Tensor) -> Tensor:                # [B, n, H*d] -> [B, H, n, d]
            return t.reshape(batch, t.shape[1], heads, -1).transpose(1, 2)

        r_attn, r_q, r_k, r_v = attention_relprop(rules, q[:, :, rows], k, v, attn[:, :, rows], heads_first(r_ctx),
                                                  need_qk=need_below, ctx=heads_first(ctx))
        if active is not None:
            r_attn = _scatter_tokens(r_attn, active, tokens, dim=2)
            r_x = _scatter_tokens(r_x, active, tokens)
        if not need_below:
            return None, r_attn
        x_in, weight, bias = acts[("qkv_in", layer)], blk.attn.qkv.weight, blk.attn.qkv.bias   # norm1: id
        if active is None:
            r_qkv = torch.stack([r.transpose(1, 2) for r in (r_q, r_k, r_v)], dim=2).reshape(batch, tokens, -1)
            r_n1 = rules["linear"](x_in, weight, r_qkv, qkv_out, bias)
        else:
            # The Linear rule is a sum over output units: the q units (relevance on the active rows only) and the
            # k, v units (every token) are two smaller applications of it.
            dim = weight.shape[0] // 3
            r_kv = torch.stack([r.transpose(1, 2) for r in (r_k, r_v)], dim=2).reshape(batch, tokens, -1)
            r_n1 = rules["linear"](x_in, weight[dim:], r_kv, qkv_out[..., dim:], _part(bias, dim, None))
            r_n1[:, active] += rules["linear"](x_in[:, active], weight[:dim], r_q.transpose(1, 2).reshape(
                batch, len(active), -1), qkv_out[:, active, :dim], _part(bias, 0, dim))
        return rules["clone"](acts[("x", layer)], [r_x, r_n1]), r_attn

    @torch.no_grad()
    def input_relprop(self, rules, acts, relevance: Tensor) -> Tensor:
        """From the tokens entering block 0 to the pixels: norm_pre / patch_drop (identity), ``+ pos_embed``
        (Add; the positional-embedding share is dropped), prefix tokens dropped, patch conv (z^B).
        Returns ``[B, 3, H, W]``."""
        m = self.model
        patches = acts["patch_tokens"]                      # [B, P, D] (patch_embed.norm: identity)
        p = self.adapter.num_prefix_tokens
        pos = m.pos_embed.expand(patches.shape[0], -1, -1)
        if getattr(m, "no_embed_class", False):
            r_patches, _ = rules["add"](patches, pos, relevance[:, p:])
        else:
            prefix = [t.expand(patches.shape[0], -1, -1) for t in (m.cls_token, getattr(m, "reg_token", None))
                      if t is not None]
            tokens = torch.cat(prefix + [patches], dim=1)
            r_tokens, _ = rules["add"](tokens, pos, relevance)
            r_patches = r_tokens[:, p:]
        pixels = acts["pixels"]
        conv = m.patch_embed.proj
        gh, gw = pixels.shape[-2] // conv.stride[0], pixels.shape[-1] // conv.stride[1]
        r_grid = r_patches.transpose(1, 2).reshape(patches.shape[0], -1, gh, gw)
        return rules["input_conv"](pixels, conv.weight, r_grid, conv.stride, conv.padding)


def _active_tokens(relevance: Tensor) -> Optional[Tensor]:
    """Indices of the tokens (dim 1) with a nonzero relevance in some sample; ``None`` when that is all."""
    active = relevance.ne(0).any(dim=2).any(dim=0)
    if bool(active.all()):
        return None
    return active.nonzero().flatten()


def _scatter_tokens(values: Tensor, index: Tensor, tokens: int, dim: int = 1) -> Tensor:
    """Zeros with ``tokens`` entries along ``dim``, ``values`` placed at ``index``."""
    shape = list(values.shape)
    shape[dim] = tokens
    out = values.new_zeros(shape)
    out.index_copy_(dim, index, values)
    return out


def _part(bias: Optional[Tensor], start: int, stop: Optional[int]) -> Optional[Tensor]:
    return None if bias is None else bias[start:stop]


WALKS = {"timm VisionTransformer": TimmViTWalk}


def walk_for(adapter):
    try:
        cls = WALKS[adapter.family]
    except KeyError:
        raise TypeError(
            f"no LRP graph walk for model class {type(adapter.model).__name__} ({adapter.family}); "
            f"supported families: {', '.join(WALKS)}"
        ) from None
    return cls(adapter)
