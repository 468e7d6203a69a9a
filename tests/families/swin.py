"""Swin Transformer V1 classifiers of the conformance matrix: a tiny timm ``SwinTransformer`` and a tiny
transformers ``SwinForImageClassification`` of the same shape (32 px images, 2 px patches: a 16x16 grid in
stage 1, 8x8 in stage 2 after the patch merge; 4x4 windows, shifted in every second block; widths 16 / 32, heads
2 / 4, 5 classes, average pooling). Both stages are windowed, so the last stage's maps are block-diagonal."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from .base import NO_SCORE_EDIT, NO_VALUE_EDIT, Family

#: the methods without an LRP topology for Swin, and token ablation
UNDEFINED = {
    "lrp": "no LRP topology for model class",
    "partial_lrp": "no LRP topology for model class",
    "lrp_rollout": "no LRP topology for model class",
    "transformer_attribution": "no LRP topology for model class",
    "token_ablation": ("its window partition, shift masks and 2x2 patch merges need every position of the grid, "
                       "so a removed patch has no place to be left out of"),
    **NO_SCORE_EDIT,
}
#: Beyond Intuition read from the last stage's first block (block 2): it composes full matrices, defined in the
#: read-out's token space only
OPTIONS = {"beyond_intuition_head": {"start_layer": 2, "steps": 4},
           "beyond_intuition_token": {"start_layer": 2, "steps": 4}}


def _perturbed(model: nn.Module, scale: float = 0.3, bias_free: bool = False) -> nn.Module:
    """Random weights large enough for peaked attention; ``bias_free``: every bias and relative position table
    zero (the shift masks stay)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(scale * torch.randn_like(p))
            if bias_free and (name.endswith("bias") or "relative_position_bias_table" in name):
                p.zero_()
    return model.double().eval()


def tiny_timm_swin(seed: int = 0, bias_free: bool = False) -> nn.Module:
    from timm.models.swin_transformer import SwinTransformer

    torch.manual_seed(seed)
    return _perturbed(SwinTransformer(img_size=32, patch_size=2, window_size=4, embed_dim=16, depths=(2, 2),
                                      num_heads=(2, 4), num_classes=5, drop_path_rate=0.0), bias_free=bias_free)


def tiny_hf_swin(seed: int = 0, bias_free: bool = False) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = transformers.SwinConfig(image_size=32, patch_size=2, num_channels=3, embed_dim=16, depths=[2, 2],
                                     num_heads=[2, 4], window_size=4, num_labels=5, drop_path_rate=0.0)
    return _perturbed(transformers.SwinForImageClassification(config), bias_free=bias_free)


def swin_images(batch: int) -> Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch), dtype=torch.float64)


def _swin_family(name: str, library: str) -> Family:
    from methods.families.swin import HFSwinAdapter, TimmSwinAdapter

    hf = library == "transformers"
    return Family(
        name=name, adapter=HFSwinAdapter if hf else TimmSwinAdapter, build=tiny_hf_swin if hf else tiny_timm_swin,
        inputs=swin_images, single=lambda x, i: x[i:i + 1],
        shape=lambda x, pixels: (x.shape[0], 32, 32) if pixels else (x.shape[0], 64),
        options=OPTIONS, undefined={**UNDEFINED, **NO_VALUE_EDIT}, eager_softmax_float32=hf,
        logits=(lambda model, x: model(x).logits) if hf else (lambda model, x: model(x)),
    )


FAMILIES = [
    _swin_family("timm_swin", "timm"),
    _swin_family("hf_swin", "transformers"),
]
