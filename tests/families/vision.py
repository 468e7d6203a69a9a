"""timm ``VisionTransformer`` families of the conformance matrix."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import Family


def _tiny_vit(global_pool: str) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=3, num_heads=2, num_classes=5,
                              global_pool=global_pool, class_token=True)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.double()


def _images(batch: int) -> Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch), dtype=torch.float64)


def _image_family(name: str, global_pool: str) -> Family:
    from methods.families.timm_vit import TimmViTAdapter

    return Family(
        name=name, adapter=TimmViTAdapter, build=lambda: _tiny_vit(global_pool), inputs=_images,
        single=lambda x, i: x[i:i + 1],
        shape=lambda x, pixels: (x.shape[0], 32, 32) if pixels else (x.shape[0], 16),
        options={"beyond_intuition_head": {"start_layer": 1, "steps": 4},
                 "beyond_intuition_token": {"start_layer": 1, "steps": 4}},
    )


FAMILIES = [
    _image_family("timm_vit_cls", "token"),
    _image_family("timm_vit_avgpool", "avg"),
]
