"""LRP topology of stock ``transformers`` decoder LMs and their sequence classifiers (GPT-2, Llama, Mistral,
Qwen2, Qwen3, Gemma 3 text; :mod:`methods.families.hf_decoder`). No reference implementation exists (Chefer's
and Beyond Intuition's code cover ViT, BERT and CLIP): this is the graph of the CLIP text tower (a causal,
pre-norm tower read at a per-sample position) with the decoders' parts, built from the shared rules and
sub-layers, and checked by relevance conservation (``tests/test_hf_decoder.py``: with the conservative
``"ours"`` rules the relevance entering every block sums to the one-hot target, per sample).

Design notes: ``NOTES.md`` beside this file (topology.py).
"""
from __future__ import annotations

import sys
from typing import Any

import torch
from torch import Tensor

from ...adapters import ActivationRecorder, MethodUndefinedError, linear_weight
from ...lrp.sublayers import attention_relprop, block_tensors, embedding_sum_relprop, residual_gated_mlp_relprop
from ...lrp.topology import Topology, register_topology
from .adapter import (
    HFGemma3Adapter,
    HFGPT2Adapter,
    HFLlamaAdapter,
    HFMistralAdapter,
    HFQwen2Adapter,
    HFQwen3Adapter,
    _HFDecoder,
    repeat_heads,
)

INPUT_POINTS = ("encoder_input", "word_embeddings")


class _DecoderTopology(Topology):
    """Shared: the head in reverse, the blocks (GPT-2: the shared pre-norm sub-layers; the others: the decoder
    block of the module docstring) and the input."""

    input_points = INPUT_POINTS
    streams_attention = True
    adapter: Any

    @staticmethod
    def check(adapter: _HFDecoder) -> None:
        problems = adapter.rule_map.problems()
        if problems:
            raise MethodUndefinedError(f"LRP rules are not defined for this {type(adapter.model).__name__}: "
                            f"{'; '.join(problems[:6])}")

    def record_block(self, rec: ActivationRecorder, layer: int, layer_outputs: bool) -> None:
        """The shared block keys plus :meth:`record_block_extra` (the gate's output and the rotary embedding of the
        Llama-like blocks)."""
        super().record_block(rec, layer, layer_outputs)
        self.record_block_extra(rec, layer)

    def record_head(self, rec: ActivationRecorder, layer_outputs: bool) -> None:
        """The final norm's output."""
        rec.output(self.adapter.final_norm(), "normed")

    def record_block_extra(self, rec: ActivationRecorder, layer: int) -> None:
        pass

    def record_input(self, rec: ActivationRecorder) -> None:
        rec.output(self.adapter.input_embedding(), "token_embeddings")

    @torch.no_grad()
    def head_relprop(self, rules, acts, relevance_logits: Tensor) -> Tensor:
        """Relevance at the last block's output ``[B, N, D]``: the head's Linear rule on the normed read-out row,
        the selection of that row (the final norm and Gemma's soft-capping identity)."""
        normed = acts["normed"]
        positions = acts["readout_positions"].to(normed.device)
        rows = torch.arange(normed.shape[0], device=normed.device)
        picked = normed[rows, positions]
        head = self.adapter.classifier()
        r = rules["linear"](picked.clone(), linear_weight(head), relevance_logits.to(picked), None, None)
        out = torch.zeros_like(normed)
        out[rows, positions] = rules["select"](picked, r)
        return out

    @torch.no_grad()
    def input_relprop(self, rules, acts, relevance: Tensor) -> Tensor:
        """``[B, N, D]``: the relevance at the encoder input, or at the token embeddings."""
        if self.input_point not in INPUT_POINTS:
            raise ValueError(f"input_point must be one of {INPUT_POINTS}, got {self.input_point!r}")
        return relevance


@register_topology(HFGPT2Adapter)
class HFGPT2Topology(_DecoderTopology):
    """GPT-2: the shared pre-norm block (fused ``Conv1D`` q/k/v), ``wte + wpe`` at the input."""

    def record_input(self, rec: ActivationRecorder) -> None:
        super().record_input(rec)
        rec.output(self.adapter.base.wpe, "position_embeddings")

    @torch.no_grad()
    def input_relprop(self, rules, acts, relevance: Tensor) -> Tensor:
        relevance = super().input_relprop(rules, acts, relevance)
        if self.input_point == "encoder_input":
            return relevance
        tokens = acts["token_embeddings"]
        return embedding_sum_relprop(rules, tokens, acts["position_embeddings"].expand_as(tokens), relevance)


