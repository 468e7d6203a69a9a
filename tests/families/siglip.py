"""Hugging Face SigLIP families (both towers) of the conformance matrix."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from .base import Family

#: SigLIP-style texts: ``</s>`` (id 1) ends a text and pads it (SiglipTokenizer's pad token is its EOS)
SIGLIP_PAD = 1
SIGLIP_TEXT_LENGTH = 12


def _tiny_siglip(seed: int = 0) -> nn.Module:
    """A tiny random ``transformers.SiglipModel``: vision 16x16 images, 4x4 patches, width 24, 3 blocks, 2 heads,
    the attention-pooling head; text vocabulary 40 (``</s>`` = pad = eos = 1), 12 positions, width 16, 3 blocks,
    2 heads, projected to the vision width 24."""
    transformers = pytest.importorskip("transformers")
    config = transformers.SiglipConfig(
        text_config=dict(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                         num_attention_heads=2, max_position_embeddings=SIGLIP_TEXT_LENGTH, pad_token_id=SIGLIP_PAD,
                         eos_token_id=SIGLIP_PAD, bos_token_id=None, projection_size=24),
        vision_config=dict(hidden_size=24, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
                           image_size=16, patch_size=4))
    torch.manual_seed(seed)
    model = transformers.SiglipModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            sharp = any(k in name for k in ("q_proj", "k_proj", "in_proj", "probe"))
            p.add_((3.0 if sharp else 0.3) * torch.randn_like(p))
    return model


def _siglip_classifier() -> nn.Module:
    from models.clip import ZeroShotClassifier

    classes = torch.randn(5, 24, generator=torch.Generator().manual_seed(1))
    return ZeroShotClassifier(_tiny_siglip(), classes).double()


def _siglip_scorer() -> nn.Module:
    from models.clip import PromptScorer

    images = torch.randn(5, 24, generator=torch.Generator().manual_seed(2))
    return PromptScorer(_tiny_siglip(), image_embeddings=images).double()


def _siglip_images(batch: int) -> Tensor:
    return torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(batch), dtype=torch.float64)


#: real lengths (``</s>`` included) of the texts of a batch; the rest of the 12 positions is ``</s>`` padding
SIGLIP_TEXT_LENGTHS = (12, 7, 5)


def _siglip_token_batch(batch: int, with_mask: bool = False) -> dict:
    """SigLIP-style texts, padded to ``max_length`` as SigLIP reads them: ids in [2, 40), then ``</s>`` (1) to the
    end; lengths :data:`SIGLIP_TEXT_LENGTHS` (the first text fills every position, its last token ``</s>``).
    ``with_mask``: with the ``attention_mask`` a transformers 5 tokenizer returns (0 after the first ``</s>``)."""
    gen = torch.Generator().manual_seed(200 + batch)
    lengths = SIGLIP_TEXT_LENGTHS[:batch] if batch <= len(SIGLIP_TEXT_LENGTHS) else (9,) * batch
    ids = torch.randint(2, 40, (batch, SIGLIP_TEXT_LENGTH), generator=gen)
    mask = torch.zeros(batch, SIGLIP_TEXT_LENGTH, dtype=torch.long)
    for i, length in enumerate(lengths):
        ids[i, length - 1:] = SIGLIP_PAD
        mask[i, :length] = 1
    return {"input_ids": ids, "attention_mask": mask} if with_mask else {"input_ids": ids}


def _siglip_families() -> list:
    from methods.families.hf_siglip import HFSiglipTextAdapter, HFSiglipVisionAdapter

    bi = {"beyond_intuition_head": {"start_layer": 1, "steps": 4},
          "beyond_intuition_token": {"start_layer": 1, "steps": 4}}
    vision = Family(
        name="hf_siglip_vision", adapter=HFSiglipVisionAdapter, build=_siglip_classifier, inputs=_siglip_images,
        single=lambda x, i: x[i:i + 1], shape=lambda x, pixels: (x.shape[0], 16, 16) if pixels
        else (x.shape[0], 16), options=bi, eager_softmax_float32=True)
    # the text tower reads the last of the 12 positions whatever the padding: a text alone keeps its padding
    text = [Family(
        name=name, adapter=HFSiglipTextAdapter, build=_siglip_scorer,
        inputs=lambda b, with_mask=with_mask: _siglip_token_batch(b, with_mask),
        single=lambda x, i: {k: v[i:i + 1] for k, v in x.items()},
        padding=(lambda x: x["attention_mask"] == 0) if with_mask else (lambda x: None),
        shape=lambda x, pixels: tuple(x["input_ids"].shape),
        options={"beyond_intuition_head": {"steps": 4}, "beyond_intuition_token": {"steps": 4}},
        logits=lambda model, x: model(x), eager_softmax_float32=True)
        for name, with_mask in (("hf_siglip_text", False), ("hf_siglip_text_masked", True))]
    return [vision] + text


FAMILIES = _siglip_families()
