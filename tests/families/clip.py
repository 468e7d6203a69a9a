"""Hugging Face CLIP families (both towers) of the conformance matrix."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from .base import Family, _token_batch


def _tiny_clip(seed: int = 0) -> nn.Module:
    """A tiny random ``transformers.CLIPModel``: vision 16x16 images, 4x4 patches, width 24, 3 blocks, 2 heads;
    text vocabulary 40 (start 38, end 39, padding 0), 12 positions, width 16, 3 blocks, 2 heads; 8-d joint
    space."""
    transformers = pytest.importorskip("transformers")
    config = transformers.CLIPConfig(
        text_config=dict(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                         num_attention_heads=2, max_position_embeddings=12, bos_token_id=38, eos_token_id=39,
                         pad_token_id=0),
        vision_config=dict(hidden_size=24, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
                           image_size=16, patch_size=4),
        projection_dim=8)
    torch.manual_seed(seed)
    model = transformers.CLIPModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            sharp = any(k in name for k in ("q_proj", "k_proj"))
            p.add_((3.0 if sharp else 0.3) * torch.randn_like(p))
    return model


def _clip_classifier() -> nn.Module:
    from models.clip import ZeroShotClassifier

    clip = _tiny_clip()
    classes = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    return ZeroShotClassifier(clip, classes).double()


def _clip_scorer() -> nn.Module:
    from models.clip import PromptScorer

    clip = _tiny_clip()
    return PromptScorer(clip, image_embeddings=torch.randn(5, 8, generator=torch.Generator().manual_seed(2))).double()


def _clip_images(batch: int) -> Tensor:
    return torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(batch), dtype=torch.float64)


def _clip_token_batch(batch: int, with_special: bool = False) -> dict:
    """CLIP-style texts: start token 38 ... end token 39, then padding (id 0, mask 0); lengths ``TEXT_LENGTHS``."""
    inputs = _token_batch(batch, with_types=False, with_special=with_special)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    ids = ids.clamp(max=37)
    for i, length in enumerate(mask.sum(dim=1).tolist()):
        ids[i, 0], ids[i, length - 1] = 38, 39
        ids[i, length:] = 0
    inputs["input_ids"] = ids
    return inputs


def _clip_families() -> list:
    from methods.families.hf_clip import HFCLIPTextAdapter, HFCLIPVisionAdapter

    def length(inputs, i):
        return int(inputs["attention_mask"][i].sum())

    bi = {"beyond_intuition_head": {"start_layer": 1, "steps": 4},
          "beyond_intuition_token": {"start_layer": 1, "steps": 4}}
    vision = Family(
        name="hf_clip_vision", adapter=HFCLIPVisionAdapter, build=_clip_classifier, inputs=_clip_images,
        single=lambda x, i: x[i:i + 1], shape=lambda x, pixels: (x.shape[0], 16, 16) if pixels
        else (x.shape[0], 16), options=bi, eager_softmax_float32=True)
    text = [Family(
        name=name, adapter=HFCLIPTextAdapter, build=_clip_scorer,
        inputs=lambda b, special=special: _clip_token_batch(b, special),
        single=lambda x, i: {k: v[i:i + 1, :length(x, i)] for k, v in x.items()},
        positions=lambda x, i: slice(0, length(x, i)),
        padding=lambda x: x["attention_mask"] == 0,
        shape=lambda x, pixels: tuple(x["input_ids"].shape),
        options={"beyond_intuition_head": {"steps": 4}, "beyond_intuition_token": {"steps": 4}},
        logits=lambda model, x: model(x), eager_softmax_float32=True) for name, special in (("hf_clip_text", False),
                                                                ("hf_clip_text_special", True))]
    return [vision] + text


#: the decoder families of the contract: (name, kind, head, padding side)


FAMILIES = _clip_families()
