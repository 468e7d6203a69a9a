"""Adapter for stock ``transformers`` ``DebertaV2ForSequenceClassification`` (DeBERTa-v2 and DeBERTa-v3).

Blocks are called as ``DebertaV2Encoder.forward`` calls them: the mask ``[B, 1, N, N]`` of
``encoder.get_attention_mask``, the relative positions of ``encoder.get_rel_pos`` and the (normalised) relative
embeddings of ``encoder.get_rel_embedding``, so the disentangled attention (content scores plus the c2p / p2c
position terms, scale ``1 / sqrt(d * scale_factor)``, ``position_buckets``, ``share_att_key``) is the model's own
and the logits are bit-identical. Token ablation turns a token into padding (its relative distances kept); the
design decisions are in ``NOTES.md``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Hashable, Optional, Tuple

import torch
from torch import Tensor, nn
from transformers.activations import ACT2FN

from ...adapters.base import (
    AttentionEdit,
    AttentionLinears,
    BlockLinears,
    ModelInputs,
    SequenceContext,
    register_adapter,
)
from ...adapters.capability import Capability
from ...adapters.gradient_rules import apply_identity_rule
from ...adapters.recorder import ActivationRecorder
from ..hf_text.adapter import HFTextAdapter, TextDecomposition, TextInputs, TextRecording
from .score_edit import deberta_score_edit


@register_adapter
class HFDebertaV2Adapter(HFTextAdapter):
    """``DebertaV2ForSequenceClassification``: ``DebertaV2Layer`` blocks (post-norm, ``query_proj`` /
    ``key_proj`` / ``value_proj``, disentangled relative attention); head: ``ContextPooler`` (dropout,
    ``dense`` on ``h[:, 0]``, ``pooler_hidden_act``), dropout, ``classifier``. Inputs and layout as
    :class:`~methods.families.hf_text.adapter.HFTextAdapter`; token-type ids only where ``type_vocab_size > 0``;
    AttnLRP / CP-LRP's rule map is BERT's (``TextRules``: the word embeddings as the input embedding)."""

    family = "transformers DebertaV2ForSequenceClassification"
    model_class = "DebertaV2ForSequenceClassification"
    base_attr = "deberta"

    @classmethod
    def supports(cls, model: nn.Module) -> Optional[str]:
        reason = super().supports(model)
        if reason is not None:
            return reason
        base: Any = model.deberta
        if base.encoder.conv is not None:
            return "DebertaV2ForSequenceClassification with a ConvLayer after block 0 (conv_kernel_size > 0)"
        if base.z_steps > 1:
            return "DebertaV2ForSequenceClassification with z_steps > 1 (the enhanced mask decoder's re-runs)"
        return None

    @property
    def uses_token_types(self) -> bool:   # type: ignore[override]
        return int(self.model.config.type_vocab_size) > 0

    # ------------------------------------------------------------------ forward pieces (the model's own order)
    def embeddings(self, inputs: ModelInputs) -> Tensor:
        """``DebertaV2Embeddings`` (word (+ absolute position where ``position_biased_input``) (+ token type),
        ``embed_proj``, LayerNorm, times the mask, dropout), as ``DebertaV2Model.forward`` calls it."""
        return self.base.embeddings(input_ids=inputs["input_ids"], token_type_ids=inputs.tensors.get("token_type_ids"),
                                    mask=inputs["attention_mask"])

    def run_blocks(self, hidden: Tensor, context: SequenceContext, start: int = 0,
                   stop: Optional[int] = None) -> Tensor:
        """Blocks ``start:stop`` with the encoder's own mask, relative positions and relative embeddings; each
        block returns its attention probabilities too (``recording.attention`` reads them)."""
        blocks = self.blocks[start:stop]
        if not blocks:
            return hidden
        encoder = self.base.encoder
        mask = context.attention_mask
        if mask is None:
            mask = torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)
        attention_mask = encoder.get_attention_mask(mask.to(hidden.device))
        relative_pos = encoder.get_rel_pos(hidden)
        rel_embeddings = encoder.get_rel_embedding()
        for block in blocks:
            hidden, _ = block(hidden, attention_mask, relative_pos=relative_pos, rel_embeddings=rel_embeddings,
                              output_attentions=True)
        return hidden

    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """``ContextPooler.forward`` step by step (its activation is no submodule: the identity rule through
        :attr:`rule_map`'s ``head_epsilon``), dropout, ``classifier`` (``pre_logits``: the classifier's input)."""
        pooler = self.model.pooler
        pooled = pooler.dense(pooler.dropout(hidden[:, 0]))
        pooled = apply_identity_rule(ACT2FN[pooler.config.pooler_hidden_act], pooled, self.rule_map.head_epsilon)
        pooled = self.model.dropout(pooled)
        return pooled if pre_logits else self.model.classifier(pooled)

    def head_linears(self) -> Tuple[nn.Linear, ...]:
        return self.model.pooler.dense, self.model.classifier

    # ------------------------------------------------------------------ where methods hook
    def linears(self, layer: int) -> BlockLinears:
        block = self.blocks[layer]
        attention, own = block.attention, block.attention.self
        return BlockLinears(AttentionLinears(out=attention.output.dense, q=own.query_proj, k=own.key_proj,
                                             v=own.value_proj), (block.intermediate.dense, block.output.dense))

    recording = Capability(lambda adapter: DebertaRecording(adapter))
    inputs = Capability(lambda adapter: DebertaInputs(adapter))

    decomposition = Capability(lambda adapter: DebertaDecomposition(adapter))


class DebertaInputs(TextInputs):
    """BERT's inputs; a removed position becomes padding (relative distances kept)."""

    adapter: "HFDebertaV2Adapter"

    def normalises_word_embeddings_alone(self) -> bool:
        """DeBERTa-v2/v3's embeddings are ``LayerNorm(word (+ position if position_biased_input) (+ token type if
        type_vocab_size))``; v3 adds neither."""
        config = self.adapter.model.config
        return not config.position_biased_input and int(config.type_vocab_size) == 0

    def drop_positions(self, hidden: Tensor, context: SequenceContext,
                       removed: Tensor) -> Tuple[Tensor, SequenceContext]:
        """``len(removed) * B`` sequences (sample-major), each with one position of ``removed`` turned into
        padding rather than cut out: every block masks it as a key, and each kept token keeps its relative
        distances to every other kept token as in the full input (cutting would shift them by one across the
        removed token; measured in ``NOTES.md``)."""
        batch, r = hidden.shape[0], len(removed)
        mask = context.attention_mask
        mask = torch.ones(hidden.shape[:2], dtype=torch.long) if mask is None else mask.long()
        mask = mask.to(hidden.device).repeat_interleave(r, dim=0)     # sample-major, as the hidden states
        mask[torch.arange(batch * r, device=hidden.device), removed.to(hidden.device).repeat(batch)] = 0
        return hidden.repeat_interleave(r, dim=0), SequenceContext(attention_mask=mask)


