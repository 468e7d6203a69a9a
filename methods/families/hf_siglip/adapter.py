"""Adapters for the two towers of a stock Hugging Face ``transformers.SiglipModel``.

Like a ``CLIPModel`` (:mod:`methods.families.hf_clip`), a ``SiglipModel`` scores image-text pairs and is explained
through a scorer holding it (``models.clip.ZeroShotClassifier``: images -> classes; ``models.clip.PromptScorer``:
texts -> images), read by the same protocol: ``model.clip`` (here the ``SiglipModel``), ``model.clip_tower``
(``"vision"`` / ``"text"``) and ``model.logits_from_embeddings(z)``: SigLIP's sigmoid logits ``logit_scale.exp() *
cos(z, e_c) + logit_bias`` against the scorer's fixed, normalised embeddings ``e_c``.

Both towers are CLIP's pre-norm encoder (``x + attn(layer_norm1(x))``, ``h + mlp(layer_norm2(h))``, separate
``q_proj``/``k_proj``/``v_proj``; ``SiglipEncoderLayer``), called in the order of ``SiglipVisionModel.forward`` /
``SiglipTextModel.forward``; the hook points and linears are CLIP's (the shared ``_HFCLIPTower``).

Design notes: ``NOTES.md`` beside this file (adapter.py).
"""
from __future__ import annotations

import weakref
from typing import Any, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from ...adapters.base import (
    Layout,
    ModelInputs,
    RawInputs,
    ReadOut,
    SampleIds,
    SequenceContext,
    TokenSequence,
    register_adapter,
)
from ...adapters.capability import Capability
from ...adapters.lens import LensImageAdapter
from ...adapters.library import library_class
from ...adapters.recorder import ActivationRecorder
from ...adapters.tokens import check_token_inputs
from ..hf_clip.adapter import HFTokenTextInputs, _HFCLIPTower, _HFPatchVision, _HFTokenText
from .rules import SiglipTextRules, SiglipVisionRules


class _HFSiglipTower(_HFCLIPTower):
    """What the two SigLIP towers share beyond CLIP's blocks: the model class and the scorer protocol."""

    scorer_names = ("a transformers SiglipModel", "a SigLIP scorer", "a SiglipModel")

    @staticmethod
    def model_class() -> Optional[type]:
        return library_class("transformers", "SiglipModel")


@register_adapter
class HFSiglipVisionAdapter(_HFPatchVision, LensImageAdapter, _HFSiglipTower):
    """The vision tower of a stock ``transformers.SiglipModel`` behind a scorer with ``clip_tower = "vision"``
    (``models.clip.ZeroShotClassifier``). Inputs: images ``[B, 3, S, S]`` at the model's ``image_size`` (as
    ``SiglipImageProcessor`` returns them; no position interpolation). Read-out ``"attention_pool"``: the attention
    pooling head (module docstring); :meth:`readout_weights` are its head-mean attention over the ``N`` patches.
    Layout: ``PatchGrid(S/p, S/p, prefix=0)``. Integrated gradients scale the normalised pixels (the all-zero
    normalised image as baseline)."""

    rule_map = Capability(SiglipVisionRules)

    family = "transformers SiglipModel vision tower (ZeroShotClassifier)"
    model_name = "SigLIP"
    readout: Capability[ReadOut] = Capability(lambda adapter: ReadOut(adapter, "attention_pool", None,
                                                                      adapter.readout_weights))
    num_prefix_tokens = 0

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        #: (the pixel tensor, its version, its read-out weights) of the last :meth:`readout_weights` call
        self._readout_cache: Optional[Tuple[Any, int, Tensor]] = None

    @classmethod
    def supports(cls, model: nn.Module) -> Optional[str]:
        reason = super().supports(model)
        clip: Any = getattr(model, "clip", None)
        if reason is None and not getattr(clip.vision_model, "use_head", False):
            return "the SiglipModel's vision tower has no pooling head (vision_use_head=False): no image embedding"
        return reason

    def pooling_head(self) -> Any:
        """``SiglipMultiheadAttentionPoolingHead``: ``probe``, ``attention`` (``nn.MultiheadAttention``),
        ``layernorm``, ``mlp``."""
        return self.tower_model.head

    def embed(self, inputs: ModelInputs) -> Tensor:
        """``SiglipVisionEmbeddings``: patches + position embeddings (no class token, no pre-norm)."""
        return self.tower_model.embeddings(inputs["pixel_values"])

    def embedding(self, hidden: Tensor, context: SequenceContext) -> Tensor:
        """``post_layernorm`` of every position, then the attention-pooling head (the stock module): the image
        embedding ``[B, D]``."""
        return self.pooling_head()(self.tower_model.post_layernorm(hidden))

    def forward(self, inputs: ModelInputs, grad_from_block: int = 0, pre_logits: bool = False) -> Tensor:
        """The model's logits (:meth:`ModelAdapter.forward`); with the blocks' attention in eager form (as the
        methods that read attention run), the pooling head's attention of this forward is kept as the
        :meth:`readout_weights` of ``inputs``, which then cost no forward of their own."""
        if self.attention_config()._attn_implementation != "eager":
            return super().forward(inputs, grad_from_block, pre_logits)
        with ActivationRecorder() as rec:
            attention: nn.Module = self.pooling_head().attention
            rec.output(attention, "pooling", index=1)
            logits = super().forward(inputs, grad_from_block, pre_logits)
        self._keep_readout_weights(inputs, rec["pooling"][:, 0, :].detach())
        return logits

    def _keep_readout_weights(self, inputs: ModelInputs, weights: Tensor) -> None:
        pixels = inputs["pixel_values"]
        self._readout_cache = (weakref.ref(pixels), pixels._version, weights)

    def readout_weights(self, inputs: ModelInputs, layout: Layout) -> Tensor:
        """``[B, N]``: the pooling head's attention of its probe over the positions, averaged over its heads
        (``nn.MultiheadAttention``'s second output in the stock head's call), from a forward with the blocks'
        attention in eager form (so that the weights do not depend on the attention implementation; the pooling
        head always materialises its probabilities): the last eager :meth:`forward` of the same pixel tensor
        (the method's own), else a forward without gradients of its own. Kept for the pixel tensor of ``inputs``
        until the next batch: a method reads its rows several times per batch."""
        pixels = inputs["pixel_values"]
        cached = self._readout_cache
        if cached is not None and cached[0]() is pixels and cached[1] == pixels._version:
            return cached[2]
        with torch.no_grad(), self.recording.eager_attention():
            self.forward(inputs, grad_from_block=len(self.blocks))
        assert self._readout_cache is not None, "an eager forward keeps the read-out weights"
        return self._readout_cache[2]


