"""LRP topology of a stock timm ``VisionTransformer``: what to record and in which order the sub-layers apply.

Graph (forward order): ``patch_embed.proj`` (Conv2d, z^B rule) -> prefix tokens concat ([CLS], registers) ->
``+ pos_embed`` (Add; with ``no_embed_class`` only the patches get it) -> blocks (pre-norm: ``x + attn(norm1(x))``,
``h + mlp(norm2(h))``; see :func:`methods.lrp.sublayers.block_relprop`) -> ``norm`` (identity) -> read-out ([CLS]
select, token mean over the patches, or the ``map`` attention pooling head) -> ``fc_norm`` (identity) -> ``head``
(Linear).

Layer scale (``x + gamma * branch``, DINOv2, CaiT-style ``init_values``): a constant per channel, one input per
output, so the z-rule passes relevance through it unchanged; the Add rule sees the scaled branch, and ``gamma`` is
folded into the branch's last Linear (``proj``, ``fc2``) for its rule (as for transformers' DINOv2).

The ``map`` head (timm's ``AttentionPoolLatent``, one learned query) by the rules of a block:
``y = proj(A @ v)`` with ``A = softmax(q k^T * scale)``, ``q = q_proj(latent)``, ``[k | v] = kv(tokens)``, then
``y + mlp(norm(y))``: the Add rule, the MLP's Linear rules and the clone of ``y``, the output projection's Linear
rule, the attention core (:func:`methods.lrp.sublayers.attention_relprop`: the matmul rule on ``A @ v`` and on
``q @ k^T``; the query's share is dropped, as the learned latent is no input) and the Linear rule of ``kv`` onto
the tokens the pool reads (the patches; the prefix tokens get none, unless ``pool_include_prefix``).
"""
from __future__ import annotations

from typing import Dict, Sequence, Tuple

import torch
from torch import Tensor, nn

from ..adapters import ActivationRecorder, MethodUndefinedError, TimmViTAdapter
from ..adapters.base import AttentionLinears
from .sublayers import (
    attention_relprop,
    block_relprop,
    block_tensors,
    embedding_sum_relprop,
    folded_linear,
    readout_relprop,
    record_block,
)
from .topology import Topology, register_topology


