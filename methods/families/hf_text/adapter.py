"""Adapters for stock Hugging Face ``transformers`` text classifiers: ``BertForSequenceClassification`` (any
BERT checkpoint: BERT, MiniLM, ...), ``RobertaForSequenceClassification``, ``DistilBertForSequenceClassification``.

An adapter calls the model's own submodules in the order of the model's ``forward`` (embeddings, the additive
attention mask built by ``transformers.masking_utils.create_bidirectional_mask`` exactly as the model builds it,
each block, the head), so its logits are the model's.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from ...adapters.base import (
    AttentionLinears,
    BlockDecomposition,
    BlockLinears,
    HeadLayers,
    InputFormat,
    ModelInputs,
    RawInputs,
    ReadOut,
    Recording,
    SampleIds,
    SequenceContext,
    TokenFlow,
    TokenSequence,
    check_sample_ids,
    linear_weight,
    register_adapter,
    scaled_copies,
)
from ...adapters.capability import Capability
from ...adapters.gradient_rules import apply_identity_rule
from ...adapters.library import class_problem
from ...adapters.recorder import ActivationRecorder
from ...adapters.tokens import check_ids_like, check_token_inputs, special_positions
from ...adapters.value_edits import ProjectionValueEdit
from ..hf_blocks import HFBaseBlocks, HFRecording
from .rules import TextRules

#: an extra per-sample tensor set by :meth:`TextInputs.interpolate`: the factor on the embedding output
EMBEDDING_SCALE = "embedding_scale"


class TextDecomposition(BlockDecomposition):
    """Post-norm blocks: the LayerNorm after the attention's residual sum (its input ``x + dense(context)`` the
    post-attention residual), then the one after the MLP's; the whole network for DecompX (BERT's pooler head)."""

    adapter: HFTextAdapter
    pre_norm = False
    decomposes_network = True

    def block_norms(self, layer: int) -> Tuple[nn.Module, nn.Module]:
        block = self.adapter.blocks[layer]
        return block.attention.output.LayerNorm, block.output.LayerNorm

    def head_layers(self) -> HeadLayers:
        first, last = self.adapter.head_linears()
        return HeadLayers(first=first, activation=self.adapter.head_activation_function(), last=last)


class DistilBertDecomposition(TextDecomposition):
    """DistilBERT's norms: ``sa_layer_norm`` and ``output_layer_norm``."""

    def block_norms(self, layer: int) -> Tuple[nn.Module, nn.Module]:
        block = self.adapter.blocks[layer]
        return block.sa_layer_norm, block.output_layer_norm


