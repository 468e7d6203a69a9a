"""LRP topologies of stock timm ``Eva`` (EVA, EVA-02) and ``Beit`` classifiers (:mod:`.eva`,
:mod:`.beit`): Chefer et al.'s rules (:mod:`methods.lrp.rules`) on their graph.

Design notes: ``NOTES.md`` beside this file (topology.py).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from ...adapters import ActivationRecorder
from ...lrp.sublayers import attention_relprop, gated_product_relprop, readout_relprop
from ...lrp.topology import Topology, refuse, register_topology
from ..timm_vit.topology import record_timm_input, stem_problems, timm_input_relprop
from .adapter import qkv_bias, qkv_projection
from .beit import TimmBeitAdapter
from .eva import TimmEvaAdapter
from .rules import MLP_CLASSES


class _BeitLikeTopology(Topology):
    """Shared by EVA and BEiT (see the module docstring); a family gives :meth:`rotated` and :meth:`logit_bias`."""

    adapter: Any

    @staticmethod
    def check(adapter: Any) -> None:
        m = adapter.model
        problems = stem_problems(adapter)
        for i, block in enumerate(adapter.blocks):
            if getattr(block.attn, "gate", None) is not None:
                problems.append(f"block {i} gated attention (sigmoid gate on the attention output)")
            if type(block.mlp).__name__ not in MLP_CLASSES:
                problems.append(f"block {i} mlp {type(block.mlp).__name__}")
        refuse(f"{type(m).__module__}.{type(m).__name__}", problems, f"; supported: {adapter.family} with timm Mlp / "
               "SwiGLU / GluMlp, ungated attention, a Linear head")

    # ------------------------------------------------------------------ recording
    def record_block(self, rec: ActivationRecorder, layer: int, layer_outputs: bool) -> None:
        """The block's rule inputs (``layer_outputs``: also the outputs of the MLP's input projections, for rule
        sets whose Linear rule reads them) and the family's (:meth:`record_block_extra`)."""
        block = self.adapter.blocks[layer]
        attn, mlp = block.attn, block.mlp
        self.adapter.recording.block_input(rec, layer, ("x", layer))
        rec.output(block.norm1, ("qkv_in", layer))
        for name in ("q", "k", "v"):
            projection = getattr(attn, f"{name}_proj", None)
            if projection is not None:
                rec.output(projection, (name, layer))
        if hasattr(attn, "norm"):
            rec.input(attn.norm, ("ctx", layer))
        rec.input(attn.proj, ("proj_in", layer))
        rec.output(attn, ("attn_out", layer))
        rec.output(block.norm2, ("mlp_in", layer))
        if layer_outputs:
            for name in ("fc1", "fc1_x"):
                if hasattr(mlp, name):
                    rec.output(getattr(mlp, name), ("fc1_out", layer))
            if hasattr(mlp, "fc1_g"):
                rec.output(mlp.fc1_g, ("gate_out", layer))
        rec.input(mlp.fc2, ("fc2_in", layer))
        rec.output(mlp, ("mlp_out", layer))
        self.record_block_extra(rec, layer)

    def record_head(self, rec: ActivationRecorder, layer_outputs: bool) -> None:
        rec.input(self.adapter.classifier(), "head_in")
        rec.output(self.adapter.final_norm(), "norm_out")

    def record_input(self, rec: ActivationRecorder) -> None:
        record_timm_input(rec, self.adapter)

    def record_block_extra(self, rec: ActivationRecorder, layer: int) -> None:
        pass

    # ------------------------------------------------------------------ family parts
    def rotated(self, acts, layer: int, q: Tensor, k: Tensor, v: Tensor):
        """``q``, ``k`` (``[B, H, N, d]``) as the attention logits read them."""
        return q, k

    def logit_bias(self, layer: int) -> Optional[Tensor]:
        """The additive constant of the attention logits (broadcastable to ``[B, H, N, N]``), or ``None``."""
        return None

    # ------------------------------------------------------------------ relevance pass
    @torch.no_grad()
    def head_relprop(self, rules, acts, relevance_logits: Tensor) -> Tensor:
        """Relevance at the output of the final ``norm`` (``[B, N, D]``): head Linear, ``fc_norm`` and
        ``head_drop`` identity, then the read-out."""
        r = rules["linear"](acts["head_in"], self.adapter.classifier().weight, relevance_logits)
        content = slice(self.adapter.num_prefix_tokens, None)
        return readout_relprop(rules, acts["norm_out"], r, self.adapter.readout.kind, content)

    def mlp_relprop(self, rules, acts, layer: int, relevance: Tensor) -> Tensor:
        """From the MLP's output to its input (``norm2``'s output)."""
        mlp: Any = self.adapter.blocks[layer].mlp

        def get(key):
            return acts.get((key, layer))

        r = rules["linear"](get("fc2_in"), mlp.fc2.weight, relevance, get("mlp_out"), mlp.fc2.bias)
        kind = type(mlp).__name__
        if kind == "Mlp":
            return rules["linear"](get("mlp_in"), mlp.fc1.weight, r, get("fc1_out"), mlp.fc1.bias)
        if kind == "SwiGLU":
            return gated_product_relprop(rules, get("mlp_in"), r, mlp.fc1_g, acts.pop(("gate_out", layer), None),
                                         mlp.fc1_x, get("fc1_out"))
        return gated_product_relprop(rules, get("mlp_in"), r, mlp.fc1, get("fc1_out"))

    @torch.no_grad()
    def block_relprop(self, rules, acts, layer: int, relevance: Tensor, need_below: bool):
        """Relevance through block ``layer``: ``(R at the block input or None, R_A [B, H, N, N])``."""
        block: Any = self.adapter.blocks[layer]
        attn = block.attn

        def get(key):
            return acts.get((key, layer))

        x, a, m_out = get("x"), get("attn_out"), get("mlp_out")
        a_scaled = a if block.gamma_1 is None else block.gamma_1 * a
        m_scaled = m_out if block.gamma_2 is None else block.gamma_2 * m_out
        h = x + a_scaled
        r_h, r_m = rules["add"](h, m_scaled, relevance)        # layer scale: relevance unchanged
        r_h = rules["clone"](h, [r_h, self.mlp_relprop(rules, acts, layer, r_m)])
        r_x, r_a = rules["add"](x, a_scaled, r_h)
        proj_in = get("proj_in")
        r_ctx = rules["linear"](proj_in, attn.proj.weight, r_a, a, attn.proj.bias)   # sub-LN (attn.norm): identity
        ctx = acts.pop(("ctx", layer), None)                  # A @ v before the sub-LN (no sub-LN: proj_in)
        ctx = proj_in if ctx is None else ctx
        batch, tokens = x.shape[:2]
        heads = int(attn.num_heads)

        def heads_first(t: Tensor) -> Tensor:                  # [B, N, H*d] -> [B, H, N, d]
            return t.reshape(batch, tokens, heads, -1).transpose(1, 2)

        def merged(t: Tensor) -> Tensor:                       # [B, H, N, d] -> [B, N, H*d]
            return t.transpose(1, 2).reshape(batch, tokens, -1)

        x_in = get("qkv_in")
        fused = getattr(attn, "qkv", None) is not None
        if fused:
            qkv = qkv_projection(attn, x_in)
            q, k, v = qkv.reshape(batch, tokens, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        else:
            q, k, v = heads_first(get("q")), heads_first(get("k")), heads_first(get("v"))
        q_read, k_read = self.rotated(acts, layer, q, k, v)
        bias = self.logit_bias(layer)
        d = q.shape[-1]
        r_attn, r_q, r_k, r_v = attention_relprop(rules, q_read, k_read, v, get("attn"), heads_first(r_ctx),
                                                  need_qk=need_below, ctx=heads_first(ctx), mask=bias,
                                                  scale=float(d) ** 0.5, mask_add=bias is not None)
        if not need_below:
            return None, r_attn
        # rotary embedding and q/k norms: relevance passes coordinate-wise to the projections' outputs
        if fused:
            r_qkv = torch.stack([merged(r) for r in (r_q, r_k, r_v)], dim=2).reshape(batch, tokens, -1)
            r_in = rules["linear"](x_in, attn.qkv.weight, r_qkv, qkv, qkv_bias(attn))
        else:
            r_in = rules.linear_shared(x_in, [
                (attn.q_proj.weight, merged(r_q), get("q"), attn.q_proj.bias),
                (attn.k_proj.weight, merged(r_k), get("k"), attn.k_proj.bias),
                (attn.v_proj.weight, merged(r_v), get("v"), attn.v_proj.bias)])
        return rules["clone"](x, [r_x, r_in]), r_attn

    @torch.no_grad()
    def input_relprop(self, rules, acts, relevance: Tensor) -> Tensor:
        """:func:`~methods.families.timm_vit.topology.timm_input_relprop`: ``[B, 3, H, W]``."""
        return timm_input_relprop(rules, self.adapter, acts, relevance)


@register_topology(TimmEvaAdapter)
class TimmEvaTopology(_BeitLikeTopology):
    """Relevance pass over a stock timm ``Eva`` (see the module docstring): q/k norms and the rotary embedding
    between the projections and the attention logits."""

    def record_block_extra(self, rec: ActivationRecorder, layer: int) -> None:
        def keep_rotary(_module, _args, kwargs):
            if kwargs.get("rope") is not None:
                rec.outputs[("rope", layer)] = kwargs["rope"]

        rec._handles.append(self.adapter.blocks[layer].attn.register_forward_pre_hook(keep_rotary, with_kwargs=True))

    def rotated(self, acts, layer: int, q: Tensor, k: Tensor, v: Tensor):
        from timm.layers import apply_rot_embed_cat

        attn: Any = self.adapter.blocks[layer].attn
        q, k = attn.q_norm(q), attn.k_norm(k)
        rope = acts.pop(("rope", layer), None)
        if rope is None:
            return q, k
        npt, half = int(attn.num_prefix_tokens), bool(getattr(attn, "rotate_half", False))
        q = torch.cat([q[:, :, :npt], apply_rot_embed_cat(q[:, :, npt:], rope, half=half)], dim=2).type_as(v)
        k = torch.cat([k[:, :, :npt], apply_rot_embed_cat(k[:, :, npt:], rope, half=half)], dim=2).type_as(v)
        return q, k


@register_topology(TimmBeitAdapter)
class TimmBeitTopology(_BeitLikeTopology):
    """Relevance pass over a stock timm ``Beit`` (see the module docstring): the relative position bias (the
    block's own and the model's shared one) in the Add rule of the attention logits."""

    def logit_bias(self, layer: int) -> Optional[Tensor]:
        attn: Any = self.adapter.blocks[layer].attn
        bias = attn._get_rel_pos_bias() if attn.relative_position_bias_table is not None else None
        shared_module = self.adapter.shared_relative_position_bias()
        if shared_module is not None:
            shared = shared_module()
            bias = shared if bias is None else bias + shared
        return bias
