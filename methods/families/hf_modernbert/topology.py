"""LRP topology of stock ``transformers`` ModernBERT sequence classifiers (:mod:`methods.families.hf_modernbert`).
No reference implementation exists (Chefer's code covers ViT and BERT): this is the pre-norm block of the decoders'
rotary topology with ModernBERT's parts (a fused ``Wqkv``, the GeGLU ``Wi`` whose two halves meet in one product),
bidirectional, and BERT's head with ModernBERT's pooling. Checked by relevance conservation
(``tests/test_hf_modernbert.py``: with the conservative ``"ours"`` rules the relevance entering every block sums to
the one-hot target, per sample). The graph: ``NOTES.md`` beside this file.
"""
from __future__ import annotations

import sys
from typing import Any

import torch
from torch import Tensor

from ...adapters import ActivationRecorder, linear_weight
from ...lrp.rules import safe_divide
from ...lrp.sublayers import attention_relprop, block_tensors, readout_relprop, residual_gated_mlp_relprop
from ...lrp.topology import INPUT_POINTS, Topology, register_topology
from .adapter import HFModernBertAdapter


def masked_mean_relprop(hidden: Tensor, mask: Tensor, relevance_pooled: Tensor) -> Tensor:
    """Gradient x input on ModernBERT's mean pooling ``p = sum_i m_i h_i / sum_i m_i`` (``m``: the attention mask):
    ``R_i = m_i h_i * safe_divide(R_p, p) / sum_i m_i``, ``[B, N, D]``, 0 at padding (conserves ``sum R_p`` where
    ``p`` is not 0, as the mean-pool rule)."""
    weights = mask.to(hidden.dtype)
    weights = weights / weights.sum(dim=1, keepdim=True)
    pooled = (hidden * weights[..., None]).sum(dim=1)
    return hidden * weights[..., None] * safe_divide(relevance_pooled, pooled)[:, None]


@register_topology(HFModernBertAdapter)
class HFModernBertTopology(Topology):
    """Relevance pass over a ModernBERT classifier through its :class:`HFModernBertAdapter` (module docstring)."""

    input_points = INPUT_POINTS
    adapter: Any

    def record_block(self, rec: ActivationRecorder, layer: int, layer_outputs: bool) -> None:
        """The shared block keys, and the rotary ``(cos, sin)`` the block's attention receives."""
        super().record_block(rec, layer, layer_outputs)

        def keep_rotary(_module, _args, kwargs):
            rec.outputs[("cos", layer)], rec.outputs[("sin", layer)] = kwargs["position_embeddings"]

        attn = self.adapter.self_attention(layer)
        rec._handles.append(attn.register_forward_pre_hook(keep_rotary, with_kwargs=True))

    def record_head(self, rec: ActivationRecorder, layer_outputs: bool) -> None:
        """The final norm's output and the inputs of the head's ``dense`` and of ``classifier``."""
        rec.output(self.adapter.final_norm(), "normed")
        for i, linear in enumerate(self.adapter.head_linears()):
            rec.input(linear, ("head_in", i))

    def record_input(self, rec: ActivationRecorder) -> None:
        """Nothing: both input points read the relevance at the encoder input."""

    @torch.no_grad()
    def head_relprop(self, rules, acts, relevance_logits: Tensor) -> Tensor:
        """Relevance at the last block's output ``[B, N, D]``: ``classifier`` and ``dense`` by the Linear rule (the
        head's activation and norm, the dropout and the final norm identity), then the read-out: the selection of
        position 0, or the masked mean (:func:`masked_mean_relprop`)."""
        r = relevance_logits
        for i, linear in reversed(list(enumerate(self.adapter.head_linears()))):
            r = rules["linear"](acts[("head_in", i)], linear.weight, r)
        normed = acts["normed"]
        if self.adapter.readout.kind == "class_token":
            return readout_relprop(rules, normed, r, "class_token")
        mask = acts.get("attention_mask")
        mask = torch.ones(normed.shape[:2], device=normed.device) if mask is None else mask.to(normed.device)
        return masked_mean_relprop(normed, mask, r)

    def _rotated(self, layer: int, qkv: Tensor, acts) -> tuple:
        """``q``, ``k`` rotated as the attention module rotates them, and ``v``: ``[B, H, N, d]`` each."""
        attn: Any = self.adapter.self_attention(layer)
        batch, tokens = qkv.shape[:2]
        q, k, v = qkv.view(batch, tokens, 3, -1, int(attn.head_dim)).transpose(1, 3).unbind(dim=2)
        cos, sin = acts.pop(("cos", layer)), acts.pop(("sin", layer))
        apply = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        q, k = apply(q, k, cos, sin, unsqueeze_dim=1)
        return q, k, v

    @torch.no_grad()
    def block_relprop(self, rules, acts, layer: int, relevance: Tensor, need_below: bool):
        """Relevance through block ``layer``: ``(R at the block input or None, R_A [B, H, N, N])``. MLP: the Add,
        ``Wo``, the uniform rule on the product ``act(in) * gate`` (half to each factor; the activation and
        ``mlp_norm`` identity), ``Wi`` on both halves at once; attention: the Add, ``Wo``, the attention core on
        the rotated ``q``, ``k`` (the rotation identity, as in the decoders), ``Wqkv``; the clones of ``h`` and
        ``x``."""
        block: Any = self.adapter.blocks[layer]
        attn, mlp = block.attn, block.mlp
        saved = block_tensors(acts, layer)
        x, a = saved.x, saved.attn_out
        r_h = residual_gated_mlp_relprop(rules, saved, relevance, mlp.Wo, mlp.Wi, saved.fc1_out)
        r_x, r_a = rules["add"](x, a, r_h)
        ctx = saved.proj_in
        r_ctx = rules["linear"](ctx, linear_weight(attn.Wo), r_a, a, attn.Wo.bias)
        batch, tokens = x.shape[:2]

        def heads_first(t: Tensor) -> Tensor:                     # [B, N, H*d] -> [B, H, N, d]
            return t.reshape(batch, tokens, -1, int(attn.head_dim)).transpose(1, 2)

        qkv = saved.qkv
        assert qkv is not None, "Wqkv's output is recorded"
        q, k, v = self._rotated(layer, qkv, acts)
        r_attn, r_q, r_k, r_v = attention_relprop(rules, q, k, v, saved.attn, heads_first(r_ctx),
                                                  need_qk=need_below, ctx=heads_first(ctx), mask=None)
        if not need_below:
            return None, r_attn
        r_qkv = torch.stack([r.transpose(1, 2) for r in (r_q, r_k, r_v)], dim=2).reshape(batch, tokens, -1)
        r_in = rules["linear"](saved.qkv_in, linear_weight(attn.Wqkv), r_qkv, qkv, attn.Wqkv.bias)
        return rules["clone"](x, [r_x, r_in]), r_attn

    @torch.no_grad()
    def input_relprop(self, rules, acts, relevance: Tensor) -> Tensor:
        """``[B, N, D]``: the relevance at the encoder input (the embedding LayerNorm's output); at the word
        embeddings the same (``input_point="word_embeddings"``: the LayerNorm is identity and there is no position
        or token-type embedding to share with)."""
        self.stops_at_encoder_input()
        return relevance
