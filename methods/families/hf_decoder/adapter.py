"""Adapters for stock Hugging Face ``transformers`` decoder language models (causal LMs) and their
sequence-classification heads: GPT-2, Llama, Mistral, Qwen2, Qwen3 and Gemma 3 (text).

An adapter calls the model's own submodules in the order of the model's own ``forward`` (``LlamaModel.forward``,
``GPT2Model.forward``, ...): the token embeddings (GPT-2: plus the learned positions ``wpe``), the masks built by
``transformers.masking_utils.create_causal_mask`` (``create_sliding_window_causal_mask`` for sliding-window
layers) exactly as the model builds them, the rotary embeddings of the model's ``rotary_emb``, each layer with the
keyword arguments the model passes, the final norm, the head (``lm_head`` / ``score``). Its logits are the model's.

Design notes: ``NOTES.md`` beside this file (adapter.py).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Hashable, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from ...adapters.base import (
    AttentionLinears,
    AttentionRecompute,
    BlockDecomposition,
    BlockLinears,
    Decoder,
    InputFormat,
    ModelInputs,
    RawInputs,
    ReadOut,
    Recording,
    SampleIds,
    SequenceContext,
    TokenSequence,
    check_sample_ids,
    register_adapter,
    scaled_copies,
)
from ...adapters.capability import Capability
from ...adapters.gradient_rules import apply_identity_rule
from ...adapters.library import library_class
from ...adapters.recorder import ActivationRecorder
from ...adapters.tokens import check_ids_like, check_token_inputs, last_real_positions, positions_from_mask
from ...adapters.value_edits import ProjectionValueEdit
from ..hf_blocks import HFBaseBlocks, HFRecording, HFScoreEdit
from .recompute import recomputed_attention
from .rules import DecoderRules, Gemma3Rules, RopeDecoderRules

#: extra per-sample tensors of a batch set by the adapter: the read-out positions, the position ids and, from
#: :meth:`DecoderInputs.interpolate`, the factor on the token embeddings
READOUT_POSITIONS = "readout_positions"
POSITION_IDS = "position_ids"
TOKEN_EMBEDDING_SCALE = "token_embedding_scale"
FULL, SLIDING = "full_attention", "sliding_attention"


def repeat_heads(values: Tensor, kv_heads: int, groups: int) -> Tensor:
    """``[B, N, kv_heads * d]`` -> ``[B, N, kv_heads * groups * d]``: each key/value head repeated for the
    ``groups`` query heads that read it, in the order of ``transformers``' ``repeat_kv``."""
    if groups == 1:
        return values
    return values.unflatten(-1, (kv_heads, -1)).repeat_interleave(groups, dim=-2).flatten(-2)


def unmask_padding_queries(mask: Any, attention_mask: Tensor) -> Any:
    """The 4-d mask ``[B, 1, N, N]`` with each padding query (``attention_mask == 0``) allowed to attend to
    itself (additive float masks: 0 on its diagonal entry; boolean masks: ``True``); other masks unchanged."""
    if not isinstance(mask, Tensor) or mask.dim() != 4 or bool(attention_mask.all()):
        return mask
    if tuple(mask.shape[:1] + mask.shape[2:]) != (attention_mask.shape[0],) + (attention_mask.shape[1],) * 2:
        return mask                                  # pragma: no cover - not a per-sample [B, 1, N, N] mask
    rows, cols = (attention_mask.to(mask.device) == 0).nonzero(as_tuple=True)
    mask = mask.clone()
    mask[rows, 0, cols, cols] = True if mask.dtype == torch.bool else 0
    return mask


class DecoderDecomposition(BlockDecomposition):
    """Pre-norm blocks: ``input_layernorm``, then ``post_attention_layernorm`` (entering the MLP)."""

    norm_names = ("input_layernorm", "post_attention_layernorm")


class Gemma3Decomposition(BlockDecomposition):
    """Sandwich norms: the attention output through its own RMSNorm (``post_attention_layernorm``) before the
    residual sum, linearised per token with its scale; the MLP entered through ``pre_feedforward_layernorm``."""

    norm_names = ("input_layernorm", "pre_feedforward_layernorm")

    def attention_output_norm(self, layer: int) -> Optional[Tuple[nn.Module, str]]:
        return self.adapter.blocks[layer].post_attention_layernorm, "after_proj"


