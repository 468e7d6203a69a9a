"""Continuous perturbations of a text in embedding space (Yeh et al. 2019's infidelity and max-sensitivity on texts,
decoders and CLIP's text tower; :mod:`callbacks.robustness`).

* :func:`embedding_noise`: each sample's perturbation ``[N, D]`` at the output of the adapter's input embedding
  (the word embeddings, before position and token-type shares). Only the *perturbable* positions are drawn, in order
  (the real tokens; special tokens only when asked): their values come from
  :func:`evaluation.robustness.sample_noise` seeded with ``(seed, sample index)`` for the sample's own count of
  positions, so a sample's draws do not depend on its batch, its padding or the process. Padding is never perturbed.
  ``scale="absolute"``: the std / radius in embedding units; ``"relative"``: multiplied by the sample's
  per-coordinate embedding scale ``mean_t ‖e_t‖₂ / √D`` over the perturbable positions (a token's noise norm is
  then about ``std`` times its typical embedding norm, whatever the model's embedding scale).

A re-explanation hands its draw to the method as the inputs' ``embedding_offset``
(``method(..., embedding_offset=...)``, :mod:`methods.adapters.embedding_offset`): the offset travels with the
rows, so two identical texts with different draws in one batch each get their own, and a row the method builds
itself (an all-``[PAD]`` baseline) gets none.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .robustness import sample_noise

SCALES = ("relative", "absolute")


def embedding_scale(embeddings: Tensor, perturbable: Tensor) -> Tensor:
    """float64 ``[B]``: each sample's mean embedding norm over its perturbable positions, divided by √D."""
    norms = embeddings.detach().to(torch.float64).norm(dim=-1) * perturbable.to(torch.float64)
    count = perturbable.sum(dim=-1).clamp(min=1).to(torch.float64)
    return (norms.sum(dim=-1) / count / embeddings.shape[-1] ** 0.5).cpu()


def embedding_noise(sample_ids: Sequence[int], perturbable: Tensor, width: int, runs: int, seed: int, kind: str,
                    std: float, scales: Tensor) -> Tensor:
    """float64 ``[R, B, N, D]`` (``D = width``): ``kind`` (``infidelity``: Gaussian, ``sensitivity``: uniform)
    draws at each sample's perturbable positions (``perturbable`` bool ``[B, N]``), scaled by ``std * scales[b]``,
    zero elsewhere (module docstring)."""
    perturbable = perturbable.bool().cpu()
    out = torch.zeros(runs, perturbable.shape[0], perturbable.shape[1], width, dtype=torch.float64)
    for row, sample in enumerate(int(s) for s in sample_ids):
        where = perturbable[row].nonzero().flatten()
        draws = sample_noise([sample], (len(where), width), runs, seed, kind, std * float(scales[row]))[:, 0]
        out[:, row, where] = draws
    return out
