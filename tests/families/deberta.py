"""transformers DeBERTa-v2 / v3 text classifiers of the conformance matrix: a DeBERTa-v3 configuration (shared
attention keys for the position terms, log position buckets, normalised relative embeddings, no absolute
positions, no token types) and a DeBERTa-v2-like one (separate ``pos_key_proj`` / ``pos_query_proj``, no buckets,
absolute positions added to the input, token types)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from .base import Family
from .text import _text_family

#: DeBERTa-v3's attention: c2p and p2c terms with shared keys, log buckets, LayerNorm on the relative embeddings
V3 = dict(relative_attention=True, pos_att_type=["p2c", "c2p"], share_att_key=True, position_buckets=6,
          max_relative_positions=32, norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0)
#: DeBERTa-v2-like: separate position projections, no buckets, absolute positions and token types as well
V2 = dict(relative_attention=True, pos_att_type=["p2c", "c2p"], share_att_key=False, position_buckets=-1,
          max_relative_positions=-1, norm_rel_ebd="none", position_biased_input=True, type_vocab_size=2)


def _tiny_deberta(variant: dict, seed: int = 0, bias_free: bool = False) -> nn.Module:
    """A tiny random float64 ``DebertaV2ForSequenceClassification`` (3 blocks, 2 heads, width 16, 5 labels,
    [PAD] = 0); ``bias_free``: every bias, the absolute positions and the token types zero (the relative
    embeddings kept: they only enter the attention scores)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.DebertaV2Config(vocab_size=40, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                                          intermediate_size=32, max_position_embeddings=32, num_labels=5,
                                          pad_token_id=0, pooler_hidden_size=16, hidden_act="gelu", **variant)
    torch.manual_seed(seed)
    model = transformers.DebertaV2ForSequenceClassification(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            sharp = any(k in name for k in ("query_proj", "key_proj", "rel_embeddings"))
            p.add_((3.0 if sharp else 0.3) * torch.randn_like(p))
            if bias_free and (name.endswith("bias") or "position_embeddings" in name or "token_type" in name):
                p.zero_()
    return model.double()


def _deberta_family(name: str, variant: dict, with_types: bool) -> Family:
    """The text rows' batches, splits and options (:func:`~tests.families.text._text_family`) on a tiny DeBERTa."""
    from methods.families.hf_deberta import HFDebertaV2Adapter

    return replace(_text_family(name, "bert", with_types), adapter=HFDebertaV2Adapter,
                   build=lambda: _tiny_deberta(variant), )


FAMILIES = [
    _deberta_family("hf_deberta_v3", V3, with_types=False),
    _deberta_family("hf_deberta_v2_pos_proj_types", V2, with_types=True),
]
