"""LRP topology of a stock timm ``VisionTransformer``: what to record and in which order the sub-layers apply.

Graph (forward order): ``patch_embed.proj`` (Conv2d, z^B rule) -> prefix tokens concat ([CLS], registers) ->
``+ pos_embed`` (Add; with ``no_embed_class`` only the patches get it) -> blocks (pre-norm: ``x + attn(norm1(x))``,
``h + mlp(norm2(h))``; see :func:`methods.lrp.sublayers.block_relprop`) -> ``norm`` (identity) -> read-out ([CLS]
select, token mean over the patches, or the ``map`` attention pooling head) -> ``fc_norm`` (identity) -> ``head``
(Linear).

Layer scale (``x + gamma * branch``, DINOv2, CaiT-style ``init_values``): a constant per channel, one input per
output, so the z-rule passes relevance through it unchanged; the Add rule sees the scaled branch, and ``gamma`` is
folded into the branch's last Linear (``proj``, ``fc2``) for its rule (as for transformers' DINOv2).

Design notes: ``NOTES.md`` beside this file (topology.py).
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
from torch import Tensor, nn

from ...adapters import ActivationRecorder
from ...lrp.sublayers import attention_relprop, patch_embedding_relprop, readout_relprop
from ...lrp.topology import Topology, refuse, register_topology
from .adapter import TimmViTAdapter


def stem_problems(adapter: Any) -> List[str]:
    """What the Linear rule of the head and the z^B rule of the patch embedding need: an ``nn.Linear`` head and a
    plain ``Conv2d`` patch projection (no groups, no dilation)."""
    problems = []
    head = adapter.classifier()
    if not isinstance(head, nn.Linear):
        problems.append(f"head {type(head).__name__} (need nn.Linear)")
    patch_embed = adapter.patch_embedding()
    proj = getattr(patch_embed, "proj", None)
    if not isinstance(proj, nn.Conv2d) or proj.groups != 1 or tuple(proj.dilation) != (1, 1):
        problems.append("patch embedding without a plain Conv2d proj")
    return problems


def record_timm_input(rec: ActivationRecorder, adapter: Any) -> None:
    """What :func:`timm_input_relprop` reads: the pixels and the patch tokens."""
    patch_embed = adapter.patch_embedding()
    rec.input(patch_embed.proj, "pixels")
    rec.output(patch_embed, "patch_tokens")


def timm_input_relprop(rules, adapter: Any, acts, relevance: Tensor) -> Tensor:
    """From the tokens entering block 0 of a timm ViT-like model to the pixels (``norm_pre``, ``patch_drop``
    identity; the recorded ``pixels`` and ``patch_tokens``, ``patch_embed.norm`` identity): ``+ pos_embed`` (Add,
    the position share dropped; with ``no_embed_class`` over the patches only, none without ``pos_embed``), the
    adapter's prefix tokens dropped ([CLS], registers, DeiT's distillation token: those the model has),
    ``patch_embed.proj`` (z^B). ``[B, 3, H, W]``."""
    prefix = adapter.prefix_parameters()
    position, no_embed_class = adapter.position_embedding()
    if position is not None and no_embed_class:
        relevance, prefix = relevance[:, adapter.num_prefix_tokens:], []
    return patch_embedding_relprop(rules, acts["pixels"], adapter.patch_embedding().proj, acts["patch_tokens"],
                                   relevance, prefix, position)


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
        pool = adapter.attention_pool()
        if pool is not None:
            for attr in ("q_norm", "k_norm"):
                if not isinstance(getattr(pool, attr), nn.Identity):
                    problems.append(f"attention pool {attr}")
            if type(pool.mlp) is not Mlp or not isinstance(getattr(pool.mlp, "norm", nn.Identity()), nn.Identity):
                problems.append(f"attention pool mlp {type(pool.mlp).__name__}")
        if adapter.position_embedding()[0] is None:
            problems.append("no absolute positional embedding")
        if adapter.dynamic_image_size:
            problems.append("dynamic_img_size")
        problems += stem_problems(adapter)
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
        refuse(f"{type(m).__module__}.{type(m).__name__}", problems, f"; supported families: {adapter.family} (stock "
               "pre-norm Block/Attention/Mlp, Identity layer scale and q/k norm, [CLS], average or map pooling, Linear "
               "head)")

    def layer_scales(self, layer: int) -> Optional[Tuple[Tuple[nn.Module, Tensor], Tuple[nn.Module, Tensor]]]:
        blk = self.adapter.blocks[layer]
        if isinstance(blk.ls1, nn.Identity) and isinstance(blk.ls2, nn.Identity):
            return None
        one = torch.ones(self.adapter.token_flow.width)
        return (blk.ls1, getattr(blk.ls1, "gamma", one)), (blk.ls2, getattr(blk.ls2, "gamma", one))

    # ------------------------------------------------------------------ recording
    def record_head(self, rec: ActivationRecorder, layer_outputs: bool) -> None:
        """The head's input, the final norm's output and the ``map`` pool's tensors."""
        adapter = self.adapter
        rec.input(adapter.classifier(), "head_in")
        rec.output(adapter.final_norm(), "norm_out")
        pool = adapter.attention_pool()
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

    def record_input(self, rec: ActivationRecorder) -> None:
        record_timm_input(rec, self.adapter)

    # ------------------------------------------------------------------ relevance pass
    @torch.no_grad()
    def head_relprop(self, rules, acts, relevance_logits: Tensor) -> Tensor:
        """Relevance at the output of the final ``norm`` (``[B, N, D]``): head Linear, then the read-out."""
        head = self.adapter.classifier()                                    # fc_norm, head_drop: identity
        r = rules["linear"](acts["head_in"], head.weight, relevance_logits)
        first = self.adapter.pool_start
        if self.adapter.readout.kind == "attention_pool":
            out = torch.zeros_like(acts["norm_out"])
            out[:, first:] = self.pool_relprop(rules, acts, r)
            return out                                                             # norm: identity
        return readout_relprop(rules, acts["norm_out"], r, self.adapter.readout.kind, slice(first, None))  # norm: id

    @torch.no_grad()
    def pool_relprop(self, rules, acts, relevance: Tensor) -> Tensor:
        """Relevance of the tokens the ``map`` pool reads (``[B, n, D]``) from that of its output ``[B, D]``
        (the module docstring's rules; the pool's norm and GELU: identity)."""
        pool = self.adapter.attention_pool()
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
        """:func:`timm_input_relprop`: ``[B, 3, H, W]``."""
        return timm_input_relprop(rules, self.adapter, acts, relevance)
