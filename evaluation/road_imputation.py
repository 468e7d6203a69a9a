"""ROAD's noisy linear imputation (Rong et al., ICML 2022, "A Consistent and Efficient Evaluation Strategy for
Attribution Methods", section 4.2), solved for many images at once.

Every removed pixel takes the weighted mean of its in-image 8-neighbours (weight 1/6 for the 4 edge neighbours,
1/12 for the 4 diagonal ones; at the border the weights of the missing neighbours are left out and the rest
renormalised): one linear equation per removed pixel and channel,
``sum_j w_ij x_j - (sum_j w_ij) x_i = 0`` with the known neighbours moved to the right-hand side. The systems of
all images of a call are one block-diagonal sparse system (``scipy.sparse``, one factorisation, one right-hand
side per channel), so the solve is batched. Gaussian noise of standard deviation ``noise`` is then added to the
imputed values only; it is drawn from one generator per image seeded by the caller (same numbers on any number of
processes). Images are imputed in the [0, 1] space, before the model's normalisation (ROAD's ``transform_test``).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import scipy.sparse
import scipy.sparse.linalg
import torch
from torch import Tensor

#: (dy, dx, weight) of the 8 neighbours
NEIGHBOURS = ((1, 1, 1 / 12), (0, 1, 1 / 6), (-1, 1, 1 / 12), (1, -1, 1 / 12), (0, -1, 1 / 6), (-1, -1, 1 / 12),
              (1, 0, 1 / 6), (-1, 0, 1 / 6))


#: images per sparse factorisation (SuperLU's time grows faster than linearly with the block size)
CHUNK = 8
#: SuperLU's column ordering (the fastest measured on these 8-neighbour systems)
ORDERING = "COLAMD"


def impute(images: Tensor, removed: Tensor, noise: float = 0.0, seeds: Optional[Sequence[int]] = None) -> Tensor:
    """``images`` ``[K, C, H, W]`` with the pixels of ``removed`` (bool ``[K, H, W]``) imputed (module docstring);
    ``seeds``: one generator seed per image (needed when ``noise > 0``). float64 solve, result in the images'
    dtype. The images are solved :data:`CHUNK` at a time, each chunk one block-diagonal system."""
    k, c, h, w = images.shape
    if removed.shape != (k, h, w):
        raise ValueError(f"impute: removed must be [K={k}, H={h}, W={w}], got {tuple(removed.shape)}")
    if noise and (seeds is None or len(seeds) != k):
        raise ValueError("impute: noise > 0 needs one seed per image")
    if (removed.flatten(1).all(dim=1)).any():
        raise ValueError("impute: an image with every pixel removed has nothing to impute from")
    parts = [_impute_block(images[i:i + CHUNK], removed[i:i + CHUNK], noise,
                           None if seeds is None else list(seeds)[i:i + CHUNK]) for i in range(0, k, CHUNK)]
    return torch.cat(parts) if parts else images.clone()


def _impute_block(images: Tensor, removed: Tensor, noise: float, seeds: Optional[Sequence[int]]) -> Tensor:
    k, c, h, w = images.shape
    flat_removed = removed.reshape(-1).cpu().numpy().astype(bool)
    unknown = np.flatnonzero(flat_removed)
    out = images.detach().to(torch.float64).cpu().permute(0, 2, 3, 1).reshape(-1, c).clone()   # [K*H*W, C]
    if unknown.size:
        var = np.full(flat_removed.size, -1, dtype=np.int64)
        var[unknown] = np.arange(unknown.size)
        img = unknown // (h * w)
        yy, xx = (unknown % (h * w)) // w, unknown % w
        known_values = out.numpy()
        rows, cols, vals = [], [], []
        rhs = np.zeros((unknown.size, c))
        diag = np.zeros(unknown.size)
        for dy, dx, weight in NEIGHBOURS:
            ny, nx = yy + dy, xx + dx
            inside = (ny >= 0) & (ny < h) & (nx >= 0) & (nx < w)
            eq = np.flatnonzero(inside)
            neighbour = img[eq] * h * w + ny[eq] * w + nx[eq]
            diag[eq] += weight
            is_unknown = flat_removed[neighbour]
            rows.append(eq[is_unknown])
            cols.append(var[neighbour[is_unknown]])
            vals.append(np.full(int(is_unknown.sum()), weight))
            np.subtract.at(rhs, eq[~is_unknown], weight * known_values[neighbour[~is_unknown]])
        rows.append(np.arange(unknown.size))
        cols.append(np.arange(unknown.size))
        vals.append(-diag)
        system = scipy.sparse.csc_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                                         shape=(unknown.size, unknown.size))
        solution = scipy.sparse.linalg.splu(system, permc_spec=ORDERING).solve(rhs)
        solved = torch.from_numpy(np.ascontiguousarray(solution)).reshape(-1, c)
        if noise and seeds is not None:
            draws = torch.cat([torch.randn(h * w, c, generator=torch.Generator().manual_seed(int(s)),
                                           dtype=torch.float64) for s in seeds])
            solved = solved + float(noise) * draws[torch.from_numpy(unknown)]
        out[torch.from_numpy(unknown)] = solved
    return out.reshape(k, h, w, c).permute(0, 3, 1, 2).to(images.dtype).to(images.device)
