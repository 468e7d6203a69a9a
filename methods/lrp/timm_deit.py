"""LRP topology of timm's distilled DeiT (``VisionTransformerDistilled``): the timm ViT graph
(:mod:`methods.lrp.timm_vit`) with a second prefix token and a second head.

Graph (forward order): ``patch_embed.proj`` (Conv2d, z^B rule) -> [CLS] and distillation tokens concat ->
``+ pos_embed`` (Add; the positional embedding covers both prefix tokens unless ``no_embed_class``) -> blocks ->
``norm`` (identity) -> ``head`` on position 0 and ``head_dist`` on position 1 (Linear each) -> the mean of the two
logit vectors (Add of the two heads' outputs; the constant 1/2 is invisible to the rules, which split relevance in
proportion to the operands). Relevance reaches the final hidden states at positions 0 and 1 only (selection rule).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from ..adapters import ActivationRecorder, MethodUndefinedError, TimmDeiTAdapter, TimmViTAdapter
from .sublayers import embedding_sum_relprop
from .timm_vit import TimmViTTopology
from .topology import register_topology


@register_topology(TimmDeiTAdapter)
class TimmDeiTTopology(TimmViTTopology):
    """Relevance pass over a stock timm ``VisionTransformerDistilled`` through its
    :class:`~methods.adapters.TimmDeiTAdapter` (see the module docstring)."""

    @staticmethod
    def check(adapter: TimmViTAdapter) -> None:
        """The timm ViT's checks, and ``head_dist`` a Linear layer."""
        TimmViTTopology.check(adapter)
        if not isinstance(adapter.model.head_dist, nn.Linear):
            raise MethodUndefinedError(f"LRP rules are not defined for this {type(adapter.model).__name__}: "
                                       f"head_dist {type(adapter.model.head_dist).__name__} (need nn.Linear)")

    def record(self, rec: ActivationRecorder, blocks: Sequence[int], to_input: bool,
               grad_blocks: Sequence[int] = (), layer_outputs: bool = True) -> None:
        """The timm ViT's hooks, and the inputs and outputs of both heads."""
        super().record(rec, blocks, to_input, grad_blocks, layer_outputs)
        m = self.model
        rec.output(m.head, "head_out")
        rec.input(m.head_dist, "head_dist_in")
        rec.output(m.head_dist, "head_dist_out")

    @torch.no_grad()
    def head_relprop(self, rules, acts, relevance_logits: Tensor) -> Tensor:
        """Relevance at the output of the final ``norm`` ``[B, N, D]``: the Add of the two heads' logits, each
        head's Linear rule, the selection of positions 0 ([CLS]) and 1 (distillation)."""
        m = self.model
        r_cls, r_dist = rules["add"](acts["head_out"], acts["head_dist_out"], relevance_logits)
        hidden = acts["norm_out"]
        out = torch.zeros_like(hidden)
        out[:, 0] = rules["select"](hidden[:, 0], rules["linear"](acts["head_in"], m.head.weight, r_cls))
        out[:, 1] = rules["select"](hidden[:, 1], rules["linear"](acts["head_dist_in"], m.head_dist.weight, r_dist))
        return out

    @torch.no_grad()
    def input_relprop(self, rules, acts, relevance: Tensor) -> Tensor:
        """From the tokens entering block 0 to the pixels: ``+ pos_embed`` (Add, the positional share dropped;
        over the [CLS], distillation and patch tokens, or the patches alone with ``no_embed_class``), both prefix
        tokens dropped, patch conv (z^B). ``[B, 3, H, W]``."""
        m = self.model
        patches = acts["patch_tokens"]                                     # [B, P, D]
        batch = patches.shape[0]
        pos = m.pos_embed.expand(batch, -1, -1)
        if getattr(m, "no_embed_class", False):
            r_patches = embedding_sum_relprop(rules, patches, pos, relevance[:, 2:])
        else:
            tokens = torch.cat([m.cls_token.expand(batch, -1, -1), m.dist_token.expand(batch, -1, -1), patches], 1)
            r_patches = embedding_sum_relprop(rules, tokens, pos, relevance)[:, 2:]
        pixels = acts["pixels"]
        conv = m.patch_embed.proj
        gh, gw = pixels.shape[-2] // conv.stride[0], pixels.shape[-1] // conv.stride[1]
        r_grid = r_patches.transpose(1, 2).reshape(batch, -1, gh, gw)
        return rules["input_conv"](pixels, conv.weight, r_grid, conv.stride, conv.padding)
