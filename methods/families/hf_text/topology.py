"""LRP topology of stock ``transformers`` text classifiers (BERT, RoBERTa, DistilBERT, ELECTRA): TE
``BERT_explainability``'s graph of BERT, which the others share up to names.

As in TE's ``BertModel.relprop``, the relevance pass ends at the encoder input (the embedding LayerNorm's
output; LayerNorm is identity for LRP, so this is also the relevance of the embedding sum): ``input_relprop``
returns it as ``[B, N, D]``. The graph: ``NOTES.md`` beside this file.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ...adapters import ActivationRecorder
from ...lrp.sublayers import block_relprop, block_tensors, readout_relprop, record_block
from ...lrp.topology import INPUT_POINTS, Topology, refuse, register_topology
from .adapter import (
    HFBertAdapter,
    HFDistilBertAdapter,
    HFElectraAdapter,
    HFRobertaAdapter,
    HFTextAdapter,
)

#: the additive mask values the LRP Add rule can see at padded keys
MASK_VALUES = ("dtype_min", "transformers_3")


def additive_mask(attention_mask: Tensor, dtype: torch.dtype, mask_value: str) -> Tensor:
    """``[B, 1, 1, N]``: 0 at real keys; at padded keys the dtype minimum (what transformers >= 4.3x adds, and
    what the model ran with here) or ``-10000`` (``"transformers_3"``: transformers 3.5.1's
    ``(1 - mask) * -10000``, which the reference code ran with)."""
    if mask_value not in MASK_VALUES:
        raise ValueError(f"mask_value must be one of {MASK_VALUES}, got {mask_value!r}")
    fill = torch.finfo(dtype).min if mask_value == "dtype_min" else -10000.0
    padded = (1 - attention_mask.to(dtype))[:, None, None, :]
    return padded * fill


@register_topology(HFElectraAdapter)
@register_topology(HFDistilBertAdapter)
@register_topology(HFRobertaAdapter)
@register_topology(HFBertAdapter)
class HFTextTopology(Topology):
    """Relevance pass over a stock text classifier through its :class:`~methods.adapters.HFTextAdapter`."""

    input_points = INPUT_POINTS

    @staticmethod
    def check(adapter: HFTextAdapter) -> None:
        """Raise ``TypeError`` naming what has no LRP rule here."""
        m = adapter.model
        problems = []
        for lin in adapter.head_linears():
            if not isinstance(lin, nn.Linear):
                problems.append(f"head layer {type(lin).__name__} (need nn.Linear)")
        for i, block in enumerate(adapter.blocks):
            if getattr(block, "add_cross_attention", False):
                problems.append(f"layer {i} cross-attention")
            linears = adapter.linears(i).attention
            if not all(isinstance(x, nn.Linear) for x in (linears.q, linears.k, linears.v, linears.out)):
                problems.append(f"layer {i} attention projections are not nn.Linear")
        refuse(type(m).__name__, problems)

    # ------------------------------------------------------------------ recording
    def record_block(self, rec: ActivationRecorder, layer: int, layer_outputs: bool) -> None:
        """The shared keys, and the attention sub-layer's LayerNorm output (the stream the MLP residual adds to)."""
        record_block(rec, self.adapter, layer, layer_outputs)
        rec.output(self.adapter.attention_norm(layer), ("mlp_in", layer))

    def record_head(self, rec: ActivationRecorder, layer_outputs: bool) -> None:
        """The head's Linear inputs, the last hidden states."""
        for i, lin in enumerate(self.adapter.head_linears()):
            rec.input(lin, ("head_in", i))
        rec.output(self.adapter.blocks[-1], "last_hidden")

    def record_input(self, rec: ActivationRecorder) -> None:
        """With ``input_point="word_embeddings"``: the embedding projection's input (ELECTRA) and the embeddings."""
        if self.input_point != "word_embeddings":
            return
        projection = self.adapter.embedding_projection()
        if projection is not None:
            rec.input(projection, "embedding_projection_in")
        embeddings = self.adapter.base.embeddings
        for name in ("word_embeddings", "token_type_embeddings", "position_embeddings"):
            if isinstance(getattr(embeddings, name, None), nn.Module):
                rec.output(getattr(embeddings, name), name)

    # ------------------------------------------------------------------ relevance pass
    @torch.no_grad()
    def head_relprop(self, rules, acts, relevance_logits: Tensor) -> Tensor:
        """Relevance at the last hidden states ``[B, N, D]``: the head's Linear layers in reverse (activations
        and dropout identity), then the [CLS] selection (TE ``BertForSequenceClassification.relprop``,
        ``BertPooler.relprop``)."""
        r = relevance_logits
        for i, lin in reversed(list(enumerate(self.adapter.head_linears()))):
            r = rules["linear"](acts[("head_in", i)], lin.weight, r)
        return readout_relprop(rules, acts["last_hidden"], r, "class_token")

    @torch.no_grad()
    def block_relprop(self, rules, acts, layer: int, relevance: Tensor, need_below: bool):
        """Relevance through layer ``layer``: ``(R at the layer input or None, R_A [B, H, N, N])``."""
        x = acts[("x", layer)]
        if "lrp_mask" not in acts:      # None: no padding in the batch, the Add of an all-zero mask
            if self.mask_value not in MASK_VALUES:
                raise ValueError(f"mask_value must be one of {MASK_VALUES}, got {self.mask_value!r}")
            attention_mask = acts["attention_mask"].to(x.device)
            acts["lrp_mask"] = (None if bool(attention_mask.all()) else
                                additive_mask(attention_mask, x.dtype, self.mask_value))
        head_dim = self.adapter.token_flow.width // self.adapter.token_flow.heads
        tensors = block_tensors(acts, layer, mlp_in=acts.get(("mlp_in", layer)), mask=acts["lrp_mask"],
                                scale=math.sqrt(head_dim), mask_add=True)
        linears = self.adapter.linears(layer)
        return block_relprop(rules, tensors, linears.attention, linears.mlp,
                             self.adapter.token_flow.heads, relevance, need_below)

    @torch.no_grad()
    def input_relprop(self, rules, acts, relevance: Tensor) -> Tensor:
        """``[B, N, D]``: the relevance at the encoder input (``input_point="encoder_input"``, TE: its
        ``BertModel.relprop`` never calls ``embeddings.relprop``), or that of the word embeddings
        (``"word_embeddings"``): through the embedding LayerNorm (identity) and the embedding sum
        ``(word + token_type) + position`` (two Add rules, in the model's order; the position and token-type
        shares are dropped, as the positional embedding's share of a ViT). A family with a projection between
        the embeddings and the encoder (ELECTRA) first gets the Linear rule through it."""
        if self.stops_at_encoder_input():
            return relevance
        projection = self.adapter.embedding_projection()
        if projection is not None:   # ELECTRA: the Linear rule back to the embeddings' width
            relevance = rules["linear"](acts["embedding_projection_in"], projection.weight, relevance)
        word = acts["word_embeddings"]
        types = acts.get("token_type_embeddings")
        tokens = word if types is None else word + types
        r_tokens, _ = rules["add"](tokens, acts["position_embeddings"], relevance)
        if types is None:
            return r_tokens
        r_word, _ = rules["add"](word, types, r_tokens)
        return r_word
