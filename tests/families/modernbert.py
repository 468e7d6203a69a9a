"""Hugging Face ModernBERT sequence classifiers of the conformance matrix: [CLS] pooling with every bias on, and
mean pooling bias-free (ModernBERT's default) with local (sliding-window) and global layers."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from .base import Family, _token_batch


def _tiny_modernbert(pooling: str = "cls", bias: bool = True, seed: int = 0) -> nn.Module:
    """A tiny random ``ModernBertForSequenceClassification`` (3 layers: global, local with a window of +-2, global;
    2 heads, width 16, GeGLU 2 x 24, 5 labels, [PAD] = 0), float64. ``bias``: biases in the attention, the MLP,
    the norms and the head's dense layer (``False``: ModernBERT's default, only the classifier has one)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.ModernBertConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=3, num_attention_heads=2,
        max_position_embeddings=32, local_attention=4, global_attn_every_n_layers=2, num_labels=5, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, classifier_pooling=pooling,
        attention_bias=bias, mlp_bias=bias, norm_bias=bias, classifier_bias=bias)
    torch.manual_seed(seed)
    model = transformers.ModernBertForSequenceClassification(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_((3.0 if "Wqkv.weight" in name else 0.3) * torch.randn_like(p))
    return model.double()


def _modernbert_family(name: str, pooling: str, bias: bool, with_special: bool) -> Family:
    from methods.families.hf_modernbert import HFModernBertAdapter

    def length(inputs, i):
        return int(inputs["attention_mask"][i].sum())

    return Family(
        name=name, adapter=HFModernBertAdapter, build=lambda: _tiny_modernbert(pooling, bias),
        inputs=lambda b: _token_batch(b, with_types=False, with_special=with_special),
        single=lambda x, i: {k: v[i:i + 1, :length(x, i)] for k, v in x.items()},
        positions=lambda x, i: slice(0, length(x, i)),
        padding=lambda x: x["attention_mask"] == 0,
        shape=lambda x, pixels: tuple(x["input_ids"].shape),
        options={"beyond_intuition_head": {"steps": 4}, "beyond_intuition_token": {"steps": 4}},
        logits=lambda model, x: model(**{k: v for k, v in x.items() if k != "special_tokens_mask"}).logits,
        eager_softmax_float32=True,
    )


FAMILIES = [
    _modernbert_family("hf_modernbert_cls", "cls", bias=True, with_special=True),
    _modernbert_family("hf_modernbert_mean_local_global", "mean", bias=False, with_special=False),
]
