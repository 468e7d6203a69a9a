"""A random-map baseline: what any attribution method should beat in the perturbation and segmentation tests.

Scores are i.i.d. uniform in [0, 1) per content position, drawn from a generator seeded with ``seed`` and the
sample's id (``sha256`` of ``(seed, id)``), so a sample gets the same map whatever its batch, its position in the
batch or the process that evaluates it. The id is the ``sample_ids`` argument of the call (the evaluation passes
each sample's dataset index); without ids a sample is seeded by a hash of its input values (still deterministic,
still independent of batching).
"""
from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from .base import AttributionMethod
from .registry import register_method


def seeded_uniform(key: bytes, n: int) -> Tensor:
    """``n`` float64 uniforms in [0, 1) from a generator seeded by the sha256 of ``key``."""
    seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & ((1 << 63) - 1)
    return torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def random_token_scores(indices: Tensor, num_tokens: int, seed: int = 0) -> Tensor:
    """``[B, num_tokens]`` float64 scores, uniform in [0, 1), of the samples with these ids (dataset
    ``indices``): the random baseline's map of each sample (a function of ``(seed, id)`` alone)."""
    rows = [seeded_uniform(f"{seed}:index:{int(i)}".encode(), num_tokens) for i in indices.tolist()]
    return torch.stack(rows) if rows else torch.empty(0, num_tokens, dtype=torch.float64)


@register_method("random")
class RandomBaseline(AttributionMethod):
    """Uniform random scores in the layout of the inputs (class-agnostic), seeded per sample (module docstring).

    Images: ``[B, P]``, one score per patch. Sequences: ``[B, N]``, one score per position (padding 0), the k-th
    real token getting the k-th draw (so left padding changes nothing either); without ids a sequence is seeded
    by its real tokens, so padding changes nothing.
    """

    class_specific = False

    def __init__(self, seed: int = 0):
        self.seed = int(seed)

    def attribute(self, adapter, inputs, target) -> Tensor:
        layout = adapter.inputs.layout(inputs)
        count = layout.num_scores
        if inputs.sample_ids is not None:
            scores = random_token_scores(inputs.sample_ids, count, self.seed)
        else:
            name = next(iter(inputs.tensors))
            samples = layout.without_padding(inputs[name])   # padding does not change the seed
            scores = torch.stack([
                seeded_uniform(f"{self.seed}:pixels:".encode() + sample.detach().cpu().float().numpy().tobytes(),
                               count)
                for sample in samples])
        if layout.has_padding:   # the k-th real token gets the k-th draw, whichever side the padding is on
            order = (layout.real_positions(scores).long().cumsum(dim=-1) - 1).clamp(min=0)
            scores = scores.gather(1, order.to(scores.device))
        return scores.to(device=inputs.device, dtype=inputs.score_dtype)

    def __repr__(self) -> str:
        return f"RandomBaseline(seed={self.seed})"