class HFTextAdapter(HFBaseBlocks):
    """Shared machinery of stock ``transformers`` encoder classifiers read at position 0 ([CLS] / ``<s>``) with
    post-norm blocks and separate query/key/value projections; a family subclass names its submodules.

    Inputs: a mapping as a tokenizer returns it (``input_ids`` ``[B, N]``, ``attention_mask``, optional
    ``token_type_ids``, optional ``special_tokens_mask``), or an ``input_ids`` tensor. Layout: a
    :class:`TokenSequence` whose content positions are the real tokens that are not special tokens (from
    ``special_tokens_mask`` when given, else position 0 and each sample's last real token).
    """

    rule_map = Capability(TextRules)

    #: [CLS]
    readout: Capability[ReadOut] = Capability(lambda adapter: ReadOut(adapter, "class_token", True))
    inputs: Capability[InputFormat] = Capability(lambda adapter: TextInputs(adapter))
    #: the model class (a name in ``transformers``); ``base_attr`` (:class:`HFBaseBlocks`) holds its encoder
    model_class = "?"
    uses_token_types = True

    @staticmethod
    def layers_of(base: Any) -> Any:
        return base.encoder.layer

    @classmethod
    def supports(cls, model: nn.Module) -> Optional[str]:
        problem = class_problem(model, "transformers", cls.model_class)
        if problem is not None:
            return problem
        if getattr(model.config, "is_decoder", False):
            return f"{cls.model_class} configured as a decoder (causal mask) is not supported"
        return None

    @classmethod
    def signature_of(cls, model: Any) -> tuple:
        return (cls.depth_of(model), cls.num_heads_of(model.config))

    @staticmethod
    def num_heads_of(config: Any) -> int:
        return int(config.num_attention_heads)

    def max_length(self) -> int:
        """The longest sequence the position embeddings cover."""
        return int(self.model.config.max_position_embeddings)

    def self_attention(self, layer: int) -> nn.Module:
        """The module returning ``(attn_output, attn_weights)`` in eager mode."""
        return self.blocks[layer].attention.self

    def attention_norm(self, layer: int) -> nn.Module:
        """The module whose output is the attention sub-layer's LayerNorm output (the MLP's input)."""
        return self.blocks[layer].attention.output

    def head_linears(self) -> Tuple[nn.Linear, ...]:
        """The Linear layers of the head, from the read-out token to the logits (activations, dropout between)."""
        raise NotImplementedError

    def embedding_projection(self) -> Optional[nn.Linear]:
        """The Linear layer between the embeddings and the encoder, if the family has one (ELECTRA)."""
        return None

    # ------------------------------------------------------------------ structure
    #: isotropic: the encoder's width (the input width of block 0's query projection; ELECTRA-small's embeddings
    #: are narrower) and the config's heads
    token_flow = Capability(lambda adapter: TokenFlow(adapter, adapter.encoder_width(),
                                                      adapter.num_heads_of(adapter.model.config)))

    def encoder_width(self) -> int:
        """The input width of block 0's query projection (ELECTRA-small's embeddings are narrower)."""
        query = self.linears(0).attention.q
        assert query is not None  # text families have separate projections
        return int(linear_weight(query).shape[1])

    # ------------------------------------------------------------------ forward pieces (the model's own order)
    def embeddings(self, inputs: ModelInputs) -> Tensor:
        """The model's embedding module on the inputs."""
        return self.base.embeddings(input_ids=inputs["input_ids"], token_type_ids=inputs.tensors.get("token_type_ids"))

    def embed(self, inputs: ModelInputs) -> Tensor:
        """The model's embeddings (word + token-type + position, LayerNorm, dropout), then the
        :meth:`embedding_projection` if the family has one; times the per-sample ``embedding_scale`` when
        ``inputs.interpolate`` set one (Beyond Intuition's ``alpha * embedding_output``: the encoder input)."""
        hidden = self.embeddings(inputs)
        projection = self.embedding_projection()
        if projection is not None:
            hidden = projection(hidden)
        scale = inputs.tensors.get(EMBEDDING_SCALE)
        if scale is not None:
            hidden = scale.to(hidden.dtype)[:, None, None] * hidden
        return hidden

    def block_mask(self, hidden: Tensor, context: SequenceContext) -> Optional[Tensor]:
        """The attention mask as ``BertModel`` builds it for the current attention implementation (additive
        ``[B, 1, N, N]`` with the dtype minimum at padding in eager mode; ``None`` when every position is real)."""
        if context.attention_mask is None:
            return None
        from transformers.masking_utils import create_bidirectional_mask

        return create_bidirectional_mask(config=self.model.config, inputs_embeds=hidden,
                                         attention_mask=context.attention_mask.to(hidden.device))

    # ------------------------------------------------------------------ where methods hook
    recording: Capability[Recording] = Capability(lambda adapter: TextRecording(adapter))

    def linears(self, layer: int) -> BlockLinears:
        block = self.blocks[layer]
        attention = block.attention
        return BlockLinears(AttentionLinears(out=attention.output.dense, q=attention.self.query, k=attention.self.key,
                                             v=attention.self.value), (block.intermediate.dense, block.output.dense))


    decomposition: Capability[Optional[BlockDecomposition]] = Capability(TextDecomposition)

    def head_activation_function(self) -> Callable[[Tensor], Tensor]:
        """The element-wise activation between the head's two linear layers (:meth:`head_linears`)."""
        raise NotImplementedError


