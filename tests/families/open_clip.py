"""open_clip ``CLIP`` families (both towers) of the conformance matrix."""
from __future__ import annotations

from typing import Optional

import pytest
import torch
from torch import Tensor, nn

from .base import TEXT_LENGTHS, Family

#: the tiny text tower's context length, vocabulary, start and end (EOT: the largest id, as OpenAI's) tokens
CONTEXT, VOCAB, SOT, EOT = 12, 40, 38, 39


def _tiny_open_clip(seed: int = 0, pool: str = "tok", layer_scale: Optional[float] = None,
                    final_ln_after_pool: bool = False, quick_gelu: bool = False, logit_bias: Optional[float] = None,
                    text_pool: str = "argmax", proj_bias: bool = False, vocab: int = VOCAB,
                    context: int = CONTEXT) -> nn.Module:
    """A tiny random ``open_clip.model.CLIP``: vision 16x16 images, 4x4 patches, width 24, 3 blocks, 2 heads;
    text ``vocab`` ids, ``context`` positions, width 16, 3 blocks, 2 heads; 8-d joint space. The q/k rows of
    every ``in_proj_weight`` are sharpened (peaked attention)."""
    open_clip = pytest.importorskip("open_clip")
    torch.manual_seed(seed)
    vision = dict(image_size=16, patch_size=4, width=24, layers=3, head_width=12, mlp_ratio=2.0, pool_type=pool,
                  ls_init_value=layer_scale, final_ln_after_pool=final_ln_after_pool)
    text = dict(context_length=context, vocab_size=vocab, width=16, heads=2, layers=3, mlp_ratio=2.0,
                ls_init_value=layer_scale, pool_type=text_pool, eos_id=EOT, proj_bias=proj_bias)
    model = open_clip.model.CLIP(embed_dim=8, vision_cfg=vision, text_cfg=text, quick_gelu=quick_gelu,
                                 init_logit_bias=logit_bias)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("in_proj_weight"):
                p[:2 * p.shape[1]].add_(3.0 * torch.randn_like(p[:2 * p.shape[1]]))
                p[2 * p.shape[1]:].add_(0.3 * torch.randn_like(p[2 * p.shape[1]:]))
            elif name.endswith("gamma"):
                p.add_(0.5 + 0.3 * torch.randn_like(p))
            elif name not in ("logit_scale", "logit_bias"):
                p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def _open_clip_classifier(**options) -> nn.Module:
    from models.clip import ZeroShotClassifier

    classes = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    return ZeroShotClassifier(_tiny_open_clip(**options), classes).double()


def _open_clip_scorer(**options) -> nn.Module:
    from models.clip import PromptScorer

    images = torch.randn(5, 8, generator=torch.Generator().manual_seed(2))
    return PromptScorer(_tiny_open_clip(**options), image_embeddings=images).double()


def _open_clip_images(batch: int) -> Tensor:
    return torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(batch), dtype=torch.float64)


def _open_clip_ids(batch: int) -> Tensor:
    """Texts as open_clip's tokenizer returns them: ``SOT ... EOT`` then 0 up to the context length (no mask);
    real lengths ``TEXT_LENGTHS`` (9 for further samples)."""
    gen = torch.Generator().manual_seed(200 + batch)
    lengths = TEXT_LENGTHS[:batch] if batch <= len(TEXT_LENGTHS) else (9,) * batch
    ids = torch.randint(1, SOT, (batch, CONTEXT), generator=gen)
    for i, length in enumerate(lengths):
        ids[i, 0], ids[i, length - 1] = SOT, EOT
        ids[i, length:] = 0
    return ids


def _after_eos(ids: Tensor) -> Tensor:
    """The positions after each text's EOT (the layout's padding)."""
    eos = (ids == EOT).int().argmax(dim=1)
    return torch.arange(ids.shape[1])[None, :] > eos[:, None]


BI_VISION = {"beyond_intuition_head": {"start_layer": 1, "steps": 4},
             "beyond_intuition_token": {"start_layer": 1, "steps": 4}}
BI_TEXT = {"beyond_intuition_head": {"steps": 4}, "beyond_intuition_token": {"steps": 4}}


def _vision(name: str, undefined: Optional[dict] = None, **options) -> Family:
    from methods.families.open_clip import OpenCLIPVisionAdapter

    return Family(name=name, adapter=OpenCLIPVisionAdapter, build=lambda: _open_clip_classifier(**options),
                  inputs=_open_clip_images, single=lambda x, i: x[i:i + 1],
                  shape=lambda x, pixels: (x.shape[0], 16, 16) if pixels else (x.shape[0], 16), options=BI_VISION,
                  undefined=dict(undefined or {}))


def _text(name: str, undefined: Optional[dict] = None, **options) -> Family:
    from methods.families.open_clip import OpenCLIPTextAdapter

    return Family(name=name, adapter=OpenCLIPTextAdapter, build=lambda: _open_clip_scorer(**options),
                  inputs=_open_clip_ids, single=lambda x, i: x[i:i + 1], padding=_after_eos,
                  shape=lambda x, pixels: tuple(x.shape), options=BI_TEXT, undefined=dict(undefined or {}))


FAMILIES = [
    _vision("open_clip_vision"),
    _vision("open_clip_vision_avg_quickgelu_bias", pool="avg", final_ln_after_pool=True, quick_gelu=True,
            logit_bias=-2.0),
    _text("open_clip_text"),
    _text("open_clip_text_eos_linear_proj_layerscale",
          text_pool="eos", proj_bias=True, quick_gelu=True, layer_scale=0.5),
]
