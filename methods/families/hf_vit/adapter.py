"""Adapters for the stock Hugging Face ``transformers`` ViT-like image classifiers: ``ViTForImageClassification``,
``DeiTForImageClassification`` (with teacher), ``Dinov2ForImageClassification`` (with registers). One shared
machinery (:class:`HFViTLikeAdapter`), one small subclass per model class naming its prefix tokens, read-out
(``class_token``, or ``weighted`` where the classifier reads several rows) and classifier(s). Prefix tokens are
never scored.

Design notes: ``NOTES.md`` beside this file (adapter.py).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Hashable, Iterator, List, Optional, Tuple

import torch
from torch import Tensor, nn

from ...adapters.base import (
    AttentionEdit,
    AttentionLinears,
    BlockDecomposition,
    BlockLinears,
    Layout,
    ModelInputs,
    ReadOut,
    SequenceContext,
    register_adapter,
)
from ...adapters.capability import Capability
from ...adapters.lens import LensImageAdapter
from ...adapters.library import class_problem
from ...adapters.recorder import ActivationRecorder
from ...adapters.value_edits import ProjectionValueEdit
from ..hf_blocks import HFEncoderBlocks, HFRecording
from ..hf_implementation import attention_implementation
from ..hf_score_edit import eager_scores, score_edited_attention
from .rules import Dinov2Rules, ViTLikeRules

#: the attention implementation the adapters here switch to for methods that read the probabilities
MATERIALISED_ATTENTION = "token_attributions_eager"


def materialised_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                           attention_mask: Optional[Tensor], scaling: Optional[float] = None, dropout: float = 0.0,
                           **_kwargs: Any) -> Tuple[Tensor, Tensor]:
    """transformers' eager attention (``[B, H, N, d]`` query, key, value; additive mask) with the softmax in
    ``promote_types(query.dtype, float32)``: returns ``(A @ v`` with heads last, ``A``)."""
    scores = eager_scores(query, key, scaling)
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = nn.functional.softmax(scores, dim=-1, dtype=torch.promote_types(query.dtype, torch.float32))
    probs = nn.functional.dropout(probs.to(query.dtype), p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


class ViTLikeDecomposition(BlockDecomposition):
    """Pre-norm ``x + o_proj(attention(norm(x)))`` (DINOv2: times ``layer_scale1``)."""

    adapter: "HFViTLikeAdapter"

    def block_norms(self, layer: int) -> Tuple[nn.Module, nn.Module]:
        """Pre-norm: ``layernorm_before``, ``layernorm_after`` (DINOv2: ``norm1``, ``norm2``)."""
        block = self.adapter.blocks[layer]
        return self.adapter.attention_norm(layer), block.norm2 if hasattr(block, "norm2") else block.layernorm_after

    def attention_output_scale(self, layer: int) -> Optional[Tensor]:
        """DINOv2's ``layer_scale1.lambda1`` (``None`` for ViT and DeiT)."""
        scale = getattr(self.adapter.blocks[layer], "layer_scale1", None)
        return None if scale is None else scale.lambda1