class TextInputs(InputFormat):
    """The inputs of the BERT-like encoders: token ids with ``attention_mask`` (the real tokens first),
    ``token_type_ids`` and ``special_tokens_mask`` when given; integrated gradients scale the embedding output."""

    adapter: "HFTextAdapter"
    layout_class = TokenSequence

    def prepare(self, inputs: RawInputs, sample_ids: SampleIds = None) -> ModelInputs:
        adapter = self.adapter
        inputs, ids, mask = check_token_inputs(inputs, adapter.family, int(adapter.model.config.vocab_size),
                                                adapter.max_length(), missing_note="; inputs_embeds are not supported")
        shape = ids.shape
        tensors = {"input_ids": ids.long()}
        if not bool(mask[:, 0].all()):
            raise ValueError("attention_mask: position 0 ([CLS], the read-out) must be a real token in every sample "
                             "(left padding is not supported)")
        tensors["attention_mask"] = mask
        for name in ("token_type_ids", "special_tokens_mask"):
            value = inputs.get(name)
            if value is not None:
                tensors[name] = check_ids_like(name, value, shape).long()
        types = tensors.get("token_type_ids")
        if types is not None and not adapter.uses_token_types:
            if bool(types.any()):
                raise ValueError(f"{adapter.family} has no token-type embeddings: token_type_ids must be 0 or absent")
            del tensors["token_type_ids"]
        elif types is not None and (int(types.min()) < 0
                                    or int(types.max()) >= int(adapter.model.config.type_vocab_size)):
            raise ValueError(f"token_type_ids must lie in [0, {adapter.model.config.type_vocab_size})")
        dtype = adapter.model.get_input_embeddings().weight.dtype
        return ModelInputs(tensors, int(shape[0]), dtype, ids.device, check_sample_ids(sample_ids, int(shape[0])))

    def layout(self, inputs: Union[ModelInputs, RawInputs]) -> TokenSequence:
        if not isinstance(inputs, ModelInputs):
            inputs = self.prepare(inputs)
        mask = inputs["attention_mask"]
        special = inputs.tensors.get("special_tokens_mask")
        special = special.bool() if special is not None else special_positions(mask)
        return TokenSequence(attention_mask=mask, content_mask=mask.bool() & ~special)

    def context(self, inputs: ModelInputs) -> SequenceContext:
        return SequenceContext(attention_mask=inputs["attention_mask"])

    def interpolate(self, inputs: ModelInputs, alphas: Tensor) -> ModelInputs:
        """``S * B`` samples, step-major, whose embedding output (after the embedding LayerNorm) is multiplied by
        ``alpha`` (Beyond Intuition's BERT, ``BERT.py``: ``embedding_output = alpha * embedding_output``)."""
        return scaled_copies(inputs, alphas, EMBEDDING_SCALE)


@register_adapter
class HFBertAdapter(HFTextAdapter):
    """Stock ``transformers`` ``BertForSequenceClassification`` (BERT, MiniLM and other BERT checkpoints):
    ``BertLayer`` blocks ``LN(x + dense(attn(x)))``, ``LN(h + mlp(h))``; head: pooler ``tanh(dense(h[:, 0]))``,
    dropout, classifier."""

    family = "transformers BertForSequenceClassification"
    model_class = "BertForSequenceClassification"
    base_attr = "bert"

    @classmethod
    def supports(cls, model: nn.Module) -> Optional[str]:
        reason = super().supports(model)
        if reason is None and getattr(model.bert, "pooler", None) is None:
            return "BertForSequenceClassification without a pooler is not supported"
        return reason

    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """Pooler (``tanh(dense(h[:, 0]))``), dropout, classifier (``pre_logits``: the pooled latent)."""
        pooled = self.model.dropout(self.base.pooler(hidden))
        return pooled if pre_logits else self.model.classifier(pooled)

    def head_linears(self) -> Tuple[nn.Linear, ...]:
        return self.base.pooler.dense, self.model.classifier

    def head_activation_function(self) -> Callable[[Tensor], Tensor]:
        return self.base.pooler.activation


