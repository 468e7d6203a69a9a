"""LRP topology of the two towers of a stock ``transformers.SiglipModel`` behind a scorer
(``models.clip.ZeroShotClassifier`` / ``PromptScorer``). No reference implementation exists; this is CLIP's graph
(:mod:`.hf_clip.topology`) with SigLIP's read-outs, from the shared rules and sub-layers, checked by relevance
conservation (``tests/test_siglip.py``).

Design notes: ``NOTES.md`` beside this file (topology.py).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...adapters import ActivationRecorder
from ...lrp.sublayers import (
    attention_relprop,
    block_tensors,
    record_patch_embedding,
    recorded_patches_relprop,
    residual_mlp_relprop,
    score_relprop,
)
from ...lrp.topology import Topology, linear_layer_problems, refuse, register_topology
from ..hf_clip.topology import HFCLIPTextTopology
from .adapter import HFSiglipTextAdapter, HFSiglipVisionAdapter


def pooling_attention_problems(attention: nn.Module) -> list:
    """What in an ``nn.MultiheadAttention`` pooling layer the relevance pass here does not cover."""
    if not isinstance(attention, nn.MultiheadAttention):
        return [f"pooling attention {type(attention).__name__} (need nn.MultiheadAttention)"]
    problems = []
    if not attention._qkv_same_embed_dim or attention.in_proj_weight is None:
        problems.append("pooling attention with separate q/k/v weights")
    if attention.bias_k is not None or attention.bias_v is not None or attention.add_zero_attn:
        problems.append("pooling attention with bias_k / bias_v / add_zero_attn")
    if not attention.batch_first:
        problems.append("pooling attention with batch_first=False")
    return problems


@register_topology(HFSiglipVisionAdapter)
class HFSiglipVisionTopology(Topology):
    """Relevance pass over SigLIP's vision tower (``ZeroShotClassifier``) and its attention-pooling head."""

    @staticmethod
    def check(adapter: HFSiglipVisionAdapter) -> None:
        head = adapter.pooling_head()
        problems = pooling_attention_problems(head.attention)
        conv = adapter.tower_model.embeddings.patch_embedding
        if not isinstance(conv, nn.Conv2d) or conv.groups != 1 or isinstance(conv.padding, str) and \
                conv.padding != "valid":
            problems.append("patch embedding without a plain Conv2d")
        if not all(isinstance(x, nn.Linear) for x in (head.mlp.fc1, head.mlp.fc2)):
            problems.append("pooling head MLP layers are not nn.Linear")
        refuse("SigLIP vision tower", problems + linear_layer_problems(adapter))

    def record_head(self, rec: ActivationRecorder, layer_outputs: bool) -> None:
        """The pooling head's input, attention output, MLP and output."""
        head = self.adapter.pooling_head()
        rec.input(head, "pool_in")
        rec.output(head.attention, "pool_attended", index=0)
        rec.input(head.mlp.fc1, "pool_fc1_in")
        if layer_outputs:
            rec.output(head.mlp.fc1, "pool_fc1_out")
        rec.input(head.mlp.fc2, "pool_fc2_in")
        rec.output(head.mlp.fc2, "pool_mlp_out")
        rec.output(head, "embedding")

    def record_input(self, rec: ActivationRecorder) -> None:
        record_patch_embedding(rec, self.adapter.tower_model.embeddings.patch_embedding)

    @torch.no_grad()
    def head_relprop(self, rules, acts, relevance_logits: Tensor) -> Tensor:
        """Relevance at the last block's output ``[B, N, D]``: the score, the pooling head's residual MLP, its
        output projection, its attention core and its k/v projections, ``post_layernorm`` (identity)."""
        adapter = self.adapter
        head = adapter.pooling_head()
        attention = head.attention
        r = score_relprop(rules, acts["embedding"], adapter.score_weight(), relevance_logits)[:, None]   # [B, 1, D]
        attended = acts["pool_attended"]
        mlp = block_tensors({}, 0, x=attended, attn_out=attended, mlp_in=attended, mlp_out=acts["pool_mlp_out"],
                            fc1_in=acts["pool_fc1_in"], fc1_out=acts.get("pool_fc1_out"),
                            fc2_in=acts["pool_fc2_in"])
        r = residual_mlp_relprop(rules, mlp, head.mlp.fc1, head.mlp.fc2, r, None)          # at the attention output

        hidden = acts["pool_in"]                                                              # [B, N, D]
        batch, tokens, dim = hidden.shape
        heads = int(attention.num_heads)
        w_q, w_k, w_v = attention.in_proj_weight.chunk(3)
        b_q, b_k, b_v = (attention.in_proj_bias.chunk(3) if attention.in_proj_bias is not None
                         else (None, None, None))
        probe = head.probe.to(hidden).expand(batch, -1, -1)
        q, k, v = F.linear(probe, w_q, b_q), F.linear(hidden, w_k, b_k), F.linear(hidden, w_v, b_v)

        def heads_first(t: Tensor) -> Tensor:            # [B, n, H*d] -> [B, H, n, d]
            return t.reshape(batch, t.shape[1], heads, -1).transpose(1, 2)

        def merged(t: Tensor) -> Tensor:                 # [B, H, n, d] -> [B, n, H*d]
            return t.transpose(1, 2).reshape(batch, t.shape[2], -1)

        qh, kh, vh = heads_first(q), heads_first(k), heads_first(v)
        attn = torch.softmax(qh @ kh.transpose(-2, -1) / math.sqrt(dim // heads), dim=-1)   # [B, H, 1, N]
        ctx = attn @ vh                                                                     # [B, H, 1, d]
        out = attention.out_proj
        r_ctx = rules["linear"](merged(ctx), out.weight, r, attended.clone(), out.bias)
        _, r_q, r_k, r_v = attention_relprop(rules, qh, kh, vh, attn, heads_first(r_ctx), need_qk=True, ctx=ctx)
        acts["probe_relevance"] = merged(r_q)           # [B, 1, D]: the probe's share, no input's (a parameter)
        return rules.linear_shared(hidden, [(w_k, merged(r_k), k, b_k), (w_v, merged(r_v), v, b_v)])

    @torch.no_grad()
    def input_relprop(self, rules, acts, relevance: Tensor) -> Tensor:
        """From the tokens entering block 0 to the pixels: ``+ position_embedding`` (Add; the position share
        dropped), the patch convolution (z^B). ``[B, 3, H, W]``."""
        embeddings = self.adapter.tower_model.embeddings
        return recorded_patches_relprop(rules, acts, embeddings.patch_embedding, relevance, None,
                                        embeddings.position_embedding.weight)


@register_topology(HFSiglipTextAdapter)
class HFSiglipTextTopology(HFCLIPTextTopology):
    """Relevance pass over SigLIP's text tower (``PromptScorer``): CLIP's, read out at the last position."""

    def readout(self, rules, acts, relevance_pooled: Tensor) -> Tensor:
        """The selection of the last position (``SiglipTextModel``'s ``[:, -1]``)."""
        hidden = acts["last_hidden"]
        out = torch.zeros_like(hidden)
        out[:, -1] = rules["select"](hidden[:, -1], relevance_pooled)
        return out