class HFViTLikeAdapter(LensImageAdapter, HFEncoderBlocks):
    """Shared machinery of the Hugging Face ViT-like image classifiers (see the module docstring). A subclass
    names its model class (``model_class``), the attribute of its backbone (``backbone_attr``), its prefix
    tokens and read-out, and its :meth:`head`."""

    rule_map = Capability(ViTLikeRules)

    model_class = "?"
    backbone_attr = "?"
    readout: Capability[ReadOut] = Capability(lambda adapter: ReadOut(adapter, "class_token", True))
    #: whether the model refuses images of another size than its config's ``image_size``
    fixed_image_size = True

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        config: Any = self.model.config
        self.backbone: Any = getattr(model, self.backbone_attr)
        self.config = config
        self.blocks = list(self.layers_of(self.backbone))
        patch = config.patch_size
        self.patch_size = (int(patch), int(patch)) if isinstance(patch, int) else (int(patch[0]), int(patch[1]))
        self.num_channels = int(config.num_channels)
        self.num_prefix_tokens = self.prefix_tokens_of(config)

    # ------------------------------------------------------------------ which models
    @staticmethod
    def layers_of(backbone: Any) -> nn.ModuleList:
        """The backbone's blocks (``layers`` in transformers >= 5, ``encoder.layer`` before and in DINOv2)."""
        layers = getattr(backbone, "layers", None)
        return layers if layers is not None else backbone.encoder.layer

    @classmethod
    def prefix_tokens_of(cls, config: Any) -> int:
        return 1

    @classmethod
    def supports(cls, model: nn.Module) -> Optional[str]:
        return class_problem(model, "transformers", cls.model_class)

    @classmethod
    def signature_of(cls, model: Any) -> tuple:
        backbone = getattr(model, cls.backbone_attr)
        return (cls.model_class, len(cls.layers_of(backbone)), cls.prefix_tokens_of(model.config))

    # ------------------------------------------------------------------ structure
    def image_size_problem(self, size: Tuple[int, int]) -> Optional[str]:
        (ph, pw), (h, w) = self.patch_size, size
        if self.fixed_image_size:
            side = self.config.image_size
            expected = (int(side), int(side)) if isinstance(side, int) else (int(side[0]), int(side[1]))
            if size != expected:
                return (f"image size {size} does not match the {self.model_class}'s image_size "
                        f"{expected[0]}x{expected[1]}")
        if h % ph or w % pw:
            return f"image size {size} is not a multiple of the patch size {ph}x{pw}"
        return None

    # ------------------------------------------------------------------ forward pieces (the model's own order)
    def embed(self, inputs: ModelInputs) -> Tensor:
        """The backbone's embeddings (patches, prefix tokens, positional embedding; pixels in the patch
        projection's dtype, as the model casts them)."""
        embeddings = self.backbone.embeddings
        pixels = inputs["pixel_values"]
        return embeddings(pixels.to(embeddings.patch_embeddings.projection.weight.dtype))

    def block_mask(self, hidden: Tensor, context: SequenceContext) -> Optional[Tensor]:
        """The mask the backbone builds for an image batch (``create_bidirectional_mask`` without an attention
        mask: ``None``)."""
        from transformers.masking_utils import create_bidirectional_mask

        return create_bidirectional_mask(config=self.config, inputs_embeds=hidden, attention_mask=None)

    def final_norm(self) -> nn.Module:
        """The backbone's ``layernorm`` after the last block."""
        return self.backbone.layernorm

    def classifiers(self) -> List[nn.Module]:
        """The classifier layers the head applies (one; two for DeiT with teacher)."""
        return [self.model.classifier]

    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """Final ``layernorm``, the [CLS] token and ``classifier``."""
        pooled = self.final_norm()(hidden)[:, 0, :]
        return pooled if pre_logits else self.model.classifier(pooled)

    # ------------------------------------------------------------------ where methods hook
    recording = Capability(lambda adapter: ViTLikeRecording(adapter))

    def attention_norm(self, layer: int) -> nn.Module:
        """The norm before block ``layer``'s attention."""
        return self.blocks[layer].layernorm_before

    def linears(self, layer: int) -> BlockLinears:
        attn, mlp = self.blocks[layer].attention, self.blocks[layer].mlp
        up_down = (mlp.up_proj, mlp.down_proj) if hasattr(mlp, "down_proj") else (mlp.fc1, mlp.fc2)  # DINOv2's SwiGLU
        return BlockLinears(AttentionLinears(out=attn.o_proj, q=attn.q_proj, k=attn.k_proj, v=attn.v_proj), up_down)

    # ------------------------------------------------------------------ attention implementation


    decomposition = Capability(ViTLikeDecomposition)


@register_adapter
class HFViTAdapter(HFViTLikeAdapter):
    """Stock ``transformers.ViTForImageClassification``: read-out [CLS] (see the module docstring)."""

    family = "transformers ViTForImageClassification"
    model_class = "ViTForImageClassification"
    backbone_attr = "vit"


@register_adapter
class HFDeiTAdapter(HFViTLikeAdapter):
    """Stock ``transformers.DeiTForImageClassification``: prefix [CLS] and distillation token (never scored);
    read-out [CLS] only (the classifier does not read the distillation token)."""

    family = "transformers DeiTForImageClassification"
    model_class = "DeiTForImageClassification"
    backbone_attr = "deit"

    @classmethod
    def prefix_tokens_of(cls, config: Any) -> int:
        return 2


@register_adapter
class HFDeiTWithTeacherAdapter(HFDeiTAdapter):
    """Stock ``transformers.DeiTForImageClassificationWithTeacher``: the mean of ``cls_classifier([CLS])`` and
    ``distillation_classifier(dist)``; read-out ``"weighted"``, rows 0 and 1 with 1/2 each; prefix tokens never
    scored."""

    family = "transformers DeiTForImageClassificationWithTeacher"
    model_class = "DeiTForImageClassificationWithTeacher"
    readout: Capability[ReadOut] = Capability(lambda adapter: ReadOut(adapter, "weighted", True,
                                                                      adapter.readout_weights))

    def readout_weights(self, inputs: ModelInputs, layout: Layout) -> Tensor:
        weights = torch.zeros(layout.num_positions)
        weights[:2] = 0.5
        return weights.expand(inputs.batch_size, -1)

    def classifiers(self) -> List[nn.Module]:
        return [self.model.cls_classifier, self.model.distillation_classifier]

    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """Final ``layernorm``, the two classifiers on [CLS] and the distillation token, their mean
        (``pre_logits``: the mean of the two tokens)."""
        normed = self.final_norm()(hidden)
        if pre_logits:
            return (normed[:, 0, :] + normed[:, 1, :]) / 2
        m = self.model
        return (m.cls_classifier(normed[:, 0, :]) + m.distillation_classifier(normed[:, 1, :])) / 2