class _DenseHeadOnFirstToken(HFTextAdapter):
    """A classifier whose head (``model.classifier``) reads position 0 as RoBERTa's and ELECTRA's do: dropout,
    ``dense``, the family's activation (:meth:`head_activation`), dropout, ``out_proj``."""

    def head_activation(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """The head's ``forward`` step by step (``pre_logits``: the input of ``out_proj``)."""
        head = self.model.classifier
        x = head.dropout(hidden[:, 0, :])
        x = self.head_activation(head.dense(x))   # a module (ELECTRA) or functional (RoBERTa: rule_map.head_epsilon)
        x = head.dropout(x)
        return x if pre_logits else head.out_proj(x)

    def head_linears(self) -> Tuple[nn.Linear, ...]:
        return self.model.classifier.dense, self.model.classifier.out_proj

    def head_activation_function(self) -> Callable[[Tensor], Tensor]:
        return self.head_activation


@register_adapter
class HFRobertaAdapter(_DenseHeadOnFirstToken):
    """Stock ``transformers`` ``RobertaForSequenceClassification``: BERT's blocks; position ids from the
    ``input_ids`` (``padding_idx + cumsum``, by the model's own embeddings); head ``RobertaClassificationHead``:
    dropout, ``tanh(dense(h[:, 0]))``, dropout, ``out_proj``."""

    family = "transformers RobertaForSequenceClassification"
    model_class = "RobertaForSequenceClassification"
    base_attr = "roberta"

    def max_length(self) -> int:
        """RoBERTa's positions start after the padding index (``padding_idx + 1``)."""
        return int(self.model.config.max_position_embeddings) - int(self.model.config.pad_token_id) - 1

    def head_activation(self, x: Tensor) -> Tensor:
        return apply_identity_rule(torch.tanh, x, self.rule_map.head_epsilon)


@register_adapter
class HFDistilBertAdapter(HFTextAdapter):
    """Stock ``transformers`` ``DistilBertForSequenceClassification``: ``TransformerBlock`` blocks
    ``sa_layer_norm(x + out_lin(attn(x)))``, ``output_layer_norm(h + ffn(h))`` (``q_lin``/``k_lin``/``v_lin``),
    no token types; head: ``pre_classifier`` on ``h[:, 0]``, ReLU, dropout, ``classifier``."""

    family = "transformers DistilBertForSequenceClassification"
    model_class = "DistilBertForSequenceClassification"
    base_attr = "distilbert"
    uses_token_types = False

    @staticmethod
    def layers_of(base: Any) -> Any:
        return base.transformer.layer

    @staticmethod
    def num_heads_of(config: Any) -> int:
        return int(config.n_heads)

    def embeddings(self, inputs: ModelInputs) -> Tensor:
        return self.base.embeddings(inputs["input_ids"])

    def self_attention(self, layer: int) -> nn.Module:
        return self.blocks[layer].attention

    def attention_norm(self, layer: int) -> nn.Module:
        return self.blocks[layer].sa_layer_norm

    def linears(self, layer: int) -> BlockLinears:
        attention, ffn = self.blocks[layer].attention, self.blocks[layer].ffn
        return BlockLinears(AttentionLinears(out=attention.out_lin, q=attention.q_lin, k=attention.k_lin,
                                             v=attention.v_lin), (ffn.lin1, ffn.lin2))

    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """``DistilBertForSequenceClassification.forward``'s head (``pre_logits``: the classifier's input)."""
        m = self.model
        pooled = m.dropout(apply_identity_rule(nn.functional.relu, m.pre_classifier(hidden[:, 0]),
                                               self.rule_map.head_epsilon))
        return pooled if pre_logits else m.classifier(pooled)

    def head_linears(self) -> Tuple[nn.Linear, ...]:
        return self.model.pre_classifier, self.model.classifier

    def head_activation_function(self) -> Callable[[Tensor], Tensor]:
        return nn.functional.relu

    decomposition = Capability(DistilBertDecomposition)


@register_adapter
class HFElectraAdapter(_DenseHeadOnFirstToken):
    """Stock ``transformers`` ``ElectraForSequenceClassification`` (ELECTRA's discriminator): BERT's blocks; the
    embeddings (width ``embedding_size``) go through ``embeddings_project`` to the encoder's width when the two
    differ (ELECTRA-small), and that projection is part of :meth:`embed`, so Beyond Intuition's embedding scale
    multiplies the encoder input; head ``ElectraClassificationHead``: dropout, ``gelu(dense(h[:, 0]))``, dropout,
    ``out_proj`` (GELU identity for LRP, as every element-wise activation)."""

    family = "transformers ElectraForSequenceClassification"
    model_class = "ElectraForSequenceClassification"
    base_attr = "electra"

    def embedding_projection(self) -> Optional[nn.Linear]:
        return getattr(self.base, "embeddings_project", None)

    def head_activation(self, x: Tensor) -> Tensor:
        return self.model.classifier.activation(x)


class TextRecording(HFRecording):
    """Where methods hook in a post-norm text encoder."""

    adapter: "HFTextAdapter"
    value_edit = Capability(lambda recording: ProjectionValueEdit(recording.adapter))

    def attention(self, rec: ActivationRecorder, layer: int, key: Hashable, require_grad: bool = False,
                  transform: Optional[Callable[[Tensor], Tensor]] = None) -> None:
        """The probabilities returned by ``BertSelfAttention`` (``(attn_output, attn_weights)`` in eager mode;
        after dropout, identity in eval). ``require_grad`` needs autograd recorded from this block on (see
        :meth:`forward`)."""
        rec.output(self.adapter.self_attention(layer), key, transform=transform, index=1, require_grad=require_grad)

    def values(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        value = self.adapter.linears(layer).attention.v
        assert value is not None  # text families have separate projections
        rec.output(value, key)

    def attention_input(self, rec: ActivationRecorder, layer: int, key: Hashable,
                        require_grad: bool = False) -> None:
        rec.input(self.adapter.blocks[layer], key, require_grad=require_grad)   # post-norm: the block input
