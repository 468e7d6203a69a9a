"""Adapters for the two towers of a stock Hugging Face ``transformers.CLIPModel``.

A ``CLIPModel`` has no class logits of its own: it scores image-text pairs. A method explains a CLIP tower
through a *scorer* module that holds the ``CLIPModel`` and turns one tower's embedding into logits against fixed
embeddings of the other modality (``models.clip.ZeroShotClassifier``: images -> classes; ``models.clip.PromptScorer``:
texts -> images). The adapters read that protocol, not the wrapper classes:

* ``model.clip``: the ``transformers.CLIPModel``;
* ``model.clip_tower``: ``"vision"`` (inputs are images) or ``"text"`` (inputs are token ids);
* ``model.logits_from_embeddings(z)``: logits ``[B, C]`` from the tower's projected, unnormalised embedding
  ``z`` ``[B, projection_dim]`` (``visual_projection`` / ``text_projection`` output).

Design notes: ``NOTES.md`` beside this file (adapter.py).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, Mapping, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from ...adapters.base import (
    AttentionLinears,
    BlockDecomposition,
    BlockLinears,
    InputFormat,
    ModelInputs,
    RawInputs,
    ReadOut,
    RuleMap,
    SampleIds,
    SequenceContext,
    TokenSequence,
    ValueRecorder,
    check_sample_ids,
    register_adapter,
    scaled_copies,
)
from ...adapters.capability import Capability
from ...adapters.gradient_rules import normalized_rule
from ...adapters.lens import LensImageAdapter
from ...adapters.library import library_class
from ...adapters.recorder import ActivationRecorder
from ...adapters.tokens import check_ids_like, check_token_inputs
from ...adapters.value_edits import ProjectionValueEdit
from ..hf_blocks import HFEncoderBlocks, HFRecording
from .rules import CLIPTextRules, CLIPVisionRules

#: extra per-sample tensors of a text batch set by the adapter: the read-out (EOS) positions and, from
#: :meth:`ScaledTokenInputs.interpolate`, the factor on the token embeddings
READOUT_POSITIONS = "readout_positions"
TOKEN_EMBEDDING_SCALE = "token_embedding_scale"

TOWERS = ("vision", "text")


def scorer_problem(model: nn.Module, clip_class: type, tower: str, pair_model: str, scorer: str,
                   clip_name: str) -> Optional[str]:
    """Why ``model`` is not a scorer of the ``tower`` tower around a ``clip_class`` model (CLIP, SigLIP, open_clip:
    a module with ``.clip``, ``.clip_tower`` and ``logits_from_embeddings``, as :mod:`models.clip`'s
    ``ZeroShotClassifier`` and ``PromptScorer``), or ``None``; the names fill the messages."""
    if isinstance(model, clip_class):
        return (f"{pair_model} scores image-text pairs and has no class logits: wrap it as "
                "models.clip.ZeroShotClassifier (explain images) or models.clip.PromptScorer (explain texts)")
    found = getattr(model, "clip_tower", None)
    if found is None or not isinstance(getattr(model, "clip", None), clip_class):
        return f"{type(model).__name__} is not {scorer} (a module with .clip, {clip_name}, and .clip_tower)"
    if found not in TOWERS:
        return f"clip_tower must be one of {TOWERS}, got {found!r}"
    if found != tower:
        return f"{scorer} of the {found} tower"
    if not callable(getattr(model, "logits_from_embeddings", None)):
        return f"{type(model).__name__} has no logits_from_embeddings(embeddings) method"
    return None


class _ScorerHead:
    """The head of a tower behind a scorer (module docstring; open_clip's towers share it): the tower's
    :meth:`embedding`, then the scorer's logits. Listed before the adapter base in a subclass's bases."""

    model: Any
    clip: Any
    tower = "?"
    rule_map: RuleMap

    def embedding(self, hidden: Tensor, context: SequenceContext) -> Tensor:
        """The tower's embedding ``[B, projection_dim]`` (unnormalised) from the last hidden states: final norm,
        read-out, projection."""
        raise NotImplementedError

    def score_weight(self) -> Tensor:
        """``logit_scale.exp() * E``: the logits (less a constant ``logit_bias``, where the model has one) as a
        bias-free Linear on the L2-normalised embedding, ``E`` the scorer's fixed, normalised embeddings of the
        other modality (``class_embeddings`` / ``image_embeddings``)."""
        fixed = self.model.class_embeddings if self.tower == "vision" else self.model.image_embeddings
        return self.clip.logit_scale.exp().to(fixed) * fixed

    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """:meth:`embedding` (``pre_logits``: that projected, unnormalised embedding), then the scorer's
        ``logits_from_embeddings`` (``logit_scale.exp() * cosine``). Under the rule map's ``head_rules`` the
        gradient treats the embedding's norm as a constant (the logits' values are the scorer's)."""
        embedding = self.embedding(hidden, context)
        if pre_logits:
            return embedding
        logits = self.model.logits_from_embeddings(embedding)
        if self.rule_map.head_epsilon is None:
            return logits
        ruled = normalized_rule(embedding, self.rule_map.head_epsilon) @ self.score_weight().to(embedding).t()
        return logits.detach() + (ruled - ruled.detach())


class _ScaledTokenText:
    """What the CLIP-like text towers share (transformers' CLIP and SigLIP, open_clip): token ids ``[T, N]`` read
    out at one position per text; integrated gradients scale the token embeddings before the position embeddings
    are added (BI's ``CLIP.ipynb``: ``encode_text(text, scale)``: ``x = scale * token_embedding(text)``), by the
    per-sample ``token_embedding_scale`` that ``inputs.interpolate`` sets and ``embed`` reads. Listed first in a
    subclass's bases."""

    tower = "text"
    readout: Capability[ReadOut] = Capability(lambda adapter: ReadOut(adapter, "position"))

def at_readout_positions(normed: Tensor, context: SequenceContext) -> Tensor:
    """``[B, D]``: each sample's row of ``normed`` ``[B, N, D]`` at its read-out position (the context's)."""
    assert context.readout_positions is not None, "the text tower's context holds the read-out positions"
    positions = context.readout_positions.to(normed.device)
    return normed[torch.arange(normed.shape[0], device=normed.device), positions]


class CLIPDecomposition(BlockDecomposition):
    """Pre-norm ``x + out_proj(attention(layer_norm1(x)))``, then ``layer_norm2``."""

    norm_names = ("layer_norm1", "layer_norm2")


class _HFCLIPTower(_ScorerHead, HFEncoderBlocks):
    """Shared machinery of the two CLIP towers (see the module docstring); a subclass names its tower."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.clip: Any = model.clip
        self.tower_model = self.tower_of(self.clip)
        self.blocks = list(self.tower_model.encoder.layers)
        self.config = self.tower_model.config

    @classmethod
    def tower_of(cls, clip: Any) -> Any:
        return clip.vision_model if cls.tower == "vision" else clip.text_model

    #: what :func:`scorer_problem` names: the model, the scorer, the wrapped model
    scorer_names = ("a transformers CLIPModel", "a CLIP scorer", "a CLIPModel")

    @staticmethod
    def model_class() -> Optional[type]:
        """The wrapped model's class (``None`` without transformers)."""
        return library_class("transformers", "CLIPModel")

    @classmethod
    def supports(cls, model: nn.Module) -> Optional[str]:
        model_class = cls.model_class()
        if model_class is None:  # pragma: no cover
            return "transformers is not installed"
        return scorer_problem(model, model_class, cls.tower, *cls.scorer_names)

    @classmethod
    def signature_of(cls, model: Any) -> tuple:
        tower = cls.tower_of(model.clip)
        return (cls.tower, len(tower.encoder.layers), int(tower.config.num_attention_heads))

    # ------------------------------------------------------------------ structure
    def projection(self) -> nn.Linear:
        """The linear map from the pooled, normed token to the joint embedding space."""
        raise NotImplementedError

    # ------------------------------------------------------------------ forward pieces
    def attention_config(self) -> Any:
        return self.config   # the tower's own config: the other tower keeps its attention implementation

    def pooled(self, hidden: Tensor, context: SequenceContext) -> Tensor:
        """The normed read-out token ``[B, D]`` (before the projection)."""
        raise NotImplementedError

    def embedding(self, hidden: Tensor, context: SequenceContext) -> Tensor:
        return self.projection()(self.pooled(hidden, context))

    # ------------------------------------------------------------------ where methods hook
    recording = Capability(lambda adapter: CLIPRecording(adapter))


    def linears(self, layer: int) -> BlockLinears:
        attn, mlp = self.blocks[layer].self_attn, self.blocks[layer].mlp
        return BlockLinears(AttentionLinears(out=attn.out_proj, q=attn.q_proj, k=attn.k_proj, v=attn.v_proj),
                            (mlp.fc1, mlp.fc2))

    decomposition = Capability(CLIPDecomposition)



class _HFPatchVision:
    """What transformers' CLIP-like vision towers (CLIP, SigLIP) share: the config's channels and square patches,
    the patch convolution (``embeddings.patch_embedding``) as the input embedding, its products summed over the
    width per patch, and images of exactly the config's ``image_size`` (no position interpolation). Listed before
    :class:`~methods.adapters.base.ImageAdapter` in a subclass's bases."""

    tower = "vision"
    tower_model: Any
    config: Any
    #: the model's name in the image-size message
    model_name = "CLIP"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)  # type: ignore[call-arg]  # the adapter base, next in a subclass's bases
        self.num_channels = int(self.config.num_channels)
        self.patch_size = (int(self.config.patch_size),) * 2

    def image_size_problem(self, size: Tuple[int, int]) -> Optional[str]:
        side = int(self.config.image_size)
        if size != (side, side):
            return f"image size {size} does not match the {self.model_name} vision tower's image_size {side}x{side}"
        return None


