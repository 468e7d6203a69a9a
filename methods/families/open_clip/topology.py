"""LRP topology of the two towers of a stock ``open_clip.model.CLIP`` behind a CLIP scorer
(``models.clip.ZeroShotClassifier`` / ``PromptScorer``; adapters :mod:`methods.families.open_clip`). As for
transformers' CLIP (:mod:`.hf_clip.topology`) no reference implementation exists: this is the ViT graph of Chefer
et al. 2021a with open_clip's names, built from the shared rules and sub-layers.

Design notes: ``NOTES.md`` beside this file (topology.py).
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from torch import Tensor, nn

from ...adapters import ActivationRecorder, AttentionLinears, Projection
from ...lrp.sublayers import (
    embedding_sum_relprop,
    position_readout_relprop,
    readout_relprop,
    record_mlp,
    record_patch_embedding,
    recorded_patches_relprop,
    score_relprop,
)
from ...lrp.topology import INPUT_POINTS, Topology, refuse, register_topology
from .adapter import OpenCLIPTextAdapter, OpenCLIPVisionAdapter, _OpenCLIPTower


def packed_projection(attn: nn.MultiheadAttention) -> nn.Linear:
    """The q/k/v projection that ``attn`` applies functionally, as an ``nn.Linear`` sharing its
    ``in_proj_weight`` / ``in_proj_bias`` (for the rules to read; never called, not part of the model)."""
    linear = nn.Linear(attn.embed_dim, 3 * attn.embed_dim, device="meta")
    linear.weight = attn.in_proj_weight
    linear.bias = attn.in_proj_bias
    return linear


class _OpenCLIPTowerTopology(Topology):
    """Shared: the score and projection in reverse, the blocks (the shared pre-norm sub-layers)."""

    adapter: _OpenCLIPTower

    @staticmethod
    def check(adapter: _OpenCLIPTower) -> None:
        problems = []
        for i, block in enumerate(adapter.blocks):
            for name in ("ls_1", "ls_2"):
                scale = getattr(block, name)
                if not isinstance(scale, nn.Identity) and not isinstance(getattr(scale, "gamma", None), Tensor):
                    problems.append(f"block {i} layer scale {name} {type(scale).__name__}")
        refuse(f"open_clip {adapter.tower} tower", problems)

    def layer_scales(self, layer: int) -> Optional[Tuple[Tuple[nn.Module, Tensor], Tuple[nn.Module, Tensor]]]:
        """LayerScale ``ls_1`` / ``ls_2`` (``x * gamma``), where not the identity."""
        block = self.adapter.blocks[layer]
        if isinstance(block.ls_1, nn.Identity) and isinstance(block.ls_2, nn.Identity):
            return None
        weight = block.attn.out_proj.weight
        one = torch.ones(weight.shape[0], dtype=weight.dtype)
        return (block.ls_1, getattr(block.ls_1, "gamma", one)), (block.ls_2, getattr(block.ls_2, "gamma", one))

    def rule_linears(self, layer: int) -> Tuple[AttentionLinears, Tuple[Projection, Projection]]:
        """``out_proj`` and the packed q/k/v projection as a Linear (:func:`packed_projection`); the MLP's."""
        attn = self.adapter.blocks[layer].attn
        return AttentionLinears(out=attn.out_proj, qkv=packed_projection(attn)), self.adapter.linears(layer).mlp

    # ------------------------------------------------------------------ recording
    def record_block(self, rec: ActivationRecorder, layer: int, layer_outputs: bool) -> None:
        """The keys of :func:`methods.lrp.sublayers.block_tensors` for block ``layer`` (attention module input
        and output, computed ``q | k | v`` and ``A v``; MLP linears; the scaled branches)."""
        adapter = self.adapter
        block = adapter.blocks[layer]
        attn = block.attn
        heads = adapter.token_flow.heads
        adapter.recording.block_input(rec, layer, ("x", layer))

        def attention_in(_module: nn.Module, args: Tuple[Any, ...], kwargs: dict) -> None:
            x = args[0] if args else kwargs["query"]
            with torch.no_grad():
                rec.outputs[("qkv_in", layer)] = x
                rec.outputs[("qkv", layer)] = nn.functional.linear(x, attn.in_proj_weight, attn.in_proj_bias)

        def attention_out(_module: nn.Module, _args: Tuple[Any, ...], _kwargs: dict, output: Any) -> None:
            out, weights = output
            if weights is None:
                raise RuntimeError("LRP needs the attention probabilities: run it under "
                                   "adapter.recording.eager_attention()")
            with torch.no_grad():
                qkv = rec.outputs[("qkv", layer)]
                batch, tokens, dim = out.shape
                v = qkv[..., 2 * dim:].reshape(batch, tokens, heads, dim // heads).transpose(1, 2)
                rec.outputs[("proj_in", layer)] = (weights.detach() @ v).transpose(1, 2).reshape(batch, tokens, dim)
                rec.outputs[("attn_out", layer)] = out

        rec._handles.append(attn.register_forward_pre_hook(attention_in, with_kwargs=True))
        rec._handles.append(attn.register_forward_hook(attention_out, with_kwargs=True))
        record_mlp(rec, adapter, layer, layer_outputs)
        self.record_scaled_branches(rec, layer)

    def pooled_and_readout(self, rules, acts, relevance_pooled: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """``(pooled [B, D], relevance at the last block's output [B, N, D])`` (the second only when
        ``relevance_pooled`` is given)."""
        raise NotImplementedError  # pragma: no cover

    # ------------------------------------------------------------------ relevance pass
    @torch.no_grad()
    def head_relprop(self, rules, acts, relevance_logits: Tensor) -> Tensor:
        """Relevance at the last block's output ``[B, N, D]``: the score (a Linear on the normalised
        embedding), the projection, the final norm (identity) and the read-out."""
        pooled, _ = self.pooled_and_readout(rules, acts, None)
        weight = self.adapter.projection_weight()
        projection = self.adapter.clip.text_projection if self.adapter.tower == "text" else None
        bias = projection.bias if isinstance(projection, nn.Linear) else None
        z = pooled if weight is None else nn.functional.linear(pooled, weight.to(pooled), bias)
        r = score_relprop(rules, z, self.adapter.score_weight(), relevance_logits)
        if weight is not None:
            r = rules["linear"](pooled, weight.to(pooled), r, None, bias)
        return self.pooled_and_readout(rules, acts, r)[1]


@register_topology(OpenCLIPVisionAdapter)
class OpenCLIPVisionTopology(_OpenCLIPTowerTopology):
    """Relevance pass over open_clip's vision tower (``ZeroShotClassifier``)."""

    adapter: OpenCLIPVisionAdapter

    def record_head(self, rec: ActivationRecorder, layer_outputs: bool) -> None:
        rec.output(self.adapter.blocks[-1], "last_hidden")
        rec.output(self.adapter.visual.ln_post, "ln_post_out")

    def record_input(self, rec: ActivationRecorder) -> None:
        record_patch_embedding(rec, self.adapter.visual.conv1)

    def pooled_and_readout(self, rules, acts, relevance_pooled: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        readout = self.adapter.readout.kind
        if self.adapter.visual.final_ln_after_pool:    # pooled first, ln_post (identity) on the pooled token
            pooled, hidden = acts["ln_post_out"], acts["last_hidden"]
        else:
            hidden = acts["ln_post_out"]
            pooled = hidden[:, 0] if readout == "class_token" else hidden[:, 1:].mean(dim=1)
        if relevance_pooled is None:
            return pooled, hidden
        return pooled, readout_relprop(rules, hidden, relevance_pooled, readout, slice(1, None))

    @torch.no_grad()
    def input_relprop(self, rules, acts, relevance: Tensor) -> Tensor:
        """From the tokens entering block 0 to the pixels: ``ln_pre`` (identity), ``+ positional_embedding``
        (Add; the position share dropped), the class token dropped, ``conv1`` (z^B). ``[B, 3, H, W]``."""
        visual = self.adapter.visual
        return recorded_patches_relprop(rules, acts, visual.conv1, relevance, visual.class_embedding,
                                        visual.positional_embedding)


@register_topology(OpenCLIPTextAdapter)
class OpenCLIPTextTopology(_OpenCLIPTowerTopology):
    """Relevance pass over open_clip's text tower (``PromptScorer``)."""

    adapter: OpenCLIPTextAdapter
    input_points = INPUT_POINTS

    def record_head(self, rec: ActivationRecorder, layer_outputs: bool) -> None:
        rec.output(self.adapter.clip.ln_final, "ln_final_out")

    def record_input(self, rec: ActivationRecorder) -> None:
        rec.output(self.adapter.clip.token_embedding, "token_embeddings")

    def pooled_and_readout(self, rules, acts, relevance_pooled: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """The EOS selection: the relevance placed on each text's read-out position."""
        hidden = acts["ln_final_out"]
        positions = acts["readout_positions"].to(hidden.device)
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), positions]
        if relevance_pooled is None:
            return pooled, hidden
        return pooled, position_readout_relprop(rules, hidden, positions, relevance_pooled)

    @torch.no_grad()
    def input_relprop(self, rules, acts, relevance: Tensor) -> Tensor:
        """``[B, N, D]``: the relevance at the encoder input (``"encoder_input"``) or at the token embeddings
        (``"word_embeddings"``: the Add of token and positional embeddings, the position share dropped)."""
        if self.stops_at_encoder_input():
            return relevance
        tokens = acts["token_embeddings"]
        position = self.adapter.clip.positional_embedding.to(tokens)[None]
        return embedding_sum_relprop(rules, tokens, position.expand_as(tokens), relevance)