class _RopeDecoderTopology(_DecoderTopology):
    """Llama-like decoders (see the module docstring)."""

    def record_block_extra(self, rec: ActivationRecorder, layer: int) -> None:
        block = self.adapter.blocks[layer]
        rec.output(block.mlp.gate_proj, ("gate", layer))

        def keep_rotary(_module, _args, kwargs):
            rec.outputs[("cos", layer)], rec.outputs[("sin", layer)] = kwargs["position_embeddings"]

        rec._handles.append(block.self_attn.register_forward_pre_hook(keep_rotary, with_kwargs=True))

    def _rotated(self, layer: int, q_out: Tensor, k_out: Tensor, rotary) -> tuple:
        """The rotated ``q`` ``[B, H, N, d]`` and ``k`` ``[B, kv, N, d]`` as the attention module forms them."""
        attn: Any = self.adapter.blocks[layer].self_attn
        batch, tokens = q_out.shape[:2]
        d = int(attn.head_dim)
        q = q_out.reshape(batch, tokens, -1, d)
        k = k_out.reshape(batch, tokens, -1, d)
        if getattr(attn, "q_norm", None) is not None:   # over the last dimension: before or after the transpose
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = rotary
        apply = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        return apply(q.transpose(1, 2), k.transpose(1, 2), cos, sin)

    @torch.no_grad()
    def block_relprop(self, rules, acts, layer: int, relevance: Tensor, need_below: bool):
        """Relevance through block ``layer``: ``(R at the block input or None, R_A [B, H, N, N])``."""
        adapter = self.adapter
        block: Any = adapter.blocks[layer]
        attn, mlp = block.self_attn, block.mlp
        saved = block_tensors(acts, layer)
        x, a = saved.x, saved.attn_out
        r_h = residual_gated_mlp_relprop(rules, saved, relevance, mlp.down_proj, mlp.gate_proj,
                                         acts.pop(("gate", layer), None), mlp.up_proj)
        # the attention: y = x + o(attn(x'))
        r_x, r_a = rules["add"](x, a, r_h)
        ctx = saved.proj_in
        r_ctx = rules["linear"](ctx, linear_weight(attn.o_proj), r_a, a, attn.o_proj.bias)
        batch, tokens = x.shape[:2]
        heads = adapter.token_flow.heads
        groups = int(attn.num_key_value_groups)
        kv_heads = heads // groups

        def heads_first(t: Tensor) -> Tensor:                     # [B, N, h*d] -> [B, h, N, d]
            return t.reshape(batch, tokens, -1, int(attn.head_dim)).transpose(1, 2)

        def merged(t: Tensor) -> Tensor:                          # [B, h, N, d] -> [B, N, h*d]
            return t.transpose(1, 2).reshape(batch, tokens, -1)

        assert saved.q is not None and saved.k is not None and saved.v is not None, "separate projections"
        q, k = self._rotated(layer, saved.q, saved.k, (acts.pop(("cos", layer)), acts.pop(("sin", layer))))
        v = repeat_heads(saved.v, kv_heads, groups)
        k = merged(k)
        k = heads_first(repeat_heads(k, kv_heads, groups))
        r_attn, r_q, r_k, r_v = attention_relprop(rules, q, k, heads_first(v), saved.attn, heads_first(r_ctx),
                                                  need_qk=need_below, ctx=heads_first(ctx), mask=None)
        if not need_below:
            return None, r_attn

        def folded(r: Tensor) -> Tensor:                          # the copies of a key/value head summed back
            return merged(r.reshape(batch, kv_heads, groups, tokens, -1).sum(dim=2))

        r_in = rules.linear_shared(saved.qkv_in, [
            (linear_weight(attn.q_proj), merged(r_q), saved.q, attn.q_proj.bias),
            (linear_weight(attn.k_proj), folded(r_k), saved.k, attn.k_proj.bias),
            (linear_weight(attn.v_proj), folded(r_v), saved.v, attn.v_proj.bias)])
        return rules["clone"](x, [r_x, r_in]), r_attn


for _adapter in (HFLlamaAdapter, HFMistralAdapter, HFQwen2Adapter, HFQwen3Adapter, HFGemma3Adapter):
    register_topology(_adapter)(type(f"{_adapter.__name__[2:-7]}Topology", (_RopeDecoderTopology,), {
        "__doc__": f"Relevance pass over {_adapter.family} (see the module docstring).",
        "__module__": __name__}))