@register_adapter
class HFCLIPVisionAdapter(_HFPatchVision, LensImageAdapter, _HFCLIPTower):
    """The vision tower of a stock ``transformers.CLIPModel`` behind a scorer with ``clip_tower = "vision"``
    (``models.clip.ZeroShotClassifier``). Inputs (:class:`~methods.adapters.base.ImageAdapter`): images
    ``[B, 3, S, S]`` at the model's ``image_size``, as ``CLIPProcessor`` returns them. Read-out: [CLS] through
    ``post_layernorm`` and ``visual_projection``. Layout: ``PatchGrid(S/p, S/p, prefix=1)``. Integrated gradients
    scale the normalised pixels (the all-zero normalised image as baseline, BI's ``Interpretor.py``)."""

    rule_map = Capability(CLIPVisionRules)

    family = "transformers CLIPModel vision tower (ZeroShotClassifier)"
    readout: Capability[ReadOut] = Capability(lambda adapter: ReadOut(adapter, "class_token"))

    def projection(self) -> nn.Linear:
        return self.clip.visual_projection

    def embed(self, inputs: ModelInputs) -> Tensor:
        """``CLIPVisionEmbeddings`` (patches, [CLS], positions), then ``pre_layrnorm``."""
        tower = self.tower_model
        return tower.pre_layrnorm(tower.embeddings(inputs["pixel_values"]))

    def pooled(self, hidden: Tensor, context: SequenceContext) -> Tensor:
        return self.tower_model.post_layernorm(hidden[:, 0, :])