@register_adapter
class HFSiglipTextAdapter(_HFTokenText, _HFSiglipTower):
    """The text tower of a stock ``transformers.SiglipModel`` behind a scorer with ``clip_tower = "text"``
    (``models.clip.PromptScorer``). Inputs: a mapping as a tokenizer returns it (``input_ids`` ``[T, N]``,
    optional ``attention_mask``, optional ``special_tokens_mask``) or an ``input_ids`` tensor; SigLIP's texts are
    padded to ``max_length`` (module docstring). Read-out ``"position"``: the last position ``N - 1``. Layout:
    ``[T, N]`` scores, exactly 0 at masked padding. Integrated gradients scale the token embeddings before the
    position embeddings are added (as CLIP's text adapter)."""

    rule_map = Capability(SiglipTextRules)
    inputs = Capability(lambda adapter: SiglipTextInputs(adapter))

    family = "transformers SiglipModel text tower (PromptScorer)"

    def projection(self) -> nn.Linear:
        """``SiglipTextModel.head``: the Linear from the normed last position to the joint space."""
        return self.tower_model.head

    def special_ids(self) -> Tuple[int, ...]:
        """The config's ``pad_token_id`` and ``eos_token_id`` that lie in the vocabulary (SigLIP's: both
        ``</s>``)."""
        vocab = int(self.config.vocab_size)
        ids = (getattr(self.config, "pad_token_id", None), getattr(self.config, "eos_token_id", None))
        return tuple(int(i) for i in ids if i is not None and 0 <= int(i) < vocab)

    def block_mask(self, hidden: Tensor, context: SequenceContext) -> Optional[Tensor]:
        """The bidirectional padding mask as ``SiglipTextModel`` builds it for the current attention
        implementation (``None`` when every position is real, as for a text without ``attention_mask``)."""
        from transformers.masking_utils import create_bidirectional_mask

        mask = context.attention_mask
        if mask is None or bool(mask.all()):
            mask = None
        return create_bidirectional_mask(config=self.config, inputs_embeds=hidden,
                                         attention_mask=None if mask is None else mask.to(hidden.device))

    def pooled(self, hidden: Tensor, context: SequenceContext) -> Tensor:
        """``final_layer_norm``, then the last position (``SiglipTextModel``: ``last_hidden_state[:, -1, :]``)."""
        return self.tower_model.final_layer_norm(hidden)[:, -1, :]


class SiglipTextInputs(HFTokenTextInputs):
    """The inputs of :class:`HFSiglipTextAdapter`: texts padded to ``max_length``, each read at its last position."""

    adapter: "HFSiglipTextAdapter"

    def prepare(self, inputs: RawInputs, sample_ids: SampleIds = None) -> ModelInputs:
        inputs, ids, mask = check_token_inputs(inputs, self.adapter.family, int(self.adapter.config.vocab_size),
                                                int(self.adapter.config.max_position_embeddings), batch="T",
                                                positions_of="the SigLIP text tower's")
        shape = ids.shape
        empty = (mask.sum(dim=1) == 0).nonzero().flatten()
        if len(empty):
            raise ValueError(f"attention_mask: samples {empty.tolist()} have no real token")
        last = torch.full((shape[0],), shape[1] - 1, dtype=torch.long, device=ids.device)
        return self.adapter.token_batch(inputs, ids.long(), mask, last, sample_ids)

    def layout(self, inputs: Union[ModelInputs, RawInputs]) -> TokenSequence:
        if not isinstance(inputs, ModelInputs):
            inputs = self.prepare(inputs)
        mask, ids = inputs["attention_mask"], inputs["input_ids"]
        special = inputs.tensors.get("special_tokens_mask")
        if special is None:
            special = torch.zeros_like(ids, dtype=torch.bool)
            for token in self.adapter.special_ids():
                special |= ids == token
        return TokenSequence(attention_mask=mask, content_mask=mask.bool() & ~special.bool())

    def drop_positions(self, hidden: Tensor, context: SequenceContext,
                       removed: Tensor) -> Tuple[Tensor, SequenceContext]:
        """As the base class; the read-out stays the last position (``N - 2`` of the shortened texts), as the
        model reads it."""
        shortened, short = super().drop_positions(hidden, context, removed)
        positions = torch.full((shortened.shape[0],), shortened.shape[1] - 1, dtype=torch.long,
                               device=hidden.device)
        return shortened, SequenceContext(short.attention_mask, positions, short.position_ids)
