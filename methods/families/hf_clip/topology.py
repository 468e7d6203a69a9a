"""LRP topology of the two towers of a stock ``transformers.CLIPModel`` behind a CLIP scorer
(``models.clip.ZeroShotClassifier`` / ``PromptScorer``). No reference implementation exists (neither Chefer's
nor Beyond Intuition's code propagates relevance through CLIP); this is the timm ViT graph of Chefer et al.
2021a with CLIP's names, built from the shared rules and sub-layers, and checked by relevance conservation
(``tests/test_clip.py``: with the conservative ``"ours"`` rules the relevance entering the first block sums to
the one-hot target, per sample).

Design notes: ``NOTES.md`` beside this file (topology.py).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from ...adapters import ActivationRecorder
from ...lrp.sublayers import (
    embedding_sum_relprop,
    position_readout_relprop,
    readout_relprop,
    record_patch_embedding,
    recorded_patches_relprop,
    score_relprop,
)
from ...lrp.topology import INPUT_POINTS, Topology, linear_layer_problems, refuse, register_topology
from .adapter import HFCLIPTextAdapter, HFCLIPVisionAdapter, _HFCLIPTower, eos_positions


class _CLIPTowerTopology(Topology):
    """Shared: the score and projection in reverse, the blocks (the shared pre-norm sub-layers)."""

    @staticmethod
    def check(adapter: _HFCLIPTower) -> None:
        problems = []
        if not isinstance(adapter.projection(), nn.Linear):
            problems.append(f"projection {type(adapter.projection()).__name__} (need nn.Linear)")
        refuse(f"CLIP {adapter.tower} tower", problems + linear_layer_problems(adapter))

    def record_head(self, rec: ActivationRecorder, layer_outputs: bool) -> None:
        """The projection's input and output, the last hidden states."""
        adapter = self.adapter
        rec.input(adapter.projection(), "proj_in")
        rec.output(adapter.projection(), "embedding")
        rec.output(adapter.blocks[-1], "last_hidden")

    def readout(self, rules, acts, relevance_pooled: Tensor) -> Tensor:  # pragma: no cover - per tower
        raise NotImplementedError

    @torch.no_grad()
    def head_relprop(self, rules, acts, relevance_logits: Tensor) -> Tensor:
        """Relevance at the last block's output ``[B, N, D]``: the score (a Linear on the normalised
        embedding), the projection, the final norm (identity) and the read-out selection."""
        r = score_relprop(rules, acts["embedding"], self.adapter.score_weight(), relevance_logits)
        r = rules["linear"](acts["proj_in"], self.adapter.projection().weight, r)
        return self.readout(rules, acts, r)


@register_topology(HFCLIPVisionAdapter)
class HFCLIPVisionTopology(_CLIPTowerTopology):
    """Relevance pass over CLIP's vision tower (``ZeroShotClassifier``)."""

    def record_input(self, rec: ActivationRecorder) -> None:
        record_patch_embedding(rec, self.adapter.tower_model.embeddings.patch_embedding)

    def readout(self, rules, acts, relevance_pooled: Tensor) -> Tensor:
        return readout_relprop(rules, acts["last_hidden"], relevance_pooled, "class_token")

    @torch.no_grad()
    def input_relprop(self, rules, acts, relevance: Tensor) -> Tensor:
        """From the tokens entering block 0 to the pixels: ``pre_layrnorm`` (identity), ``+ position_embedding``
        (Add; the position share dropped), [CLS] dropped, the patch convolution (z^B). ``[B, 3, H, W]``."""
        embeddings = self.adapter.tower_model.embeddings
        return recorded_patches_relprop(rules, acts, embeddings.patch_embedding, relevance,
                                        embeddings.class_embedding, embeddings.position_embedding.weight)


@register_topology(HFCLIPTextAdapter)
class HFCLIPTextTopology(_CLIPTowerTopology):
    """Relevance pass over CLIP's text tower (``PromptScorer``)."""

    input_points = INPUT_POINTS       # mask_value (the engine's) is unused: see the module docstring

    def record(self, rec: ActivationRecorder, blocks: Sequence[int], to_input: bool,
               grad_blocks: Sequence[int] = (), layer_outputs: bool = True) -> None:
        super().record(rec, blocks, to_input, grad_blocks, layer_outputs)
        embeddings = self.adapter.tower_model.embeddings

        def keep_ids(_module, args, kwargs):   # the ids give the EOS positions of the read-out
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None:
                rec.outputs["input_ids"] = ids

        rec._handles.append(embeddings.register_forward_pre_hook(keep_ids, with_kwargs=True))

    def record_input(self, rec: ActivationRecorder) -> None:
        embeddings = self.adapter.tower_model.embeddings
        rec.output(embeddings.token_embedding, "token_embeddings")
        rec.output(embeddings.position_embedding, "position_embeddings")

    def readout(self, rules, acts, relevance_pooled: Tensor) -> Tensor:
        """The EOS selection: the relevance placed on each sample's read-out position."""
        positions = eos_positions(acts["input_ids"], self.adapter.eos_token_id)
        return position_readout_relprop(rules, acts["last_hidden"], positions, relevance_pooled)

    @torch.no_grad()
    def input_relprop(self, rules, acts, relevance: Tensor) -> Tensor:
        """``[B, N, D]``: the relevance at the encoder input (``"encoder_input"``) or at the token embeddings
        (``"word_embeddings"``: the Add of token and position embeddings, the position share dropped)."""
        if self.stops_at_encoder_input():
            return relevance
        tokens = acts["token_embeddings"]
        return embedding_sum_relprop(rules, tokens, acts["position_embeddings"].expand_as(tokens), relevance)