def eos_positions(input_ids: Tensor, eos_token_id: int) -> Tensor:
    """Each sample's pooled position as ``CLIPTextModel`` finds it: the first ``eos_token_id``; for legacy configs
    with ``eos_token_id == 2`` the argmax of the ids (OpenAI's EOT is the largest id)."""
    if eos_token_id == 2:
        return input_ids.argmax(dim=-1)
    return (input_ids == eos_token_id).int().argmax(dim=-1)


class _HFTokenText(_ScaledTokenText):
    """What transformers' CLIP-like text towers (CLIP, SigLIP) share: ``embeddings.token_embedding`` as the input
    embedding, the embeddings with the token scale of ``inputs.interpolate``, and the batch's tensors. Listed first
    in a subclass's bases."""

    tower_model: Any

    def token_batch(self, inputs: Mapping[str, Any], ids: Tensor, mask: Tensor, positions: Tensor,
                    sample_ids: SampleIds) -> ModelInputs:
        """The batch of the checked ``ids`` (long) and ``mask``, the ``special_tokens_mask`` of ``inputs`` (checked)
        when given, and the read-out ``positions``; scores in the token embedding's dtype."""
        tensors = {"input_ids": ids, "attention_mask": mask}
        special = inputs.get("special_tokens_mask")
        if special is not None:
            tensors["special_tokens_mask"] = check_ids_like("special_tokens_mask", special, ids.shape).long()
        tensors[READOUT_POSITIONS] = positions
        batch = int(ids.shape[0])
        return ModelInputs(tensors, batch, self.tower_model.embeddings.token_embedding.weight.dtype, ids.device,
                           check_sample_ids(sample_ids, batch))

    def embed(self, inputs: ModelInputs) -> Tensor:
        """The tower's ``embeddings`` (token + position embeddings); with the per-sample ``token_embedding_scale``
        set by ``inputs.interpolate``, the token embeddings are scaled before the positions are added."""
        embeddings = self.tower_model.embeddings
        scale = inputs.tensors.get(TOKEN_EMBEDDING_SCALE)
        if scale is None:
            return embeddings(input_ids=inputs["input_ids"])
        tokens = embeddings.token_embedding(inputs["input_ids"])
        return embeddings(inputs_embeds=scale.to(tokens.dtype)[:, None, None] * tokens)


