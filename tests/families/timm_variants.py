"""timm ``VisionTransformer`` variants of the conformance matrix: register tokens (DINOv2-reg), no class token with
average pooling and no ``fc_norm`` (with ``fc_norm``: ``vision.py``'s ``timm_vit_avgpool``), and attention pooling
with a learned query (``global_pool='map'``, SigLIP's towers)."""
from __future__ import annotations

import torch
from torch import nn

from .base import Family
from .vision import _images


def _tiny_variant(**kwargs) -> nn.Module:
    """A tiny random float64 timm ``VisionTransformer`` (32 px, 8 px patches, 3 blocks, width 24) with ``kwargs``."""
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=3, num_heads=2, num_classes=5,
                              **kwargs)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.double()


def _variant_family(name: str, undefined: dict = None, **kwargs) -> Family:
    from methods.families.timm_vit import TimmViTAdapter

    return Family(
        name=name, adapter=TimmViTAdapter, build=lambda: _tiny_variant(**kwargs), inputs=_images,
        single=lambda x, i: x[i:i + 1],
        shape=lambda x, pixels: (x.shape[0], 32, 32) if pixels else (x.shape[0], 16),
        options={"beyond_intuition_head": {"start_layer": 1, "steps": 4},
                 "beyond_intuition_token": {"start_layer": 1, "steps": 4}},
        undefined=dict(undefined or {}),
    )


FAMILIES = [
    # DINOv2-reg (vit_small_patch14_reg4_dinov2): [CLS] + 4 registers, positions on the patches only, layer scale
    _variant_family("timm_vit_reg4_dinov2", class_token=True, reg_tokens=4, no_embed_class=True, init_values=0.5),
    # no class token: timm's pool averages the patches (the registers left out), the final norm before the mean
    # (fc_norm=False; fc_norm after the mean, timm's default for average pooling, is the row timm_vit_avgpool)
    _variant_family("timm_vit_reg4_avg", class_token=False, reg_tokens=4, global_pool="avg", fc_norm=False),
    # attention pooling with a learned query (AttentionPoolLatent), 2 registers the pool does not read
    _variant_family("timm_vit_map_reg2", class_token=False, reg_tokens=2, global_pool="map"),
]