class GPT2Decomposition(BlockDecomposition):
    """GPT-2's pre-norm blocks: ``ln_1``, ``ln_2``."""

    norm_names = ("ln_1", "ln_2")


class HFDecoderFacts(Decoder):
    """A decoder family's :class:`~methods.adapters.Decoder` facts, read from its adapter."""

    adapter: "_HFDecoder"

    @property
    def is_lm(self) -> bool:
        return self.adapter.is_lm

    def final_norm(self) -> nn.Module:
        return self.adapter.final_norm()

    @property
    def linear_head(self) -> bool:
        return self.adapter.head_is_linear()


class _HFDecoder(HFBaseBlocks):
    """Shared machinery of the decoder families (see the module docstring); a family subclass names its model
    classes and submodules."""

    rule_map = Capability(DecoderRules)

    readout: Capability[ReadOut] = Capability(lambda adapter: ReadOut(adapter, "position"))
    inputs: Capability[InputFormat] = Capability(lambda adapter: DecoderInputs(adapter))
    #: the ``transformers`` classes (names) of the family: causal LMs and sequence classifiers
    model_classes: Tuple[str, ...] = ()
    #: the attribute of the model holding the decoder stack
    base_attr = "model"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.config: Any = model.config
        #: a causal LM (logits over the vocabulary) rather than a sequence classifier
        self.is_lm = hasattr(model, "lm_head")

    @staticmethod
    def layers_of(base: Any) -> Any:
        return base.layers

    @classmethod
    def supports(cls, model: nn.Module) -> Optional[str]:
        classes = [c for c in (library_class("transformers", name) for name in cls.model_classes) if c is not None]
        if not classes:
            return f"this transformers has none of {', '.join(cls.model_classes)}"
        if not isinstance(model, tuple(classes)):
            return f"{type(model).__name__} is not one of transformers' {', '.join(cls.model_classes)}"
        return None

    @classmethod
    def signature_of(cls, model: Any) -> tuple:
        return (cls.depth_of(model), int(model.config.num_attention_heads))

    # ------------------------------------------------------------------ structure
    def classifier(self) -> nn.Module:
        """The head's linear layer: ``lm_head`` or ``score``."""
        return self.model.lm_head if self.is_lm else self.model.score

    def final_norm(self) -> nn.Module:
        return self.base.norm

    def self_attention(self, layer: int) -> nn.Module:
        """The module returning ``(attn_output, attn_weights)``."""
        return self.blocks[layer].self_attn

    def attention_norm(self, layer: int) -> nn.Module:
        """The norm whose output enters block ``layer``'s attention."""
        return self.blocks[layer].input_layernorm

    # ------------------------------------------------------------------ inputs, layout
    def max_length(self) -> int:
        """The longest sequence accepted: unbounded for rotary positions (GPT-2: its ``n_positions``)."""
        return 1 << 62

    # ------------------------------------------------------------------ forward pieces (the model's own order)
    def token_embeddings(self, inputs: ModelInputs) -> Tensor:
        """The input embedding module's output, times the per-sample ``token_embedding_scale`` when
        ``inputs.interpolate`` set one."""
        tokens = self.input_embedding()(inputs["input_ids"])
        scale = inputs.tensors.get(TOKEN_EMBEDDING_SCALE)
        return tokens if scale is None else scale.to(tokens.dtype)[:, None, None] * tokens

    def embed(self, inputs: ModelInputs) -> Tensor:
        return self.token_embeddings(inputs)

    def layer_type(self, layer: int) -> str:
        """``"full_attention"`` or ``"sliding_attention"``: which mask (and rotary embedding) layer ``layer``
        reads, as the model's ``forward`` picks it."""
        types = getattr(self.config, "layer_types", None)
        return str(types[layer]) if types is not None else FULL

    def layer_masks(self, hidden: Tensor, context: SequenceContext, kinds: Any) -> Dict[str, Any]:
        """The masks of the layer types ``kinds``, built as the model builds them (then
        :func:`unmask_padding_queries`)."""
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        mask = context.attention_mask
        mask = None if mask is None else mask.to(hidden.device)
        masks = {}
        for kind in kinds:
            build = create_sliding_window_causal_mask if kind == SLIDING else create_causal_mask
            built = build(config=self.config, inputs_embeds=hidden, attention_mask=mask, cache=None,
                          position_ids=context.position_ids)
            masks[kind] = built if mask is None else unmask_padding_queries(built, mask)
        return masks

    def position_ids(self, hidden: Tensor, context: SequenceContext) -> Tensor:
        ids = context.position_ids
        if ids is None:
            return torch.arange(hidden.shape[1], device=hidden.device)[None, :]
        return ids.to(hidden.device)

    def run_blocks(self, hidden: Tensor, context: SequenceContext, start: int = 0,
                   stop: Optional[int] = None) -> Tensor:
        indices = list(range(len(self.blocks)))[start:stop]
        if not indices:
            return hidden
        kinds = sorted({self.layer_type(i) for i in indices})
        masks = self.layer_masks(hidden, context, kinds)
        position_ids = self.position_ids(hidden, context)
        rotary = self.rotary_embeddings(hidden, position_ids, kinds)
        for i in indices:
            hidden = self.call_layer(i, hidden, masks[self.layer_type(i)], rotary.get(self.layer_type(i)),
                                     position_ids)
        return hidden

    def rotary_embeddings(self, hidden: Tensor, position_ids: Tensor, kinds: Any) -> Dict[str, Any]:
        """The ``(cos, sin)`` of each layer type (one for every type unless the family has several)."""
        embeddings = self.base.rotary_emb(hidden, position_ids)
        return {kind: embeddings for kind in kinds}

    def call_layer(self, layer: int, hidden: Tensor, mask: Any, rotary: Any, position_ids: Tensor) -> Tensor:
        return self.blocks[layer](hidden, attention_mask=mask, position_embeddings=rotary, position_ids=position_ids)

    def logits_at(self, hidden: Tensor, context: SequenceContext, pre_logits: bool) -> Tensor:
        """Final norm, the read-out position of each row, the head."""
        normed = self.final_norm()(hidden)
        positions = context.readout_positions
        if positions is None:
            positions = torch.full((hidden.shape[0],), hidden.shape[1] - 1, device=hidden.device)
        rows = torch.arange(normed.shape[0], device=normed.device)
        positions = positions.to(normed.device)
        if pre_logits:
            return normed[rows, positions]
        if not self.is_lm:   # a few classes: the score of every position, then the read-out, as transformers
            return self.classifier()(normed)[rows, positions]
        # an LM's vocabulary is large: the head of the read-out rows only (equal to the model's logits up to
        # the rounding of a matrix product of another shape: <= 2e-7 relative in float32, 3e-16 in float64)
        return self.classifier()(normed[rows, positions])

    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """Final norm, the read-out position, ``lm_head`` / ``score`` (``pre_logits``: the normed hidden state
        of the read-out position)."""
        return self.logits_at(hidden, context, pre_logits)

    def input_embedding(self) -> nn.Module:
        """The token embedding (``embed_tokens``; Gemma 3's scales its output by ``sqrt(hidden_size)``: the
        scaled output is the input embedding, LXT's ``inputs_embeds``)."""
        return self.base.embed_tokens


    # ------------------------------------------------------------------ where methods hook
    recording: Capability[Recording] = Capability(lambda adapter: DecoderRecording(adapter))

    def linears(self, layer: int) -> BlockLinears:
        """The attention's ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``; the MLP's ``up_proj`` and ``down_proj``
        (the gate: ``rules.RopeDecoderRules.gated_mlps``)."""
        attn: Any = self.self_attention(layer)
        mlp = self.blocks[layer].mlp
        return BlockLinears(AttentionLinears(out=attn.o_proj, q=attn.q_proj, k=attn.k_proj, v=attn.v_proj),
                            (mlp.up_proj, mlp.down_proj))

    decomposition: Capability[Optional[BlockDecomposition]] = Capability(DecoderDecomposition)
    decoder = Capability(HFDecoderFacts)

    def head_is_linear(self) -> bool:
        """The LM head (or the score head) is linear after the final norm (ALTI-Logit)."""
        return True


