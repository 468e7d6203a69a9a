"""LRP topology of ``DebertaV2ForSequenceClassification``: TE ``BERT_explainability``'s BERT graph (the head,
post-norm blocks, the mask's Add) with DeBERTa's attention scores ``(q k^T + c2p + p2c) / sqrt(d * f)``.

The c2p / p2c position terms enter the Add rule beside the padding mask, like BEiT's relative position bias:
their share of the scores' relevance is dropped and the content scores ``q k^T`` get the rest (``NOTES.md``).
The blocks are recorded as BERT's; ``q`` and ``k`` are recomputed from the block input (with ``share_att_key`` the
model also runs ``query_proj`` / ``key_proj`` on the relative embeddings, which overwrites what their hooks
recorded); the position terms are the attention module's own ``disentangled_attention_bias``.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ...adapters import ActivationRecorder
from ...lrp.sublayers import block_relprop, block_tensors
from ...lrp.topology import register_topology
from ..hf_text.topology import MASK_VALUES, HFTextTopology, additive_mask
from .adapter import HFDebertaV2Adapter


def score_factor(attention) -> int:
    """``scale_factor`` of ``DisentangledSelfAttention``: 1 plus one per position term (c2p, p2c)."""
    return 1 + sum(term in attention.pos_att_type for term in ("c2p", "p2c"))


@register_topology(HFDebertaV2Adapter)
class HFDebertaTopology(HFTextTopology):
    """Relevance pass over a DeBERTa-v2/v3 classifier through its :class:`HFDebertaV2Adapter`."""

    def record_head(self, rec: ActivationRecorder, layer_outputs: bool) -> None:
        """The head's Linear inputs, and the last hidden states (a ``DebertaV2Layer`` returns a tuple)."""
        for i, lin in enumerate(self.adapter.head_linears()):
            rec.input(lin, ("head_in", i))
        rec.output(self.adapter.blocks[-1], "last_hidden", index=0)

    def position_terms(self, layer: int, x: Tensor, q: Tensor, k: Tensor) -> Optional[Tensor]:
        """``(c2p + p2c) / sqrt(d * f)`` ``[B, H, N, N]`` of block ``layer`` as the model computes it (``None``
        without ``relative_attention``)."""
        attention = self.adapter.blocks[layer].attention.self
        if not attention.relative_attention:
            return None
        encoder = self.adapter.base.encoder
        heads = attention.num_attention_heads
        query, key = attention.transpose_for_scores(q, heads), attention.transpose_for_scores(k, heads)
        rel_embeddings = attention.pos_dropout(encoder.get_rel_embedding())
        terms = attention.disentangled_attention_bias(query, key, encoder.get_rel_pos(x), rel_embeddings,
                                                      score_factor(attention))
        if not isinstance(terms, Tensor):   # pos_att_type names neither term
            return None
        return terms.view(-1, heads, terms.shape[-2], terms.shape[-1])

    @torch.no_grad()
    def block_relprop(self, rules, acts, layer: int, relevance: Tensor, need_below: bool):
        """Relevance through block ``layer``: ``(R at the layer input or None, R_A [B, H, N, N])``; the Add rule
        between the content scores and the position terms plus the padding mask, the latter's share dropped."""
        if self.mask_value not in MASK_VALUES:
            raise ValueError(f"mask_value must be one of {MASK_VALUES}, got {self.mask_value!r}")
        x = acts[("x", layer)]
        linears = self.adapter.linears(layer).attention
        q, k = linears.q(x), linears.k(x)
        attention_mask = acts["attention_mask"].to(x.device)
        mask = None if bool(attention_mask.all()) else additive_mask(attention_mask, x.dtype, self.mask_value)
        terms = self.position_terms(layer, x, q, k)
        if terms is not None:
            mask = terms if mask is None else terms + mask
        attention = self.adapter.blocks[layer].attention.self
        scale = math.sqrt(attention.attention_head_size * score_factor(attention))
        tensors = block_tensors(acts, layer, mlp_in=acts.get(("mlp_in", layer)), qkv_in=x, q=q, k=k, mask=mask,
                                scale=scale, mask_add=True)
        return block_relprop(rules, tensors, linears, self.adapter.linears(layer).mlp, self.adapter.token_flow.heads,
                             relevance, need_below)

    def record_input(self, rec: ActivationRecorder) -> None:
        """With ``input_point="word_embeddings"``: the word, absolute position and token-type embeddings and the
        input of ``embed_proj``, those the model has."""
        if self.input_point != "word_embeddings":
            return
        embeddings = self.adapter.base.embeddings
        for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
            module = getattr(embeddings, name)
            if module is not None and (name != "position_embeddings" or embeddings.position_biased_input):
                rec.output(module, name)
        if embeddings.embed_proj is not None:
            rec.input(embeddings.embed_proj, "embed_proj_in")

    @torch.no_grad()
    def input_relprop(self, rules, acts, relevance: Tensor) -> Tensor:
        """``[B, N, D]`` at the encoder input, or at the word embeddings: the LayerNorm and the mask identity,
        ``embed_proj``'s Linear rule, then the sum ``(word + position) + token_type`` in the model's order, the
        position and token-type shares dropped (Add rules)."""
        if self.stops_at_encoder_input():
            return relevance
        projection = self.adapter.base.embeddings.embed_proj
        if projection is not None:
            relevance = rules["linear"](acts["embed_proj_in"], projection.weight, relevance)
        word, position, types = (acts.get(name) for name in ("word_embeddings", "position_embeddings",
                                                            "token_type_embeddings"))
        tokens = word if position is None else word + position
        if types is not None:
            relevance, _ = rules["add"](tokens, types, relevance)
        if position is not None:
            relevance, _ = rules["add"](word, position, relevance)
        return relevance