@register_topology(TimmViTAdapter)
class TimmViTTopology(Topology):
    """Relevance pass over a stock timm ViT through its :class:`~methods.adapters.TimmViTAdapter`."""

    @staticmethod
    def check(adapter: TimmViTAdapter) -> None:
        """Raise ``TypeError`` naming what has no LRP rule here (a layer scale without ``gamma``, q/k norm, gated
        attention, non-standard blocks or MLPs, attention pooling, dynamic positional embeddings)."""
        from timm.layers import Mlp
        from timm.models.vision_transformer import Attention, Block

        m = adapter.model
        problems = []
        pool = getattr(m, "attn_pool", None)
        if pool is not None:
            for attr in ("q_norm", "k_norm"):
                if not isinstance(getattr(pool, attr), nn.Identity):
                    problems.append(f"attention pool {attr}")
            if type(pool.mlp) is not Mlp or not isinstance(getattr(pool.mlp, "norm", nn.Identity()), nn.Identity):
                problems.append(f"attention pool mlp {type(pool.mlp).__name__}")
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
                scale = getattr(blk, attr)
                if not isinstance(scale, nn.Identity) and not isinstance(getattr(scale, "gamma", None), Tensor):
                    problems.append(f"block {i} layer scale {attr} {type(scale).__name__}")
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
            raise MethodUndefinedError(
                f"LRP rules are not defined for this {type(m).__module__}.{type(m).__name__}: "
                f"{'; '.join(problems[:6])}; supported families: {adapter.family} (stock pre-norm "
                f"Block/Attention/Mlp, Identity layer scale and q/k norm, [CLS], average or map pooling, Linear head)"
            )

    def __init__(self, adapter: TimmViTAdapter) -> None:
        super().__init__(adapter)
        #: per block with layer scale (``x + gamma * branch``, a constant per channel: relevance passes it
        #: unchanged), the output projection and the MLP's second Linear with the scales folded in
        self.scaled: Dict[int, Tuple[nn.Linear, nn.Linear]] = {}
        for i, blk in enumerate(adapter.blocks):
            if not isinstance(blk.ls1, nn.Identity) or not isinstance(blk.ls2, nn.Identity):
                one = torch.ones(adapter.width)
                self.scaled[i] = (folded_linear(blk.attn.proj, getattr(blk.ls1, "gamma", one)),
                                  folded_linear(blk.mlp.fc2, getattr(blk.ls2, "gamma", one)))

    # ------------------------------------------------------------------ recording
    def record(self, rec: ActivationRecorder, blocks: Sequence[int], to_input: bool,
               grad_blocks: Sequence[int] = (), layer_outputs: bool = True) -> None:
        """Hooks for the rule inputs of ``blocks`` (and of the embedding when ``to_input``); the attention
        probabilities of ``grad_blocks`` are made differentiable (for ``d logit / d A``). ``layer_outputs``:
        also the outputs of the Linear layers that nothing else needs (``fc1``), for rule sets whose Linear rule
        reads them (:attr:`RuleSet.linear_uses_output`)."""
        m, adapter = self.model, self.adapter
        for l in blocks:
            adapter.record_attention(rec, l, ("attn", l), require_grad=l in grad_blocks)
            record_block(rec, adapter, l, layer_outputs)
            if l in self.scaled:
                rec.output(adapter.blocks[l].ls1, ("scaled_attn_out", l))
                rec.output(adapter.blocks[l].ls2, ("scaled_mlp_out", l))
        rec.input(m.head, "head_in")
        rec.output(m.norm, "norm_out")
        pool = getattr(m, "attn_pool", None)
        if pool is not None:
            rec.output(pool.q, "pool_q")
            rec.input(pool.kv, "pool_kv_in")
            rec.output(pool.kv, "pool_kv")
            rec.input(pool.proj, "pool_ctx")
            rec.output(pool.proj, "pool_y")
            rec.input(pool.mlp.fc1, "pool_fc1_in")
            if layer_outputs:
                rec.output(pool.mlp.fc1, "pool_fc1_out")
            rec.input(pool.mlp.fc2, "pool_fc2_in")
            rec.output(pool.mlp.fc2, "pool_mlp_out")
        if to_input:
            rec.input(m.patch_embed.proj, "pixels")
            rec.output(m.patch_embed, "patch_tokens")

    # ------------------------------------------------------------------ relevance pass
    @torch.no_grad()
    def block_relprop(self, rules, acts, layer: int, relevance: Tensor, need_below: bool):
        """The shared block pass; with layer scale, the scaled branches and the Linear layers with the scales
        folded in (the z-rule through ``gamma * a`` is the identity: one input per output)."""
        adapter = self.adapter
        linears, mlp = adapter.attention_linears(layer), adapter.mlp_linears(layer)
        extra = {}
        if layer in self.scaled:
            out, fc2 = self.scaled[layer]
            linears = AttentionLinears(out=out, qkv=linears.qkv)
            mlp = (mlp[0], fc2)
            extra = dict(attn_out=acts.pop(("scaled_attn_out", layer)), mlp_out=acts.pop(("scaled_mlp_out", layer)))
        return block_relprop(rules, block_tensors(acts, layer, **extra), linears, mlp, adapter.num_heads, relevance,
                             need_below)

    @torch.no_grad()
    def head_relprop(self, rules, acts, relevance_logits: Tensor) -> Tensor:
        """Relevance at the output of the final ``norm`` (``[B, N, D]``): head Linear, then the read-out."""
        m = self.model
        r = rules["linear"](acts["head_in"], m.head.weight, relevance_logits)   # fc_norm, head_drop: identity
        first = self.adapter.pool_start
        if self.adapter.readout == "attention_pool":
            out = torch.zeros_like(acts["norm_out"])
            out[:, first:] = self.pool_relprop(rules, acts, r)
            return out                                                             # norm: identity
        return readout_relprop(rules, acts["norm_out"], r, self.adapter.readout, slice(first, None))  # norm: id

    @torch.no_grad()
    def pool_relprop(self, rules, acts, relevance: Tensor) -> Tensor:
        """Relevance of the tokens the ``map`` pool reads (``[B, n, D]``) from that of its output ``[B, D]``
        (the module docstring's rules; the pool's norm and GELU: identity)."""
        pool = self.model.attn_pool
        y, m_out = acts["pool_y"], acts["pool_mlp_out"]                    # [B, 1, D]: one latent query
        r_y, r_m = rules["add"](y, m_out, relevance[:, None])
        r_m = rules["linear"](acts["pool_fc2_in"], pool.mlp.fc2.weight, r_m, m_out, pool.mlp.fc2.bias)
        r_m = rules["linear"](acts["pool_fc1_in"], pool.mlp.fc1.weight, r_m, acts.get("pool_fc1_out"),
                              pool.mlp.fc1.bias)
        r_y = rules["clone"](y, [r_y, r_m])
        ctx = acts["pool_ctx"]                                                # A @ v, heads merged, [B, 1, D]
        r_ctx = rules["linear"](ctx, pool.proj.weight, r_y, y, pool.proj.bias)
        kv_out, tokens = acts["pool_kv"], acts["pool_kv_in"]
        batch, n = tokens.shape[:2]
        heads = pool.num_heads

        def heads_first(tensor: Tensor) -> Tensor:                            # [B, n, H*d] -> [B, H, n, d]
            return tensor.reshape(batch, tensor.shape[1], heads, -1).transpose(1, 2)

        q = heads_first(acts["pool_q"])
        k, v = kv_out.reshape(batch, n, 2, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q * pool.scale @ k.transpose(-2, -1)).softmax(dim=-1)        # the pool's eager attention
        _, _, r_k, r_v = attention_relprop(rules, q, k, v, attn, heads_first(r_ctx), ctx=heads_first(ctx))
        r_kv = torch.stack([r.transpose(1, 2) for r in (r_k, r_v)], dim=2).reshape(batch, n, -1)
        return rules["linear"](tokens, pool.kv.weight, r_kv, kv_out, pool.kv.bias)

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
            r_patches = embedding_sum_relprop(rules, patches, pos, relevance[:, p:])
        else:
            prefix = [t.expand(patches.shape[0], -1, -1) for t in (m.cls_token, getattr(m, "reg_token", None))
                      if t is not None]
            tokens = torch.cat(prefix + [patches], dim=1)
            r_patches = embedding_sum_relprop(rules, tokens, pos, relevance)[:, p:]
        pixels = acts["pixels"]
        conv = m.patch_embed.proj
        gh, gw = pixels.shape[-2] // conv.stride[0], pixels.shape[-1] // conv.stride[1]
        r_grid = r_patches.transpose(1, 2).reshape(patches.shape[0], -1, gh, gw)
        return rules["input_conv"](pixels, conv.weight, r_grid, conv.stride, conv.padding)