class DecoderInputs(InputFormat):
    """A decoder's inputs: token ids with one contiguous run of real tokens per row (left or right padding), the
    read-out position (the last real token unless given) and the position ids from the mask; integrated gradients
    scale the token embeddings."""

    adapter: "_HFDecoder"
    layout_class = TokenSequence

    def normalises_word_embeddings_alone(self) -> bool:
        """RMSNorm decoders (Llama, Mistral, Qwen, Gemma): no position embedding is added, and each block's
        RMSNorm sees the word embeddings first; GPT-2 adds its position embeddings."""
        return any(type(m).__name__.endswith("RMSNorm") for m in self.adapter.model.modules())

    def prepare(self, inputs: RawInputs, sample_ids: SampleIds = None) -> ModelInputs:
        adapter = self.adapter
        inputs, ids, mask = check_token_inputs(inputs, adapter.family, int(adapter.config.vocab_size),
                                                adapter.max_length(), missing_note="; inputs_embeds are not supported")
        shape = ids.shape
        runs = (mask[:, 1:] > mask[:, :-1]).long().sum(dim=1) + mask[:, 0]
        if not bool((runs == 1).all()):
            bad = (runs != 1).nonzero().flatten().tolist()
            raise ValueError(f"attention_mask: rows {bad} do not hold one contiguous run of real tokens (left or "
                             "right padding only)")
        tensors: Dict[str, Tensor] = {"input_ids": ids.long(), "attention_mask": mask}
        special = inputs.get("special_tokens_mask")
        if special is not None:
            tensors["special_tokens_mask"] = check_ids_like("special_tokens_mask", special, shape).long()
        readout = inputs.get("readout_position")
        if readout is None:
            readout = last_real_positions(mask)
        else:
            readout = torch.as_tensor(readout, device=ids.device)
            if readout.dim() == 0:
                readout = readout.expand(shape[0])
            if readout.dtype.is_floating_point or tuple(readout.shape) != (shape[0],):
                raise ValueError(f"readout_position must be one integer position per row ({shape[0]}), got "
                                 f"{tuple(readout.shape)} {readout.dtype}")
            readout = readout.long()
            rows = torch.arange(shape[0], device=ids.device)
            inside = (readout >= 0) & (readout < shape[1])
            if not bool(inside.all()) or not bool(mask[rows, readout.clamp(0, shape[1] - 1)].all()):
                raise ValueError("readout_position must name a real (attended) position of every row")
        tensors[READOUT_POSITIONS] = readout
        tensors[POSITION_IDS] = positions_from_mask(mask)
        embedding: Any = adapter.input_embedding()
        return ModelInputs(tensors, int(shape[0]), embedding.weight.dtype, ids.device,
                           check_sample_ids(sample_ids, int(shape[0])))

    def layout(self, inputs: Union[ModelInputs, RawInputs]) -> TokenSequence:
        if not isinstance(inputs, ModelInputs):
            inputs = self.prepare(inputs)
        mask = inputs["attention_mask"]
        special = inputs.tensors.get("special_tokens_mask")
        if special is None:
            special = torch.zeros_like(mask, dtype=torch.bool)
            bos = self.adapter.config.bos_token_id
            if bos is not None:
                first = (mask.long().cumsum(-1) == 1) & mask.bool()
                special = first & (inputs["input_ids"] == int(bos))
        return TokenSequence(attention_mask=mask, content_mask=mask.bool() & ~special.bool())

    def context(self, inputs: ModelInputs) -> SequenceContext:
        return SequenceContext(attention_mask=inputs["attention_mask"], readout_positions=inputs[READOUT_POSITIONS],
                               position_ids=inputs[POSITION_IDS])

    def drop_positions(self, hidden: Tensor, context: SequenceContext,
                       removed: Tensor) -> Tuple[Tensor, SequenceContext]:
        """As :meth:`InputFormat.drop_positions`, the others keeping their position ids; a sequence whose own
        read-out position is removed is read at the real position before it (the prediction made without that
        token)."""
        shortened, short = super().drop_positions(hidden, context, removed)
        positions = short.readout_positions
        if positions is not None and context.readout_positions is not None:
            hit = (removed.to(positions.device)[None, :] == context.readout_positions[:, None]).flatten()
            positions = torch.where(hit, (positions - 1).clamp(min=0), positions)
        return shortened, SequenceContext(short.attention_mask, positions, short.position_ids)

    def interpolate(self, inputs: ModelInputs, alphas: Tensor) -> ModelInputs:
        """``S * B`` samples, step-major, whose token embeddings are multiplied by ``alpha`` (before GPT-2's
        position embeddings are added)."""
        return scaled_copies(inputs, alphas, TOKEN_EMBEDDING_SCALE)


