"""Adapter for stock Hugging Face ``transformers`` ``ModernBertForSequenceClassification`` (ModernBERT, Warner et
al. 2024): token embeddings, LayerNorm; pre-norm blocks ``x + Wo(attn(attn_norm(x)))`` (block 0's ``attn_norm``
is ``nn.Identity``), ``h + Wo(act(in) * gate)`` with ``in | gate = Wi(mlp_norm(h))`` (GeGLU); rotary positions
applied inside the attention; full-attention and local (sliding-window) layers by ``config.layer_types``; final
norm; pooling ``classifier_pooling`` (``"cls"``: position 0; ``"mean"``: the mean over the real tokens), the
``ModernBertPredictionHead`` (``norm(act(dense(x)))``), dropout, ``classifier``.

The adapter calls the model's own submodules in ``ModernBertModel.forward``'s order, so its logits are the model's;
the masks and rotary embeddings are built from the position ids it carries in the :class:`SequenceContext`, so a
position dropped by token ablation leaves the others their rotary angles and their windows. What it shares with
the BERT-like encoders (token inputs, layout, embedding scale) it takes from :class:`HFTextAdapter`. Notes:
``NOTES.md``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, Optional, Tuple

import torch
from torch import Tensor, nn

from ...adapters.base import (
    AttentionLinears,
    BlockDecomposition,
    BlockLinears,
    ModelInputs,
    RawInputs,
    ReadOut,
    SampleIds,
    SequenceContext,
    TokenFlow,
    register_adapter,
)
from ...adapters.capability import Capability
from ...adapters.recorder import ActivationRecorder
from ..hf_decoder.adapter import unmask_padding_queries
from ..hf_text.adapter import HFTextAdapter, TextInputs, TextRecording
from .rules import ModernBertRules

#: the position ids a batch carries (``arange(N)``, as the model counts them)
POSITION_IDS = "position_ids"
FULL, SLIDING = "full_attention", "sliding_attention"
POOLINGS = {"cls": "class_token", "mean": "weighted"}


def window_function(position_ids: Tensor, half_window: int) -> Callable[..., Tensor]:
    """The sliding-window mask function of ``transformers.masking_utils`` on position ids rather than indices:
    query and key attend when ``|pos_q - pos_k| <= half_window`` (the model's window when ids are ``arange``)."""
    def inner(batch_idx: Tensor, head_idx: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        ids = position_ids.to(q_idx.device)
        return (ids[batch_idx, q_idx] - ids[batch_idx, kv_idx]).abs() <= half_window
    return inner


@register_adapter
class HFModernBertAdapter(HFTextAdapter):
    """Stock ``transformers`` ``ModernBertForSequenceClassification`` (see the module docstring).

    Inputs and layout as :class:`HFTextAdapter`'s (no token types), right padding only (the model's positions are
    ``arange(N)``). Read-out: ``"class_token"`` with ``"cls"`` pooling; ``"weighted"`` with ``"mean"`` pooling (each
    real token ``1 / length``, special tokens included).
    """

    family = "transformers ModernBertForSequenceClassification"
    model_class = "ModernBertForSequenceClassification"
    base_attr = "model"
    uses_token_types = False
    rule_map = Capability(ModernBertRules)

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.config: Any = self.base.config

    @staticmethod
    def layers_of(base: Any) -> Any:
        return base.layers

    @classmethod
    def supports(cls, model: nn.Module) -> Optional[str]:
        reason = super().supports(model)                 # HFTextAdapter's: the class, then not a decoder
        pooling = getattr(getattr(model, "config", None), "classifier_pooling", None)
        if reason is None and pooling not in POOLINGS:
            return f"classifier_pooling {pooling!r} (need one of {sorted(POOLINGS)})"
        return reason

    @classmethod
    def signature_of(cls, model: Any) -> tuple:
        return super().signature_of(model) + (model.config.classifier_pooling,)

    # ------------------------------------------------------------------ structure
    #: isotropic: ``config.hidden_size`` wide (the fused ``Wqkv`` names no query projection)
    token_flow = Capability(lambda adapter: TokenFlow(adapter, int(adapter.config.hidden_size),
                                                      adapter.num_heads_of(adapter.model.config)))

    #: ``classifier_pooling``'s: [CLS], or the mean of the real tokens (:meth:`readout_weights`)
    readout: Capability[ReadOut] = Capability(lambda adapter: ReadOut(
        adapter, POOLINGS[adapter.config.classifier_pooling], None, adapter.readout_weights))

    def final_norm(self) -> nn.Module:
        return self.base.final_norm

    def head_linears(self) -> Tuple[nn.Linear, nn.Linear]:
        """The Linear layers after the pooling: the prediction head's ``dense`` and the ``classifier``."""
        return self.model.head.dense, self.model.classifier

    def self_attention(self, layer: int) -> nn.Module:
        return self.blocks[layer].attn

    def attention_norm(self, layer: int) -> nn.Module:
        """``mlp_norm``: the norm whose output the MLP reads."""
        return self.blocks[layer].mlp_norm

    def layer_type(self, layer: int) -> str:
        return str(self.config.layer_types[layer])

    def readout_weights(self, inputs: ModelInputs, layout: Any) -> Tensor:
        """Mean pooling: ``1 / length`` at each real token (special tokens included), 0 at padding."""
        mask = inputs["attention_mask"].to(inputs.score_dtype)
        return mask / mask.sum(dim=-1, keepdim=True)

    # ------------------------------------------------------------------ forward pieces (the model's own order)
    def embeddings(self, inputs: ModelInputs) -> Tensor:
        """``drop(norm(tok_embeddings(ids)))`` (no positions: they are rotary)."""
        return self.base.embeddings(input_ids=inputs["input_ids"])

    def position_ids(self, hidden: Tensor, context: SequenceContext) -> Tensor:
        ids = context.position_ids
        if ids is None:
            return torch.arange(hidden.shape[1], device=hidden.device).expand(hidden.shape[0], -1)
        return ids.to(hidden.device)

    def layer_masks(self, hidden: Tensor, context: SequenceContext, position_ids: Tensor) -> Dict[str, Any]:
        """The full and sliding-window masks in the form of the current attention implementation, built by the
        model's own ``create_bidirectional_mask``; the window is read on the position ids (:func:`window_function`);
        each padding query may attend to itself (:func:`unmask_padding_queries`: a padding query with no real key
        in its window otherwise gets a row of ``-inf`` in the float32 softmax of the eager attention, NaN)."""
        from transformers.masking_utils import create_bidirectional_mask

        mask = context.attention_mask
        mask = None if mask is None else mask.to(hidden.device)
        window = window_function(position_ids, int(self.config.sliding_window))
        masks = {FULL: create_bidirectional_mask(config=self.config, inputs_embeds=hidden, attention_mask=mask),
                 SLIDING: create_bidirectional_mask(config=self.config, inputs_embeds=hidden, attention_mask=mask,
                                                    and_mask_function=window)}
        return masks if mask is None else {kind: unmask_padding_queries(m, mask) for kind, m in masks.items()}

    def run_blocks(self, hidden: Tensor, context: SequenceContext, start: int = 0,
                   stop: Optional[int] = None) -> Tensor:
        indices = list(range(len(self.blocks)))[start:stop]
        if not indices:
            return hidden
        position_ids = self.position_ids(hidden, context)
        masks = self.layer_masks(hidden, context, position_ids)
        kinds = {self.layer_type(i) for i in indices}
        rotary = {kind: self.base.rotary_emb(hidden, position_ids, kind) for kind in kinds}
        for i in indices:
            kind = self.layer_type(i)
            hidden = self.blocks[i](hidden, attention_mask=masks[kind], position_embeddings=rotary[kind])
        return hidden

    def pool(self, hidden: Tensor, context: SequenceContext) -> Tensor:
        """The final norm, then position 0 (``"cls"``) or the mean over the real tokens (``"mean"``), as the model."""
        hidden = self.final_norm()(hidden)
        if self.readout.kind == "class_token":
            return hidden[:, 0]
        mask = context.attention_mask
        if mask is None:
            mask = torch.ones(hidden.shape[:2], device=hidden.device, dtype=torch.bool)
        mask = mask.to(hidden.device)
        return (hidden * mask.unsqueeze(-1)).sum(dim=1) / mask.sum(dim=1, keepdim=True)

    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """Pooling, ``ModernBertPredictionHead``, dropout, ``classifier`` (``pre_logits``: the classifier's input)."""
        pooled = self.model.drop(self.model.head(self.pool(hidden, context)))
        return pooled if pre_logits else self.model.classifier(pooled)

    # ------------------------------------------------------------------ where methods hook
    recording = Capability(lambda adapter: ModernBertRecording(adapter))
    inputs = Capability(lambda adapter: ModernBertInputs(adapter))

    def linears(self, layer: int) -> BlockLinears:
        """The attention's ``Wqkv`` and ``Wo``; the MLP's ``Wi`` (both halves: ``in | gate``) and ``Wo``."""
        attn, mlp = self.blocks[layer].attn, self.blocks[layer].mlp
        return BlockLinears(AttentionLinears(out=attn.Wo, qkv=attn.Wqkv), (mlp.Wi, mlp.Wo))

    decomposition = Capability(lambda adapter: ModernBertDecomposition(adapter))


class ModernBertInputs(TextInputs):
    """BERT's inputs, right padding only, with the position ids ``arange(N)`` that the rotary blocks read."""

    adapter: "HFModernBertAdapter"

    def normalises_word_embeddings_alone(self) -> bool:
        """ModernBERT's embeddings are ``norm(tok_embeddings(ids))``: rotary positions, no token types."""
        return True

    def prepare(self, inputs: RawInputs, sample_ids: SampleIds = None) -> ModelInputs:
        """As :meth:`TextInputs.prepare`, right padding only, plus the position ids ``arange(N)``."""
        prepared = super().prepare(inputs, sample_ids)
        mask = prepared["attention_mask"]
        if bool((mask[:, 1:] > mask[:, :-1]).any()):
            raise ValueError("attention_mask: every sample must be padded on the right only (ModernBERT's positions "
                             "are arange(N))")
        shape = mask.shape
        return prepared.with_tensors(**{POSITION_IDS: torch.arange(shape[1], device=mask.device).expand(shape)})

    def context(self, inputs: ModelInputs) -> SequenceContext:
        return SequenceContext(attention_mask=inputs["attention_mask"], position_ids=inputs[POSITION_IDS])


class ModernBertDecomposition(BlockDecomposition):
    """Pre-norm: ``attn_norm`` (block 0: an ``nn.Identity``, whose values are the embeddings' own), ``mlp_norm``
    (its input ``x + Wo(attention)``); DecompX (issue 37): pre-norm blocks and a gated MLP (GLU), outside the
    reference's decomposition."""

    norm_names = ("attn_norm", "mlp_norm")


class ModernBertRecording(TextRecording):
    """ModernBERT's values (the last third of ``Wqkv``) and pre-norm attention input."""

    def values(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        """The value third of ``Wqkv``'s output ``[B, N, D]``."""
        width = self.adapter.token_flow.width
        rec.output(self.adapter.blocks[layer].attn.Wqkv, key, transform=lambda qkv: qkv[..., 2 * width:])

    def attention_input(self, rec: ActivationRecorder, layer: int, key: Hashable,
                        require_grad: bool = False) -> None:
        """``attn_norm``'s output (block 0: its ``nn.Identity``, the embedding output)."""
        rec.output(self.adapter.blocks[layer].attn_norm, key, require_grad=require_grad)
