"""Hugging Face text encoder families (BERT, RoBERTa, DistilBERT, ELECTRA) of the conformance matrix."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from .base import Family, _token_batch


def _tiny_text(kind: str = "bert", seed: int = 0) -> nn.Module:
    """A tiny random ``transformers`` classifier (3 blocks, 2 heads, width 16, 5 labels, [PAD] = 0)."""
    transformers = pytest.importorskip("transformers")
    if kind == "distilbert":
        config = transformers.DistilBertConfig(vocab_size=40, dim=16, n_layers=3, n_heads=2, hidden_dim=32,
                                               max_position_embeddings=32, num_labels=5, pad_token_id=0)
        model_class = transformers.DistilBertForSequenceClassification
    else:
        config_class, model_class = {
            "bert": (transformers.BertConfig, transformers.BertForSequenceClassification),
            "roberta": (transformers.RobertaConfig, transformers.RobertaForSequenceClassification),
            "electra": (transformers.ElectraConfig, transformers.ElectraForSequenceClassification),
        }[kind]
        extra = {"embedding_size": 8} if kind == "electra" else {}   # ELECTRA-small's embedding projection
        config = config_class(vocab_size=40, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                              intermediate_size=32, max_position_embeddings=32, type_vocab_size=2, num_labels=5,
                              pad_token_id=0, **extra)
    torch.manual_seed(seed)
    model = model_class(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            sharp = any(k in name for k in (".query.", ".key.", ".q_lin.", ".k_lin."))
            p.add_((3.0 if sharp else 0.3) * torch.randn_like(p))
    return model.double()


def _tiny_bert(seed: int = 0) -> nn.Module:
    return _tiny_text("bert", seed)


def _text_family(name: str, kind: str, with_types: bool, with_special: bool = None) -> Family:
    from methods.families.hf_text import HFBertAdapter, HFDistilBertAdapter, HFElectraAdapter, HFRobertaAdapter

    adapter = {"bert": HFBertAdapter, "roberta": HFRobertaAdapter, "distilbert": HFDistilBertAdapter,
               "electra": HFElectraAdapter}[kind]

    def length(inputs, i):
        return int(inputs["attention_mask"][i].sum())

    return Family(
        name=name, adapter=adapter, build=lambda: _tiny_text(kind),
        inputs=lambda b: _token_batch(b, with_types, with_special),
        single=lambda x, i: {k: v[i:i + 1, :length(x, i)] for k, v in x.items()},
        positions=lambda x, i: slice(0, length(x, i)),
        padding=lambda x: x["attention_mask"] == 0,
        shape=lambda x, pixels: tuple(x["input_ids"].shape),
        options={"beyond_intuition_head": {"steps": 4}, "beyond_intuition_token": {"steps": 4}},
        logits=lambda model, x: model(**{k: v for k, v in x.items() if k != "special_tokens_mask"}).logits,
    )


FAMILIES = [
    _text_family("hf_bert", "bert", with_types=False),
    _text_family("hf_bert_types_special", "bert", with_types=True),
    _text_family("hf_roberta_types", "roberta", with_types=True, with_special=False),
    _text_family("hf_distilbert_special", "distilbert", with_types=False, with_special=True),
    _text_family("hf_electra_types", "electra", with_types=True, with_special=False),
]