class _HFRopeDecoder(_HFDecoder):
    """Llama-like decoders: ``embed_tokens``, RMSNorm, rotary embeddings, (grouped-query) attention with
    ``q_proj``/``k_proj``/``v_proj``/``o_proj``, gated MLP ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``."""

    rule_map = Capability(RopeDecoderRules)


@register_adapter
class HFLlamaAdapter(_HFRopeDecoder):
    """Stock ``transformers`` ``LlamaForCausalLM`` / ``LlamaForSequenceClassification`` (see the module
    docstring)."""

    family = "transformers LlamaForCausalLM"
    model_classes = ("LlamaForCausalLM", "LlamaForSequenceClassification")


@register_adapter
class HFMistralAdapter(_HFRopeDecoder):
    """Stock ``transformers`` ``MistralForCausalLM`` / ``MistralForSequenceClassification``: Llama's blocks, every
    layer under the sliding-window mask when ``config.sliding_window`` is set (as ``MistralModel.forward``)."""

    family = "transformers MistralForCausalLM"
    model_classes = ("MistralForCausalLM", "MistralForSequenceClassification")

    def layer_type(self, layer: int) -> str:
        return FULL if getattr(self.config, "sliding_window", None) is None else SLIDING


@register_adapter
class HFQwen2Adapter(_HFRopeDecoder):
    """Stock ``transformers`` ``Qwen2ForCausalLM`` / ``Qwen2ForSequenceClassification``: Llama's blocks with
    q/k/v biases; full or sliding-window layers by ``config.layer_types``."""

    family = "transformers Qwen2ForCausalLM"
    model_classes = ("Qwen2ForCausalLM", "Qwen2ForSequenceClassification")


