"""Adapter for stock Hugging Face ``transformers`` ``ModernBertForSequenceClassification`` (ModernBERT, Warner et
al. 2024): token embeddings, LayerNorm; pre-norm blocks ``x + Wo(attn(attn_norm(x)))`` (block 0's ``attn_norm``
is ``nn.Identity``), ``h + Wo(act(in) * gate)`` with ``in | gate = Wi(mlp_norm(h))`` (GeGLU); rotary positions
applied inside the attention; full-attention and local (sliding-window) layers by ``config.layer_types``; final
norm; pooling ``classifier_pooling`` (``"cls"``: position 0; ``"mean"``: the mean over the real tokens), the
``ModernBertPredictionHead`` (``norm(act(dense(x)))``), dropout, ``classifier``.

The adapter calls the model's own submodules in ``ModernBertModel.forward``'s order, so its logits are the model's;
the masks and rotary embeddings are built from the position ids it carries in the :class:`SequenceContext`, so a
position dropped by token ablation leaves the others their rotary angles and their windows. Notes: ``NOTES.md``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from ...adapters.base import (
    AttentionLinears,
    ModelInputs,
    RawInputs,
    SampleIds,
    SequenceContext,
    TokenSequence,
    check_sample_ids,
    register_adapter,
    scaled_copies,
)
from ...adapters.recorder import ActivationRecorder
from ...adapters.tokens import check_ids_like, check_token_inputs, special_positions
from ..hf_blocks import HFEncoderBlocks
from ..hf_decoder.adapter import unmask_padding_queries
from .rules import ModernBertRules

#: extra per-sample tensors set by the adapter: the position ids, and from :meth:`interpolate` the factor on the
#: embedding output
POSITION_IDS = "position_ids"
EMBEDDING_SCALE = "embedding_scale"
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
class HFModernBertAdapter(HFEncoderBlocks):
    """Stock ``transformers`` ``ModernBertForSequenceClassification`` (see the module docstring).

    Inputs: a mapping as a tokenizer returns it (``input_ids`` ``[B, N]``, ``attention_mask``, optional
    ``special_tokens_mask``; ``token_type_ids`` only all-zero), or an ``input_ids`` tensor; right padding only
    (the model's positions are ``arange(N)``). Layout: a :class:`TokenSequence` (special tokens from
    ``special_tokens_mask``, else position 0 and each sample's last real token). Read-out: ``"class_token"``
    with ``"cls"`` pooling; ``"weighted"`` with ``"mean"`` pooling (each real token ``1 / length``).
    """

    family = "transformers ModernBertForSequenceClassification"
    rule_map_class = ModernBertRules
    modality = "text"
    pre_norm = True
    layout_class = TokenSequence

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.config: Any = model.config
        self.base: Any = model.model
        self.blocks = list(self.base.layers)
        self.readout = POOLINGS[self.config.classifier_pooling]

    @classmethod
    def supports(cls, model: nn.Module) -> Optional[str]:
        import transformers

        model_class = getattr(transformers, "ModernBertForSequenceClassification", None)
        if model_class is None:
            return "this transformers has no ModernBertForSequenceClassification"
        if not isinstance(model, model_class):
            return f"{type(model).__name__} is not a transformers ModernBertForSequenceClassification"
        if model.config.classifier_pooling not in POOLINGS:
            return f"classifier_pooling {model.config.classifier_pooling!r} (need one of {sorted(POOLINGS)})"
        return None

    @classmethod
    def signature_of(cls, model: Any) -> tuple:
        return (len(model.model.layers), int(model.config.num_attention_heads), model.config.classifier_pooling)

    # ------------------------------------------------------------------ structure
    def final_norm(self) -> nn.Module:
        return self.base.final_norm

    def self_attention(self, layer: int) -> nn.Module:
        """The module returning ``(attn_output, attn_weights)``."""
        return self.blocks[layer].attn

    def layer_type(self, layer: int) -> str:
        return str(self.config.layer_types[layer])

    def readout_weights(self, inputs: ModelInputs, layout: Any) -> Tensor:
        """Mean pooling: ``1 / length`` at each real token (special tokens included), 0 at padding."""
        if self.readout != "weighted":
            return super().readout_weights(inputs, layout)
        mask = inputs["attention_mask"].to(inputs.score_dtype)
        return mask / mask.sum(dim=-1, keepdim=True)

    # ------------------------------------------------------------------ inputs, layout
    def prepare_inputs(self, inputs: RawInputs, sample_ids: SampleIds = None) -> ModelInputs:
        inputs, ids, mask = check_token_inputs(inputs, self.family, int(self.config.vocab_size),
                                                int(self.config.max_position_embeddings),
                                                missing_note="; inputs_embeds are not supported")
        shape = ids.shape
        runs = (mask[:, 1:] > mask[:, :-1]).long().sum(dim=1)
        if not bool(mask[:, 0].all()) or bool(runs.any()):
            raise ValueError("attention_mask: every sample must start with a real token and be padded on the right "
                             "only (ModernBERT's positions are arange(N))")
        tensors: Dict[str, Tensor] = {"input_ids": ids.long(), "attention_mask": mask}
        special = inputs.get("special_tokens_mask")
        if special is not None:
            tensors["special_tokens_mask"] = check_ids_like("special_tokens_mask", special, shape).long()
        types = inputs.get("token_type_ids")
        if types is not None and bool(check_ids_like("token_type_ids", types, shape).any()):
            raise ValueError(f"{self.family} has no token-type embeddings: token_type_ids must be 0 or absent")
        tensors[POSITION_IDS] = torch.arange(shape[1], device=ids.device).expand(shape[0], -1)
        dtype = self.base.embeddings.tok_embeddings.weight.dtype
        return ModelInputs(tensors, int(shape[0]), dtype, ids.device, check_sample_ids(sample_ids, int(shape[0])))

    def layout(self, inputs: Union[ModelInputs, RawInputs]) -> TokenSequence:
        if not isinstance(inputs, ModelInputs):
            inputs = self.prepare_inputs(inputs)
        mask = inputs["attention_mask"]
        special = inputs.tensors.get("special_tokens_mask")
        special = special.bool() if special is not None else special_positions(mask)
        return TokenSequence(attention_mask=mask, content_mask=mask.bool() & ~special)

    def context(self, inputs: ModelInputs) -> SequenceContext:
        return SequenceContext(attention_mask=inputs["attention_mask"], position_ids=inputs[POSITION_IDS])

    # ------------------------------------------------------------------ forward pieces (the model's own order)
    def embed(self, inputs: ModelInputs) -> Tensor:
        """``drop(norm(tok_embeddings(ids)))``, times the per-sample ``embedding_scale`` of :meth:`interpolate`."""
        hidden = self.base.embeddings(input_ids=inputs["input_ids"])
        scale = inputs.tensors.get(EMBEDDING_SCALE)
        return hidden if scale is None else scale.to(hidden.dtype)[:, None, None] * hidden

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
        indices = list(range(self.depth))[start:stop]
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
        if self.readout == "class_token":
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

    def interpolate(self, inputs: ModelInputs, alphas: Tensor) -> ModelInputs:
        """``S * B`` samples, step-major, whose embedding output (after its LayerNorm) is multiplied by ``alpha``
        (as the BERT-like families: Beyond Intuition's ``alpha * embedding_output``)."""
        return scaled_copies(inputs, alphas, EMBEDDING_SCALE)

    # ------------------------------------------------------------------ where methods hook
    def record_attention(self, rec: ActivationRecorder, layer: int, key: Hashable, require_grad: bool = False,
                         transform: Optional[Callable[[Tensor], Tensor]] = None) -> None:
        """The probabilities returned by ``ModernBertAttention`` in eager mode (after dropout, identity in eval)."""
        rec.output(self.self_attention(layer), key, transform=transform, index=1, require_grad=require_grad)

    def record_values(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        """The value third of ``Wqkv``'s output ``[B, N, D]``."""
        width = self.width
        rec.output(self.blocks[layer].attn.Wqkv, key, transform=lambda qkv: qkv[..., 2 * width:])

    def record_attention_input(self, rec: ActivationRecorder, layer: int, key: Hashable,
                               require_grad: bool = False) -> None:
        """``attn_norm``'s output (block 0: its ``nn.Identity``, the embedding output)."""
        rec.output(self.blocks[layer].attn_norm, key, require_grad=require_grad)

    def attention_linears(self, layer: int) -> AttentionLinears:
        attn = self.blocks[layer].attn
        return AttentionLinears(out=attn.Wo, qkv=attn.Wqkv)

    def mlp_linears(self, layer: int) -> Tuple[nn.Linear, nn.Linear]:
        """``Wi`` (both halves: ``in | gate``) and ``Wo``."""
        mlp = self.blocks[layer].mlp
        return mlp.Wi, mlp.Wo