@register_adapter
class HFCLIPTextAdapter(_HFTokenText, _HFCLIPTower):
    """The text tower of a stock ``transformers.CLIPModel`` behind a scorer with ``clip_tower = "text"``
    (``models.clip.PromptScorer``). Inputs: a mapping as ``CLIPTokenizer`` returns it (``input_ids`` ``[T, N]``,
    optional ``attention_mask`` with the real tokens first, optional ``special_tokens_mask``) or an ``input_ids``
    tensor. Read-out ``"position"``: each sample's EOS token (the row the references read: MM's ``interpret`` and
    BI's ``interpret_ours`` take ``R_text[EOT]``). Layout: ``[T, N]`` scores, exactly 0 at padding.
    Integrated gradients scale the token embeddings before the position embeddings are added (BI's
    ``CLIP.ipynb``: ``encode_text(text, scale)``: ``x = scale * token_embedding(text)``)."""

    rule_map = Capability(CLIPTextRules)
    inputs = Capability(lambda adapter: CLIPTextInputs(adapter))

    family = "transformers CLIPModel text tower (PromptScorer)"

    def projection(self) -> nn.Linear:
        return self.clip.text_projection

    @property
    def eos_token_id(self) -> int:
        return int(self.tower_model.eos_token_id)

    def block_mask(self, hidden: Tensor, context: SequenceContext) -> Optional[Tensor]:
        """The causal mask combined with the padding mask, as ``CLIPTextModel`` builds it for the current
        attention implementation."""
        from transformers.masking_utils import create_causal_mask

        mask = context.attention_mask
        return create_causal_mask(config=self.config, inputs_embeds=hidden,
                                  attention_mask=None if mask is None else mask.to(hidden.device), cache=None)

    def block_kwargs(self) -> Dict[str, Any]:
        return {"is_causal": True}

    def pooled(self, hidden: Tensor, context: SequenceContext) -> Tensor:
        return at_readout_positions(self.tower_model.final_layer_norm(hidden), context)


class ScaledTokenInputs(InputFormat):
    """What the CLIP-like text towers' inputs share (:class:`_ScaledTokenText`): token ids read out at one position
    per text; integrated gradients scale the token embeddings before the position embeddings are added."""

    layout_class = TokenSequence

    def interpolate(self, inputs: ModelInputs, alphas: Tensor) -> ModelInputs:
        """``S * B`` samples, step-major, whose token embeddings are multiplied by ``alpha`` before the position
        embeddings are added."""
        return scaled_copies(inputs, alphas, TOKEN_EMBEDDING_SCALE)


class HFTokenTextInputs(ScaledTokenInputs):
    """What the inputs of transformers' CLIP-like text towers share (:class:`_HFTokenText`): the attention mask and
    the read-out positions as the context."""

    def context(self, inputs: ModelInputs) -> SequenceContext:
        return SequenceContext(attention_mask=inputs["attention_mask"], readout_positions=inputs[READOUT_POSITIONS])