@register_adapter
class HFQwen3Adapter(_HFRopeDecoder):
    """Stock ``transformers`` ``Qwen3ForCausalLM`` / ``Qwen3ForSequenceClassification``: Llama's blocks with
    RMSNorms on the query and key heads (``q_norm``, ``k_norm``: identity rule, as every RMSNorm)."""

    family = "transformers Qwen3ForCausalLM"
    model_classes = ("Qwen3ForCausalLM", "Qwen3ForSequenceClassification")


@register_adapter
class HFGemma3Adapter(_HFRopeDecoder):
    """Stock ``transformers`` ``Gemma3ForCausalLM`` / ``Gemma3TextForSequenceClassification`` (the text model):
    scaled token embeddings (``Gemma3TextScaledWordEmbedding``, the scaled output is the input embedding),
    RMSNorms ``x * rsqrt(mean(x^2) + eps) * (1 + w)`` around both sub-layers and on the query/key heads, local
    (sliding-window) and global layers with their own rotary embeddings (``config.layer_types``), the LM's final
    logit soft-capping ``cap * tanh(logits / cap)`` (the identity rule on the tanh under AttnLRP / CP-LRP's
    ``head_rules``; LXT leaves it plain). Refused: bidirectional attention; attention-logit soft-capping
    has no relevance rule (``rules.Gemma3Rules.problems``)."""

    rule_map = Capability(Gemma3Rules)

    family = "transformers Gemma3ForCausalLM"
    model_classes = ("Gemma3ForCausalLM", "Gemma3TextForSequenceClassification")

    @classmethod
    def supports(cls, model: nn.Module) -> Optional[str]:
        reason = super().supports(model)
        if reason is None and getattr(model.config, "use_bidirectional_attention", False):
            return "Gemma 3 with use_bidirectional_attention is not a causal decoder"
        return reason

    def rotary_embeddings(self, hidden: Tensor, position_ids: Tensor, kinds: Any) -> Dict[str, Any]:
        return {kind: self.base.rotary_emb(hidden, position_ids, kind) for kind in kinds}

    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """As :meth:`_HFDecoder.head`, then the LM's final logit soft-capping (``config.final_logit_softcapping``)."""
        logits = self.logits_at(hidden, context, pre_logits)
        cap = getattr(self.config, "final_logit_softcapping", None)
        if pre_logits or not self.is_lm or cap is None:
            return logits
        scaled = logits / cap
        return apply_identity_rule(torch.tanh, scaled, self.rule_map.head_epsilon) * cap

    decomposition = Capability(Gemma3Decomposition)

    def head_is_linear(self) -> bool:
        """The LM's final logit soft-capping (``tanh``) makes the head non-linear (ALTI-Logit refuses it)."""
        return not self.is_lm or getattr(self.config, "final_logit_softcapping", None) is None


