"""LRP topology of a stock timm ``VisionTransformer``: what to record and in which order the sub-layers apply.

Graph (forward order): ``patch_embed.proj`` (Conv2d, z^B rule) -> prefix tokens concat -> ``+ pos_embed``
(Add) -> blocks (pre-norm: ``x + attn(norm1(x))``, ``h + mlp(norm2(h))``; see
:func:`methods.lrp.sublayers.block_relprop`) -> ``norm`` (identity) -> read-out ([CLS] select or token mean) ->
``fc_norm`` (identity) -> ``head`` (Linear).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from ..adapters import ActivationRecorder, MethodUndefinedError, TimmViTAdapter
from .sublayers import embedding_sum_relprop, readout_relprop, record_block
from .topology import Topology, register_topology


@register_topology(TimmViTAdapter)
class TimmViTTopology(Topology):
    """Relevance pass over a stock timm ViT through its :class:`~methods.adapters.TimmViTAdapter`."""

    @staticmethod
    def check(adapter: TimmViTAdapter) -> None:
        """Raise ``TypeError`` naming what has no LRP rule here (layer scale, q/k norm, gated attention,
        non-standard blocks or MLPs, attention pooling, dynamic positional embeddings)."""
        from timm.layers import Mlp
        from timm.models.vision_transformer import Attention, Block

        m = adapter.model
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
            raise MethodUndefinedError(
                f"LRP rules are not defined for this {type(m).__module__}.{type(m).__name__}: "
                f"{'; '.join(problems[:6])}; supported families: {adapter.family} (stock pre-norm "
                f"Block/Attention/Mlp, Identity layer scale and q/k norm, [CLS] or average pooling, Linear head)"
            )

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
        rec.input(m.head, "head_in")
        rec.output(m.norm, "norm_out")
        if to_input:
            rec.input(m.patch_embed.proj, "pixels")
            rec.output(m.patch_embed, "patch_tokens")

    # ------------------------------------------------------------------ relevance pass
    @torch.no_grad()
    def head_relprop(self, rules, acts, relevance_logits: Tensor) -> Tensor:
        """Relevance at the output of the final ``norm`` (``[B, N, D]``): head Linear, then the read-out."""
        m = self.model
        r = rules["linear"](acts["head_in"], m.head.weight, relevance_logits)   # fc_norm, head_drop: identity
        first = 0 if getattr(m, "pool_include_prefix", False) else self.adapter.num_prefix_tokens
        return readout_relprop(rules, acts["norm_out"], r, self.adapter.readout, slice(first, None))  # norm: id

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