@register_adapter
class HFDinov2Adapter(HFViTLikeAdapter):
    """Stock ``transformers.Dinov2ForImageClassification``: ``classifier([CLS] ++ mean of the patch tokens)``;
    read-out ``"weighted"``: the [CLS] row 1/2, the mean patch row 1/2. Any image size that is a multiple of the
    patch size. A SwiGLU MLP (``use_swiglu_ffn``) is a gated MLP for AttnLRP."""

    rule_map = Capability(Dinov2Rules)

    family = "transformers Dinov2ForImageClassification"
    model_class = "Dinov2ForImageClassification"
    backbone_attr = "dinov2"
    readout: Capability[ReadOut] = Capability(lambda adapter: ReadOut(adapter, "weighted", True,
                                                                      adapter.readout_weights))
    fixed_image_size = False

    def readout_weights(self, inputs: ModelInputs, layout: Layout) -> Tensor:
        weights = torch.zeros(layout.num_positions)
        weights[0] = 0.5
        weights[self.num_prefix_tokens:] = 0.5 / (layout.num_positions - self.num_prefix_tokens)
        return weights.expand(inputs.batch_size, -1)

    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """Final ``layernorm``, ``[CLS] ++ mean of the patch tokens`` (prefix tokens left out), ``classifier``."""
        normed = self.final_norm()(hidden)
        latent = torch.cat([normed[:, 0], normed[:, self.num_prefix_tokens:].mean(dim=1)], dim=1)
        return latent if pre_logits else self.model.classifier(latent)

    def attention_norm(self, layer: int) -> nn.Module:
        return self.blocks[layer].norm1


@register_adapter
class HFDinov2WithRegistersAdapter(HFDinov2Adapter):
    """Stock ``transformers.Dinov2WithRegistersForImageClassification``: as DINOv2, with ``num_register_tokens``
    registers after [CLS] (prefix tokens: [CLS] and the registers, never scored, not read by the classifier)."""

    family = "transformers Dinov2WithRegistersForImageClassification"
    model_class = "Dinov2WithRegistersForImageClassification"
    backbone_attr = "dinov2_with_registers"

    @classmethod
    def prefix_tokens_of(cls, config: Any) -> int:
        return 1 + int(config.num_register_tokens)


class ViTLikeScoreEdit(AttentionEdit):
    """The scores edited through the materialised attention."""

    adapter: "HFViTLikeAdapter"

    def __call__(self, edit: Callable[[int, Tensor], Tensor]) -> contextlib.AbstractContextManager[None]:
        """As :class:`~methods.families.hf_blocks.HFEncoderBlocks`, through :func:`materialised_attention` (the
        attention ``recording.eager_attention()`` runs: the softmax in the wider of float32 and the model's dtype)."""
        return score_edited_attention(self.adapter.attention_config(), self.adapter.blocks, edit,
                                      eager=materialised_attention)


class ViTLikeRecording(HFRecording):
    """Where methods hook in a transformers ViT, DeiT or DINOv2."""

    adapter: "HFViTLikeAdapter"
    value_edit = Capability(lambda recording: ProjectionValueEdit(recording.adapter))
    score_edit = Capability(lambda recording: ViTLikeScoreEdit(recording.adapter))

    def attention(self, rec: ActivationRecorder, layer: int, key: Hashable, require_grad: bool = False,
                  transform: Optional[Callable[[Tensor], Tensor]] = None) -> None:
        """The probabilities the attention module returns (``(output, weights)`` in eager mode; after dropout,
        identity in eval). ``require_grad`` needs autograd recorded from this block on (see :meth:`forward`)."""
        rec.output(self.adapter.blocks[layer].attention, key, transform=transform, index=1, require_grad=require_grad)

    def values(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        rec.output(self.adapter.blocks[layer].attention.v_proj, key)

    def attention_input(self, rec: ActivationRecorder, layer: int, key: Hashable,
                        require_grad: bool = False) -> None:
        rec.output(self.adapter.attention_norm(layer), key, require_grad=require_grad)

    @contextlib.contextmanager
    def eager_attention(self) -> Iterator[None]:
        """``_attn_implementation = MATERIALISED_ATTENTION`` on the config (module docstring), restored on exit."""
        with attention_implementation(self.adapter.attention_config(), MATERIALISED_ATTENTION, materialised_attention):
            yield