class DebertaDecomposition(TextDecomposition):
    """BERT's post-norm decomposition of the blocks; DecompX (issue 37) is not carried to this family: its
    reference decomposes BERT and RoBERTa only."""

    decomposes_network = False

    def record_block_output(self, rec: ActivationRecorder, layer: int, key: Hashable,
                            transform: Optional[Callable[[Tensor], Any]] = None) -> None:
        """The hidden states of the block's ``(hidden, probabilities)`` output."""
        rec.output(self.adapter.blocks[layer], key, transform=transform, index=0)


class DebertaScoreEdit(AttentionEdit):
    """The disentangled attention is DeBERTa's own code: the full score ``c2c + c2p + p2c`` recomputed by a hook
    and the edited probabilities handed on at the attention's dropout (:mod:`.score_edit`)."""

    def __call__(self, edit: Callable[[int, Tensor], Tensor]) -> contextlib.AbstractContextManager[None]:
        """Every block's disentangled attention (``attention.self``) with its scores edited
        (:func:`~methods.families.hf_deberta.score_edit.deberta_score_edit`), hooks removed on exit."""
        return deberta_score_edit([block.attention.self for block in self.adapter.blocks], edit)


class DebertaRecording(TextRecording):
    """A text encoder's recording whose scores are edited in DeBERTa's own attention."""

    score_edit = Capability(lambda recording: DebertaScoreEdit(recording.adapter))
