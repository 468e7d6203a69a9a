"""Adapter for stock ``timm.models.beit.Beit`` classifiers (BEiT, BEiT v2).

``Beit.forward_features`` in order: ``patch_embed``, [CLS] concatenated, ``+ pos_embed`` (when
``use_abs_pos_emb``), ``pos_drop``, the shared relative position bias ``rel_pos_bias()`` (when
``use_shared_rel_pos_bias``), the blocks (each called with it), ``norm``; then ``forward_head``: pooling
(``'avg'``: the mean of the patch tokens, the default; ``'token'``: [CLS]), ``fc_norm`` (with ``'avg'``),
``head_drop``, ``head``. The adapter calls exactly these, so its logits are the model's.

Design notes: ``NOTES.md`` beside this file (beit.py).
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

import torch
from torch import Tensor, nn

from ...adapters.base import AttentionEdit, ModelInputs, SequenceContext, register_adapter
from ...adapters.capability import Capability
from ...adapters.library import class_problem
from .adapter import EvaBeitRecording, TimmBeitLikeAdapter
from .score_edit import eva_beit_score_edit


@register_adapter
class TimmBeitAdapter(TimmBeitLikeAdapter):
    """Stock timm ``Beit``: see the module docstring; read-out ``"mean_content"`` (``global_pool='avg'``) or
    ``"class_token"`` (``'token'``); layout: the patch grid after [CLS], which is not scored."""

    family = "timm Beit"

    recording = Capability(lambda adapter: BeitRecording(adapter))

    @classmethod
    def supports(cls, model: nn.Module) -> Optional[str]:
        return class_problem(model, "timm.models.beit", "Beit") or cls.pool_problem(model)

    def shared_relative_position_bias(self) -> Optional[nn.Module]:
        """The model's relative position bias shared by all blocks (``rel_pos_bias``), ``None`` without one."""
        return self.model.rel_pos_bias

    # ------------------------------------------------------------------ forward pieces (the model's own order)
    def embed(self, inputs: ModelInputs) -> Tensor:
        """``patch_embed``, [CLS], ``+ pos_embed`` (if any), ``pos_drop``."""
        m = self.model
        x = m.patch_embed(inputs["pixel_values"])
        x = torch.cat((m.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        if m.pos_embed is not None:
            x = x + m.pos_embed
        return m.pos_drop(x)

    def shared_bias(self, hidden: Tensor, context: SequenceContext) -> Optional[Tensor]:
        """What the blocks receive as ``shared_rel_pos_bias``: the model's shared relative position bias
        (``[H, N, N]``, or ``None``), plus ``-inf`` at the keys removed by :meth:`EvaBeitInputs.drop_positions`
        (``[B, H or 1, N, N]``)."""
        m = self.model
        shared = m.rel_pos_bias() if m.rel_pos_bias is not None else None
        keys = self.key_mask_of(context, hidden)
        if keys is None:
            return shared
        removed = torch.zeros(keys.shape, dtype=hidden.dtype, device=hidden.device).masked_fill_(~keys, float("-inf"))
        return removed if shared is None else shared + removed

    def run_blocks(self, hidden: Tensor, context: SequenceContext, start: int = 0,
                   stop: Optional[int] = None) -> Tensor:
        blocks = self.blocks[start:stop]
        if not blocks:
            return hidden
        shared = self.shared_bias(hidden, context)
        for block in blocks:
            hidden = block(hidden, shared_rel_pos_bias=shared)
        return hidden


class BeitScoreEdit(AttentionEdit):
    """BEiT's scores recomputed and the edit handed to its attention through ``shared_rel_pos_bias``."""

    @contextlib.contextmanager
    def __call__(self, edit: Callable[[int, Tensor], Tensor]) -> Iterator[None]:
        """Fused attention off; each block's scores recomputed from its attention input and the edit handed to
        the attention through ``shared_rel_pos_bias`` (the relative position biases inside ``S``)
        (:mod:`methods.families.timm_eva_beit.score_edit`), hooks removed on exit."""
        with self.adapter.recording.eager_attention(), eva_beit_score_edit(self.adapter.blocks, edit,
                                                                           "shared_rel_pos_bias"):
            yield


class BeitRecording(EvaBeitRecording):
    """BEiT's recording, its scores edited through its attention."""

    score_edit = Capability(lambda recording: BeitScoreEdit(recording.adapter))
