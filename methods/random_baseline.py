"""A random-map baseline: what any attribution method should beat in the perturbation and segmentation tests.

Scores are i.i.d. uniform in [0, 1) per patch token, drawn from a generator seeded with ``seed`` and the
sample's *dataset index* (``hash`` of ``(seed, index)``), so a sample gets the same map whatever its batch,
its position in the batch or the process that evaluates it. The evaluation module passes the indices through
:meth:`RandomBaseline.bind_indices`; without indices a sample is seeded by a hash of its pixel values (still
deterministic, still independent of batching).
"""
from __future__ import annotations

import contextlib
import hashlib
from typing import Iterator, Optional

import torch
from torch import Tensor

from .base import AttributionMethod
from .registry import register_method


def _uniform(key: bytes, n: int) -> Tensor:
    """``n`` float64 uniforms in [0, 1) from a generator seeded by the sha256 of ``key``."""
    seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & ((1 << 63) - 1)
    return torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def random_token_scores(indices: Tensor, num_tokens: int, seed: int = 0) -> Tensor:
    """``[B, num_tokens]`` float64 scores, uniform in [0, 1), of the samples with these dataset ``indices``:
    the random baseline's map of each sample (a function of ``(seed, index)`` alone)."""
    rows = [_uniform(f"{seed}:index:{int(i)}".encode(), num_tokens) for i in indices.tolist()]
    return torch.stack(rows) if rows else torch.empty(0, num_tokens, dtype=torch.float64)


@register_method("random")
class RandomBaseline(AttributionMethod):
    """Uniform random patch scores ``[B, P]`` (class-agnostic), seeded per sample (see the module docstring)."""

    class_specific = False
    #: the evaluation module binds ``batch["index"]`` to methods that declare this
    uses_sample_index = True

    def __init__(self, seed: int = 0):
        self.seed = int(seed)
        self._indices: Optional[Tensor] = None

    @contextlib.contextmanager
    def bind_indices(self, indices: Optional[Tensor]) -> Iterator[None]:
        """Within the block, sample ``b`` of a call is seeded with ``indices[b]`` (its dataset index)."""
        previous, self._indices = self._indices, indices
        try:
            yield
        finally:
            self._indices = previous

    def attribute(self, adapter, inputs: Tensor, target) -> Tensor:
        h, w = adapter.grid_size(inputs)
        if self._indices is not None:
            if len(self._indices) != inputs.shape[0]:
                raise ValueError(f"random: {len(self._indices)} bound sample indices for a batch of {inputs.shape[0]}")
            scores = random_token_scores(self._indices, h * w, self.seed)
        else:
            scores = torch.stack([_uniform(f"{self.seed}:pixels:".encode() + image.detach().cpu().float().numpy()
                                           .tobytes(), h * w) for image in inputs])
        return scores.to(device=inputs.device, dtype=inputs.dtype)

    def __repr__(self) -> str:
        return f"RandomBaseline(seed={self.seed})"