@register_adapter
class HFGPT2Adapter(_HFDecoder):
    """Stock ``transformers`` ``GPT2LMHeadModel`` / ``GPT2ForSequenceClassification``: token embeddings ``wte`` plus
    learned positions ``wpe`` (from the mask's position ids), dropout; ``GPT2Block`` ``x + attn(ln_1(x))``,
    ``h + mlp(ln_2(h))`` with ``Conv1D`` projections (fused ``c_attn`` -> ``[q | k | v]``, ``c_proj``; MLP
    ``c_fc``, activation, ``c_proj``); final ``ln_f``; head ``lm_head`` (tied to ``wte``) or ``score``."""

    family = "transformers GPT2LMHeadModel"
    model_classes = ("GPT2LMHeadModel", "GPT2ForSequenceClassification")
    base_attr = "transformer"

    @classmethod
    def supports(cls, model: nn.Module) -> Optional[str]:
        reason = super().supports(model)
        if reason is None and getattr(model.config, "add_cross_attention", False):
            return "GPT-2 with cross-attention is not supported"
        return reason

    #: the stock eager path of ``reorder_and_upcast_attn`` is another function (``_upcast_and_reordered_attn``):
    #: its maps are not recomputed, and its scores never reach an attention function

    def upcasts(self) -> bool:
        """Whether the model takes the ``reorder_and_upcast_attn`` path."""
        return bool(getattr(self.config, "reorder_and_upcast_attn", False))

    @classmethod
    def signature_of(cls, model: Any) -> tuple:
        return super().signature_of(model) + (bool(getattr(model.config, "reorder_and_upcast_attn", False)),)

    @staticmethod
    def layers_of(base: Any) -> Any:
        return base.h

    def max_length(self) -> int:
        return int(self.config.n_positions)

    def final_norm(self) -> nn.Module:
        return self.base.ln_f

    def self_attention(self, layer: int) -> nn.Module:
        return self.blocks[layer].attn

    def attention_norm(self, layer: int) -> nn.Module:
        return self.blocks[layer].ln_1

    def input_embedding(self) -> nn.Module:
        """``wte`` (the position embeddings ``wpe`` keep their own share)."""
        return self.base.wte

    def embed(self, inputs: ModelInputs) -> Tensor:
        """``wte(ids) + wpe(position_ids)``, dropout (``GPT2Model.forward``)."""
        tokens = self.token_embeddings(inputs)
        hidden = tokens + self.base.wpe(inputs[POSITION_IDS]).to(tokens.device)
        return self.base.drop(hidden)

    def rotary_embeddings(self, hidden: Tensor, position_ids: Tensor, kinds: Any) -> Dict[str, Any]:
        return {}

    def call_layer(self, layer: int, hidden: Tensor, mask: Any, rotary: Any, position_ids: Tensor) -> Tensor:
        return self.blocks[layer](hidden, None, mask, None, encoder_attention_mask=None, use_cache=False,
                                  position_ids=position_ids)

    recording = Capability(lambda adapter: GPT2Recording(adapter))
    def linears(self, layer: int) -> BlockLinears:
        attn, mlp = self.blocks[layer].attn, self.blocks[layer].mlp
        return BlockLinears(AttentionLinears(out=attn.c_proj, qkv=attn.c_attn), (mlp.c_fc, mlp.c_proj))

    decomposition = Capability(GPT2Decomposition)


