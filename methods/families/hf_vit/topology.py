"""LRP topology of the stock Hugging Face ViT-like image classifiers (:mod:`methods.families.hf_vit`): the ViT
graph of Chefer et al. 2021a (patch convolution by z^B, the positional share dropped at the Add, pre-norm blocks
with separate q/k/v projections, final norm identity), read out through each model's classifier(s); DINOv2's
layer scales folded into the Linear layer before them.

Design notes: ``NOTES.md`` beside this file (topology.py).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from ...adapters import ActivationRecorder
from ...lrp.sublayers import conv_relprop, embedding_sum_relprop, readout_relprop
from ...lrp.topology import Topology, refuse, register_topology
from .adapter import (
    HFDeiTAdapter,
    HFDeiTWithTeacherAdapter,
    HFDinov2Adapter,
    HFDinov2WithRegistersAdapter,
    HFViTAdapter,
    HFViTLikeAdapter,
)


@register_topology(HFDinov2WithRegistersAdapter)
@register_topology(HFDinov2Adapter)
@register_topology(HFDeiTWithTeacherAdapter)
@register_topology(HFDeiTAdapter)
@register_topology(HFViTAdapter)
class HFViTLikeTopology(Topology):
    """Relevance pass over a stock Hugging Face ViT-like classifier through its
    :class:`~methods.adapters.HFViTLikeAdapter` (see the module docstring)."""

    @staticmethod
    def check(adapter: HFViTLikeAdapter) -> None:
        """Raise :class:`~methods.adapters.MethodUndefinedError` naming what has no LRP rule here."""
        problems = []
        for lin in adapter.classifiers():
            if not isinstance(lin, nn.Linear):
                problems.append(f"classifier {type(lin).__name__} (need nn.Linear)")
        if not isinstance(adapter.backbone.embeddings.patch_embeddings.projection, nn.Conv2d):
            problems.append("patch embedding without a Conv2d projection")
        for i, block in enumerate(adapter.blocks):
            if hasattr(block.mlp, "gate_proj"):
                problems.append(f"layer {i} gated MLP {type(block.mlp).__name__} (SwiGLU)")
            linears = adapter.linears(i).attention
            if not all(isinstance(x, nn.Linear) for x in (linears.q, linears.k, linears.v, linears.out)):
                problems.append(f"layer {i} attention projections are not nn.Linear")
        refuse(type(adapter.model).__name__, problems)

    def layer_scales(self, layer: int) -> Optional[Tuple[Tuple[nn.Module, Tensor], Tuple[nn.Module, Tensor]]]:
        """DINOv2's ``layer_scale1`` / ``layer_scale2`` (``x * lambda1``)."""
        block = self.adapter.blocks[layer]
        if not hasattr(block, "layer_scale1"):
            return None
        return (block.layer_scale1, block.layer_scale1.lambda1), (block.layer_scale2, block.layer_scale2.lambda1)

    # ------------------------------------------------------------------ recording
    def record_head(self, rec: ActivationRecorder, layer_outputs: bool) -> None:
        """The classifiers' inputs and outputs, the final norm's output."""
        for i, lin in enumerate(self.adapter.classifiers()):
            rec.input(lin, ("head_in", i))
            rec.output(lin, ("head_out", i))
        rec.output(self.adapter.backbone.layernorm, "norm_out")

    def record_input(self, rec: ActivationRecorder) -> None:
        patches = self.adapter.backbone.embeddings.patch_embeddings
        rec.input(patches.projection, "pixels")
        rec.output(patches, "patch_tokens")

    # ------------------------------------------------------------------ relevance pass
    @torch.no_grad()
    def head_relprop(self, rules, acts, relevance_logits: Tensor) -> Tensor:
        """Relevance at the final ``layernorm``'s output ``[B, N, D]`` (see the module docstring)."""
        adapter = self.adapter
        hidden = acts["norm_out"]
        heads = adapter.classifiers()
        if isinstance(adapter, HFDeiTWithTeacherAdapter):
            shares = rules["add"](acts[("head_out", 0)], acts[("head_out", 1)], relevance_logits)
            out = torch.zeros_like(hidden)
            for i, (head, share) in enumerate(zip(heads, shares)):
                out[:, i] = rules["select"](hidden[:, i], rules["linear"](acts[("head_in", i)], head.weight, share))
            return out
        r = rules["linear"](acts[("head_in", 0)], heads[0].weight, relevance_logits)
        if not isinstance(adapter, HFDinov2Adapter):
            return readout_relprop(rules, hidden, r, "class_token")
        dim = hidden.shape[-1]
        patches = slice(adapter.num_prefix_tokens, None)
        return (readout_relprop(rules, hidden, r[:, :dim], "class_token")
                + readout_relprop(rules, hidden, r[:, dim:], "mean_content", patches))

    @torch.no_grad()
    def input_relprop(self, rules, acts, relevance: Tensor) -> Tensor:
        """From the tokens entering block 0 to the pixels: registers dropped (DINOv2 with registers), ``+
        position_embeddings`` (Add, the positional share dropped), [CLS] (and DeiT's distillation token) dropped,
        the patch convolution (z^B). ``[B, C, H, W]``."""
        adapter = self.adapter
        embeddings = adapter.backbone.embeddings
        patches = acts["patch_tokens"]                                     # [B, P, D]
        pixels = acts["pixels"]
        batch = patches.shape[0]
        prefix = [embeddings.cls_token]
        if isinstance(adapter, HFDeiTAdapter):
            prefix.append(embeddings.distillation_token)
        tokens = torch.cat([t.to(patches).expand(batch, -1, -1) for t in prefix] + [patches], dim=1)
        if isinstance(adapter, HFDinov2Adapter):
            position = embeddings.interpolate_pos_encoding(tokens, pixels.shape[-2], pixels.shape[-1])
            relevance = torch.cat([relevance[:, :1], relevance[:, adapter.num_prefix_tokens:]], dim=1)
        else:
            position = embeddings.position_embeddings
        r_tokens = embedding_sum_relprop(rules, tokens, position.to(patches).expand_as(tokens), relevance)
        return conv_relprop(rules, pixels.to(patches), embeddings.patch_embeddings.projection,
                            r_tokens[:, len(prefix):])
