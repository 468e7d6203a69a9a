r"""Adapter for stock ``timm.models.eva.Eva`` classifiers: EVA and EVA-02 (and timm's other ``Eva``-built ViTs
with the same parts).

``Eva.forward_features`` in order: ``patch_embed``, ``_pos_embed`` ([CLS] and register tokens, the absolute
position embedding when ``use_abs_pos_emb``; it also returns the rotary embedding), ``norm_pre``, the
``EvaBlock``\ s (each called with the rotary embedding; per block with ``rope_type='mixed'``), ``norm``; then
``forward_head``: pooling (``'token'``: [CLS]; ``'avg'``: the mean of the tokens after the prefix), ``fc_norm``,
``head_drop``, ``head``. The adapter calls exactly these, so its logits are the model's.

Design notes: ``NOTES.md`` beside this file (eva.py).
"""
from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any, Callable, Iterator, Optional

import torch.nn.functional as F
from torch import Tensor

from ...adapters.base import (
    AttentionEdit,
    AttentionLinears,
    BlockLinears,
    ModelInputs,
    SequenceContext,
    register_adapter,
)
from ...adapters.capability import Capability
from ...adapters.library import class_problem
from .adapter import EvaBeitRecording, TimmBeitLikeAdapter, attention_width, qkv_projection
from .score_edit import eva_beit_score_edit


@register_adapter
class TimmEvaAdapter(TimmBeitLikeAdapter):
    """Stock timm ``Eva`` (EVA, EVA-02): see the module docstring; read-out ``"class_token"`` (``global_pool=
    'token'``) or ``"mean_content"`` (``'avg'``); layout: the patch grid after ``num_prefix_tokens`` prefix tokens
    ([CLS], registers), which are not scored."""

    family = "timm Eva"

    recording = Capability(lambda adapter: EvaRecording(adapter))

    @classmethod
    def supports(cls, model: Any) -> Optional[str]:
        problem = class_problem(model, "timm.models.eva", "Eva") or cls.pool_problem(model)
        if problem is not None:
            return problem
        if getattr(model, "dynamic_img_size", False):
            return "timm Eva with dynamic_img_size is not supported"
        from timm.models.eva import EvaAttention, EvaBlock

        for i, block in enumerate(model.blocks):
            if type(block) is not EvaBlock:
                return f"timm Eva block {i} is {type(block).__name__} (need the pre-norm EvaBlock)"
            if type(block.attn) is not EvaAttention:
                return f"timm Eva block {i} attention is {type(block.attn).__name__} (need EvaAttention)"
        return None

    # ------------------------------------------------------------------ forward pieces (the model's own order)
    def embed(self, inputs: ModelInputs) -> Tensor:
        """``patch_embed``, ``_pos_embed`` (prefix tokens, absolute positions; its rotary embedding is
        :meth:`rotary_embedding`'s), ``norm_pre``."""
        m = self.model
        x = m.patch_embed(inputs["pixel_values"])
        x, _ = m._pos_embed(x)
        return m.norm_pre(x)

    def rotary_embedding(self) -> Optional[Tensor]:
        """The rotary embedding the blocks read (``None`` without one), as ``Eva._pos_embed`` gets it."""
        rope = self.model.rope
        if rope is None:
            return None
        if hasattr(rope, "feat_shape"):
            return rope.get_embed()
        return rope.get_embed(shape=self.model.patch_embed.grid_size)

    def block_rotary(self, rotary: Optional[Tensor], layer: int) -> Optional[Tensor]:
        """Block ``layer``'s share of :meth:`rotary_embedding` (``rope_type='mixed'``: one per block)."""
        if rotary is not None and getattr(self.model, "rope_mixed", False):
            return rotary[layer]
        return rotary

    def run_blocks(self, hidden: Tensor, context: SequenceContext, start: int = 0,
                   stop: Optional[int] = None) -> Tensor:
        indices = list(range(len(self.blocks)))[start:stop]
        if not indices:
            return hidden
        rotary = self.rotary_embedding()
        mask = self.key_mask_of(context, hidden)
        for i in indices:
            hidden = self.blocks[i](hidden, rope=self.block_rotary(rotary, i), attn_mask=mask)
        return hidden

    # ------------------------------------------------------------------ where methods hook
    def value_projection(self, layer: int, x: Tensor) -> Tensor:
        attn: Any = self.blocks[layer].attn
        if attn.qkv is None:     # separate projections: v_proj's function (its module hooks do not fire twice)
            return F.linear(x, attn.v_proj.weight, attn.v_proj.bias)
        width = attention_width(attn)
        return qkv_projection(attn, x)[..., 2 * width:3 * width]

    def linears(self, layer: int) -> BlockLinears:
        """BEiT's, with separate ``q_proj``, ``k_proj``, ``v_proj`` where the attention has no fused ``qkv``."""
        found = super().linears(layer)
        attn: Any = self.blocks[layer].attn
        if attn.qkv is None:
            separate = AttentionLinears(out=attn.proj, q=attn.q_proj, k=attn.k_proj, v=attn.v_proj)
            return replace(found, attention=separate)
        return found


class EvaScoreEdit(AttentionEdit):
    """EVA's scores recomputed and the edit handed to its attention through ``attn_mask``."""

    @contextlib.contextmanager
    def __call__(self, edit: Callable[[int, Tensor], Tensor]) -> Iterator[None]:
        """Fused attention off; each block's scores recomputed from its attention input and the edit handed to
        the attention through ``attn_mask`` (rotary ``q``, ``k`` recomputed)
        (:mod:`methods.families.timm_eva_beit.score_edit`), hooks removed on exit."""
        with self.adapter.recording.eager_attention(), eva_beit_score_edit(self.adapter.blocks, edit, "attn_mask"):
            yield


class EvaRecording(EvaBeitRecording):
    """EVA's recording, its scores edited through its attention."""

    score_edit = Capability(lambda recording: EvaScoreEdit(recording.adapter))
