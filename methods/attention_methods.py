"""Class-agnostic attention methods: the last block's raw attention and attention rollout.

Scores are returned raw, as the reference code computes them, in the layout of the inputs (``[B, P]`` patch
scores for images). Layer indices (``start_layer``, ``layer``) are 0-based; negative values count from the end.
"""
from __future__ import annotations

from typing import List

import torch
from torch import Tensor

from .adapters import ActivationRecorder
from .base import AttributionMethod, check_start_layer
from .readout import check_class_token_score, check_readout, check_readout_space, read_out, set_class_token_score
from .registry import register_method
from .rollout import ReadoutRollout, carry_to_readout_space, rollout


@register_method("raw_attention")
class RawAttention(AttributionMethod):
    """Raw attention of the last block (Chefer et al. 2021a, baseline "raw attention").

    ``mean_h A_{L-1}[h, r, content]``: post-softmax attention (after dropout, identity in eval) of block
    ``layer`` (default the last), read-out row ``r``, content columns, mean over heads (TE ``ViT_LRP.py``
    ``last_layer_attn``; its clamp at 0 is a no-op on probabilities). Class-agnostic. ``readout`` (see
    :func:`methods.readout.read_out`): ``auto`` (default: the model's own read-out, the [CLS] row for
    ``global_pool='token'``, the mean of the patch rows for ``'avg'``, whose prediction never reads [CLS], the
    rows weighted by the pool's head-mean attention for ``'map'``), ``class_token`` (alias ``cls``, the
    reference), ``mean_content`` (alias ``mean_patches``), ``attention_pool`` (attention-pooled models only).

    Sequences (text): ``[B, N]`` over all positions ([CLS], [SEP] included, padding 0);
    ``class_token_score`` (:func:`methods.readout.set_class_token_score`): ``auto`` (default) = ``zero``, the
    [CLS]->[CLS] entry set to 0 as TE's BERT ``generate_attn_last_layer`` does; ``keep`` leaves it.
    """

    class_specific = False
    layer_options = ("layer",)

    def __init__(self, layer: int = -1, readout: str = "auto", class_token_score: str = "auto"):
        self.layer = layer
        self.readout = check_readout(readout)
        self.class_token_score = check_class_token_score(class_token_score)

    def attribute(self, adapter, inputs, target):
        layer = check_start_layer(self.layer, adapter, self.name, "layer")
        check_readout_space(adapter, layer, inputs, self.name)
        with ActivationRecorder() as rec, torch.no_grad():
            adapter.recording.attention(rec, layer, "attn")
            adapter.forward(inputs, grad_from_block=len(adapter.blocks))
            attention = rec["attn"].mean(dim=1)
        layout = adapter.inputs.layout(inputs)
        row = read_out(attention, adapter, inputs, self.readout, layout)
        return layout.output(set_class_token_score(row, adapter, layout, self.class_token_score, "zero"))


@register_method("rollout")
class Rollout(AttributionMethod):
    """Attention rollout (Abnar & Zuidema 2020, eq. 1) as the TE reference computes it.

    Per block ``l >= start_layer``: ``M_l = mean_h A_l + I``, row-normalised (``M_l / M_l.sum(-1)``); the product
    ``M_{L-1} ... M_{start}`` (:func:`methods.rollout.rollout`) read at the read-out row, content columns (TE
    ``ViT_explanation_generator.py`` ``compute_rollout_attention``). ``start_layer`` is 0-based (the TE
    evaluation scripts pass 1). ``row_normalize=False`` gives the unnormalised variant. Class-agnostic; with
    row normalisation the rows of the rolled-out matrix sum to one. ``readout`` as for ``raw_attention``.
    Sequences: TE's BERT ``generate_rollout`` is the same computation (row-normalised, 0-based ``start_layer``)
    with the [CLS]->[CLS] entry set to 0 (``class_token_score``, as for ``raw_attention``).

    Streaming: only the read-out row of the product is formed, ``read(M_{L-1}) M_{L-2} ... M_start``
    (:class:`methods.rollout.ReadoutRollout`, vector-matrix products: ``O(L N^2)`` rather than the full product's
    ``O(L N^3)``; equal to the read-out of :meth:`rollout_matrix` up to float rounding). The row is composed from
    the last block down while the forward runs from the first block up, so each block's head mean
    ``mean_h A_l`` ``[B, N, N]`` is kept until the forward ends (``1 / H`` of a block's attention per block);
    the ``[B, H, N, N]`` maps themselves are dropped block by block.
    """

    class_specific = False
    layer_options = ("start_layer",)

    def __init__(self, start_layer: int = 0, row_normalize: bool = True, readout: str = "auto",
                 class_token_score: str = "auto"):
        self.start_layer = start_layer
        self.row_normalize = row_normalize
        self.readout = check_readout(readout)
        self.class_token_score = check_class_token_score(class_token_score)

    def head_means(self, adapter, inputs) -> List[Tensor]:
        """``mean_h A_l`` ``[B, N, N]`` of the blocks ``l >= start_layer``, in forward order."""
        start = check_start_layer(self.start_layer, adapter, self.name)
        layers = range(start, len(adapter.blocks))
        with ActivationRecorder() as rec, torch.no_grad():
            for layer in layers:
                adapter.recording.attention(rec, layer, layer, transform=lambda a: a.mean(dim=1))
            adapter.forward(inputs, grad_from_block=len(adapter.blocks))
            return [rec.outputs.pop(layer) for layer in layers]

    def rollout_matrix(self, adapter, inputs) -> Tensor:
        """The rolled-out ``[B, N, N]`` matrix (before the read-out; the reference's full product)."""
        return rollout(self.head_means(adapter, inputs), self.row_normalize)

    def attribute(self, adapter, inputs, target):
        layout = adapter.inputs.layout(inputs)
        means = self.head_means(adapter, inputs)
        start = len(adapter.blocks) - len(means)
        composed = ReadoutRollout(self.row_normalize, lambda m: read_out(m, adapter, inputs, self.readout, layout))
        while means:
            layer = start + len(means) - 1
            matrix = means.pop()
            composed.add(matrix, overwrite=True)   # each block's matrix dropped once folded in
            if layer > start:
                composed.through(adapter.token_flow.transition(layer, matrix))
            del matrix
        row = carry_to_readout_space(adapter, composed.row(), start)
        return layout.output(set_class_token_score(row, adapter, layout, self.class_token_score, "zero"))
