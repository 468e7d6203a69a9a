"""timm's distilled DeiT and the Hugging Face ViT-like image classifiers (ViT, DeiT, DeiT with teacher, DINOv2,
DINOv2 with registers) as rows of the conformance matrix: 32 px images, 8 px patches, width 24, 3 blocks."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from .base import Family
from .vision import _images

#: the shared size of the tiny models
TINY = dict(hidden_size=24, num_hidden_layers=3, num_attention_heads=2, image_size=32, patch_size=8, num_labels=5)


def _perturbed(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.double().eval()


def _tiny_timm_deit() -> nn.Module:
    from timm.models.deit import VisionTransformerDistilled

    torch.manual_seed(0)
    return _perturbed(VisionTransformerDistilled(img_size=32, patch_size=8, embed_dim=24, depth=3, num_heads=2,
                                                 num_classes=5))


def _tiny_hf(kind: str) -> nn.Module:
    """A tiny random transformers image classifier: ``vit``, ``deit``, ``deit_teacher``, ``dinov2``,
    ``dinov2_swiglu`` or ``dinov2_registers`` (2 registers)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "vit":
        model = transformers.ViTForImageClassification(transformers.ViTConfig(intermediate_size=48, **TINY))
    elif kind in ("deit", "deit_teacher"):
        config = transformers.DeiTConfig(intermediate_size=48, **TINY)
        model = (transformers.DeiTForImageClassification(config) if kind == "deit"
                 else transformers.DeiTForImageClassificationWithTeacher(config))
    elif kind in ("dinov2", "dinov2_swiglu"):
        config = transformers.Dinov2Config(mlp_ratio=2, use_swiglu_ffn=kind == "dinov2_swiglu", **TINY)
        model = transformers.Dinov2ForImageClassification(config)
    elif kind == "dinov2_registers":
        config = transformers.Dinov2WithRegistersConfig(mlp_ratio=2, num_register_tokens=2, **TINY)
        model = transformers.Dinov2WithRegistersForImageClassification(config)
    else:
        raise ValueError(kind)
    return _perturbed(model)


def _families() -> list:
    from methods.families.hf_vit import (
        HFDeiTAdapter,
        HFDeiTWithTeacherAdapter,
        HFDinov2Adapter,
        HFDinov2WithRegistersAdapter,
        HFViTAdapter,
    )
    from methods.families.timm_deit import TimmDeiTAdapter

    options = {"beyond_intuition_head": {"start_layer": 1, "steps": 4},
               "beyond_intuition_token": {"start_layer": 1, "steps": 4}}

    def row(name, adapter, build, **kwargs):
        return Family(name=name, adapter=adapter, build=build, inputs=_images, single=lambda x, i: x[i:i + 1],
                      shape=lambda x, pixels: (x.shape[0], 32, 32) if pixels else (x.shape[0], 16),
                      options=options, **kwargs)

    def hf(name, adapter, kind, float32_softmax=True, **kwargs):
        return row(name, adapter, lambda: _tiny_hf(kind), logits=lambda model, x: model(x).logits,
                   eager_softmax_float32=float32_softmax, **kwargs)

    return [
        row("timm_deit_distilled", TimmDeiTAdapter, _tiny_timm_deit),
        hf("hf_vit", HFViTAdapter, "vit"),
        hf("hf_deit", HFDeiTAdapter, "deit"),
        hf("hf_deit_teacher", HFDeiTWithTeacherAdapter, "deit_teacher"),
        # DINOv2's eager attention takes its softmax in the model's dtype (ViT's and DeiT's in float32)
        hf("hf_dinov2", HFDinov2Adapter, "dinov2", float32_softmax=False),
        hf("hf_dinov2_registers", HFDinov2WithRegistersAdapter, "dinov2_registers", float32_softmax=False),
    ]


FAMILIES = _families()