class DecoderRecompute(AttentionRecompute):
    """A decoder's attention probabilities recomputed in the backward pass by the family's own eager attention."""

    adapter: "_HFDecoder"

    def __call__(self, consume: Callable[[int, Tensor, Tensor], None],
                             lowest: int) -> contextlib.AbstractContextManager[Tensor]:
        """Each block's probabilities recomputed in the backward pass by the family's own eager attention
        (:func:`methods.families.hf_decoder.recompute.recomputed_attention`; the base class states the contract): the
        config is switched to that implementation for the duration (the masks built as for the eager attention)
        and restored on exit."""
        weight: Any = self.adapter.input_embedding().weight
        modules = {self.adapter.self_attention(i): i for i in range(len(self.adapter.blocks))}
        return recomputed_attention(self.adapter.attention_config(), modules, consume, lowest, weight.dtype,
                                    weight.device)


class DecoderRecording(HFRecording):
    """Where methods hook in a decoder."""

    adapter: "_HFDecoder"
    value_edit = Capability(lambda recording: ProjectionValueEdit(recording.adapter))
    attention_recompute: Capability[Optional[AttentionRecompute]] = Capability(
        lambda recording: DecoderRecompute(recording.adapter))

    def attention(self, rec: ActivationRecorder, layer: int, key: Hashable, require_grad: bool = False,
                  transform: Optional[Callable[[Tensor], Tensor]] = None) -> None:
        """The probabilities ``[B, H, N, N]`` returned by the attention module (``(attn_output, attn_weights)``;
        after dropout, identity in eval; all query heads). ``require_grad`` needs autograd recorded from this
        block on (see :meth:`forward`). Nothing is recorded for the blocks whose probabilities
        ``recording.attention_recompute`` recomputes."""
        rec.output(self.adapter.self_attention(layer), key, transform=transform, index=1, require_grad=require_grad)

    def values(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        """``v_proj``'s output with each key/value head repeated for its query heads: ``[B, N, H * head_dim]``."""
        attn: Any = self.adapter.self_attention(layer)
        groups = int(attn.num_key_value_groups)
        kv_heads = self.adapter.token_flow.heads // groups
        rec.output(attn.v_proj, key, transform=lambda v: repeat_heads(v, kv_heads, groups))

    def attention_input(self, rec: ActivationRecorder, layer: int, key: Hashable,
                        require_grad: bool = False) -> None:
        rec.output(self.adapter.attention_norm(layer), key, require_grad=require_grad)

    def block_input(self, rec: ActivationRecorder, layer: int, key: Hashable,
                    require_grad: bool = False) -> None:
        rec.input(self.adapter.blocks[layer], key, require_grad=require_grad)


class GPT2Recording(DecoderRecording):
    """GPT-2's values: the last third of the fused ``c_attn``."""

    score_edit = Capability(lambda recording: None if recording.adapter.upcasts() else HFScoreEdit(recording.adapter))
    #: not on the ``reorder_and_upcast_attn`` path (another function)
    attention_recompute = Capability(
        lambda recording: None if recording.adapter.upcasts() else DecoderRecompute(recording.adapter))

    def values(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        """The value third of ``c_attn``'s output ``[B, N, D]``."""
        width = self.adapter.token_flow.width
        rec.output(self.adapter.blocks[layer].attn.c_attn, key, transform=lambda qkv: qkv[..., 2 * width:])