class CLIPTextInputs(HFTokenTextInputs):
    """The inputs of :class:`HFCLIPTextAdapter`: right padding, each text read at its EOS token."""

    adapter: "HFCLIPTextAdapter"

    def prepare(self, inputs: RawInputs, sample_ids: SampleIds = None) -> ModelInputs:
        adapter = self.adapter
        inputs, ids, mask = check_token_inputs(inputs, adapter.family, int(adapter.config.vocab_size),
                                                int(adapter.config.max_position_embeddings), batch="T",
                                                positions_of="the CLIP text tower's")
        shape = ids.shape
        ids = ids.long()
        eos = eos_positions(ids, adapter.eos_token_id)
        rows = torch.arange(shape[0], device=ids.device)
        if adapter.eos_token_id != 2:
            missing = (ids[rows, eos] != adapter.eos_token_id).nonzero().flatten()
            if len(missing):
                raise ValueError(f"input_ids: samples {missing.tolist()} hold no EOS token (id "
                                 f"{adapter.eos_token_id}); CLIP reads each text at its EOS position")
        if bool((mask[:, 1:] > mask[:, :-1]).any()):
            raise ValueError("attention_mask: the real tokens must come first (right padding); CLIP's absolute "
                             "positions make left padding change the text")
        if not bool(mask[rows, eos].all()):
            raise ValueError("attention_mask: the EOS token (the read-out) is padding in some sample")
        return adapter.token_batch(inputs, ids, mask, eos, sample_ids)

    def layout(self, inputs: Union[ModelInputs, RawInputs]) -> TokenSequence:
        if not isinstance(inputs, ModelInputs):
            inputs = self.prepare(inputs)
        mask = inputs["attention_mask"]
        eos = inputs[READOUT_POSITIONS]
        positions = torch.arange(mask.shape[1], device=mask.device)[None, :]
        special = inputs.tensors.get("special_tokens_mask")
        if special is None:
            special = (positions == 0) | (positions == eos[:, None])
        content = mask.bool() & ~special.bool() & (positions < eos[:, None])
        return TokenSequence(attention_mask=mask, content_mask=content)




class CLIPPostAttentionValues(ValueRecorder):
    """Beyond Intuition's CLIP token scale reads every CLIP / SigLIP tower's blocks."""

    def __call__(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        """Beyond Intuition's CLIP token scale reads ``v`` of ``layer_norm1`` applied to the residual stream
        **after** the attention sub-layer (``CLIP/CLIP/clip/model.py``: ``vproj_cal(self.ln_1(x))`` after
        ``x = x + attention(...)``), not of the attention input: record that ``[B, N, D]`` value projection
        (heads merged, bias included). Computed from the input of ``layer_norm2`` (the post-attention stream),
        without changing the forward."""
        block = self.adapter.blocks[layer]

        def hook(_module: nn.Module, args: Tuple[Any, ...]) -> None:
            with torch.no_grad():
                rec.outputs[key] = block.self_attn.v_proj(block.layer_norm1(args[0]))

        rec._handles.append(block.layer_norm2.register_forward_pre_hook(hook))


class CLIPRecording(HFRecording):
    """Where methods hook in a CLIP (or SigLIP) tower."""

    value_edit = Capability(lambda recording: ProjectionValueEdit(recording.adapter))
    post_attention_values = Capability(lambda recording: CLIPPostAttentionValues(recording.adapter))

    def attention(self, rec: ActivationRecorder, layer: int, key: Hashable, require_grad: bool = False,
                  transform: Optional[Callable[[Tensor], Tensor]] = None) -> None:
        """The probabilities returned by ``CLIPAttention`` (``(attn_output, attn_weights)`` in eager mode; after
        dropout, identity in eval), the tensor MM's and BI's CLIP code hook. ``require_grad`` needs autograd
        recorded from this block on (see :meth:`forward`)."""
        rec.output(self.adapter.blocks[layer].self_attn, key, transform=transform, index=1, require_grad=require_grad)

    def values(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        rec.output(self.adapter.blocks[layer].self_attn.v_proj, key)

    def attention_input(self, rec: ActivationRecorder, layer: int, key: Hashable,
                        require_grad: bool = False) -> None:
        rec.output(self.adapter.blocks[layer].layer_norm1, key, require_grad=require_grad)
