"""Infidelity and max-sensitivity (Yeh et al. 2019, NeurIPS, "On the (in)fidelity and sensitivity of
explanations", eq. 2 and eq. 5), per sample.

* :func:`sample_noise`: each sample's R perturbations, from a ``numpy`` ``Generator`` seeded with
  ``SeedSequence([seed, stream, sample index])`` (``stream`` 0: infidelity's Gaussian ``N(0, scale²)``, 1:
  sensitivity's uniform ``U[-scale, scale]``, Captum's ``default_perturb_func``): independent of batch and process;
* :func:`infidelity`: with a_I = Iᵀa (the map's sum weighted by the perturbation) and Δ = f(x) − f(x − I),
  mean_r (a_I − Δ)² (``normalize=False``) or, as Captum's ``normalize=True`` (Captum#613 / PR #639), with the
  optimal scale β = Σ a_I Δ / Σ a_I² first: mean_r (β a_I − Δ)², which makes it independent of the map's scale;
* :func:`max_sensitivity`: max_r ‖Φ(x + δ_r) − Φ(x)‖_F / ‖Φ(x)‖_F (a zero map: the norm of the difference, Captum's
  convention).
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

STREAMS = {"infidelity": 0, "sensitivity": 1}


def sample_noise(sample_ids: Sequence[int], shape: Tuple[int, ...], runs: int, seed: int, kind: str,
                 scale: float) -> Tensor:
    """float64 ``[R, B, *shape]``: ``kind`` ``infidelity`` (Gaussian, std ``scale``) or ``sensitivity`` (uniform in
    ``[-scale, scale]``) perturbations of every sample (module docstring)."""
    if kind not in STREAMS:
        raise ValueError(f"unknown perturbation kind {kind!r}; choose one of {tuple(STREAMS)}")
    parts = []
    for sample in (int(s) for s in sample_ids):
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), STREAMS[kind], sample]))
        size = (runs, *shape)
        parts.append(rng.normal(0.0, scale, size) if kind == "infidelity" else rng.uniform(-scale, scale, size))
    return torch.from_numpy(np.stack(parts, axis=1))


def infidelity(weighted_sums: Tensor, drops: Tensor, normalize: bool = True) -> Tensor:
    """Infidelity ``[B]`` from ``a_I`` and ``Δ`` ``[R, B]`` (module docstring)."""
    a, d = weighted_sums.to(torch.float64), drops.to(torch.float64)
    if normalize:
        saa, sad = (a * a).sum(dim=0), (a * d).sum(dim=0)
        beta = torch.where(saa != 0, sad / torch.where(saa != 0, saa, torch.ones_like(saa)), torch.zeros_like(saa))
        a = beta[None] * a
    return ((a - d) ** 2).mean(dim=0)


def max_sensitivity(perturbed_maps: Tensor, clean_maps: Tensor) -> Tensor:
    """Max-sensitivity ``[B]`` from ``[R, B, ...]`` maps of the perturbed inputs and ``[B, ...]`` clean maps."""
    runs, b = perturbed_maps.shape[:2]
    clean = clean_maps.to(torch.float64).reshape(b, -1)
    diff = (perturbed_maps.to(torch.float64).reshape(runs, b, -1) - clean[None]).norm(dim=-1)
    norm = clean.norm(dim=-1)
    return (diff / torch.where(norm == 0, torch.ones_like(norm), norm)[None]).max(dim=0).values
