"""timm ``Eva`` (EVA, EVA-02) and ``Beit`` families of the conformance matrix: tiny random models (32 px images,
patch 8, width 24, 2 heads, 3 blocks, 5 classes, float64)."""
from __future__ import annotations

import torch
from torch import nn

from .base import Family
from .vision import _images

#: EVA-02 as ``eva02_tiny/small`` build it: rotary embedding, the packed SwiGLU (``GluMlp``), fused ``qkv`` with
#: ``q_bias`` / ``v_bias``, average pooling + ``fc_norm``
EVA02_GLU = dict(mlp_ratio=4 * 2 / 3, swiglu_mlp=True, use_rot_pos_emb=True, ref_feat_shape=(4, 4))
#: EVA-02 as ``eva02_base`` / EVA-CLIP build it: rotary embedding, ``SwiGLU`` with its inner LayerNorm, separate
#: q/k/v projections, sub-LN in the attention, [CLS] read-out; plus layer scale
EVA02_CLIP = dict(mlp_ratio=4 * 2 / 3, swiglu_mlp=True, scale_mlp=True, qkv_fused=False, scale_attn_inner=True,
                  use_rot_pos_emb=True, ref_feat_shape=(4, 4), global_pool="token", init_values=0.5)
#: EVA (EVA-01): absolute positions, GELU MLP, fused ``qkv`` with biases, average pooling + ``fc_norm`` (not a row
#: of the matrix, to keep the suite's time: its parts are in the other rows; ``tests/test_timm_eva_beit.py`` uses it)
EVA_PLAIN: dict = dict()
#: BEiT as ``beit_base`` builds it: a relative position bias per block, no absolute positions, layer scale,
#: average pooling + ``fc_norm``
BEIT_RELPOS = dict(use_abs_pos_emb=False, use_rel_pos_bias=True, init_values=0.5)


def _tiny(kind: str, bias_free: bool = False, seed: int = 0, **config) -> nn.Module:
    """A tiny random timm ``Eva`` or ``Beit`` (``kind``); ``bias_free``: every bias, the absolute position
    embedding and the prefix tokens zero (the relative position bias is kept)."""
    from timm.models.beit import Beit
    from timm.models.eva import Eva

    torch.manual_seed(seed)
    config = {**dict(img_size=32, patch_size=8, embed_dim=24, depth=3, num_heads=2, num_classes=5), **config}
    model = {"eva": Eva, "beit": Beit}[kind](**config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.1 * torch.randn_like(p))
            if bias_free and (name.endswith("bias") or name in ("pos_embed", "cls_token", "reg_token")):
                p.zero_()
    return model.double()


def _family(name: str, kind: str, config: dict) -> Family:
    from methods.families.timm_eva_beit import TimmBeitAdapter, TimmEvaAdapter

    return Family(
        name=name, adapter={"eva": TimmEvaAdapter, "beit": TimmBeitAdapter}[kind],
        build=lambda: _tiny(kind, **config), inputs=_images, single=lambda x, i: x[i:i + 1],
        shape=lambda x, pixels: (x.shape[0], 32, 32) if pixels else (x.shape[0], 16),
        options={"beyond_intuition_head": {"start_layer": 1, "steps": 4},
                 "beyond_intuition_token": {"start_layer": 1, "steps": 4}},
    )


FAMILIES = [
    _family("timm_eva02_rope_glu", "eva", EVA02_GLU),
    _family("timm_eva02_clip_style", "eva", EVA02_CLIP),
    _family("timm_beit_relpos", "beit", BEIT_RELPOS),
]
