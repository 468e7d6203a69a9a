"""Image removal on a substrate, in pixel or patch units: the perturber of the probability-scored curves
(deletion / insertion, MoRF / LeRF, ROAD; ``callbacks.removal_curves``).

A removed unit takes the value of a *substrate* image at its pixels (all channels), in the [0, 1] space of
``batch["image"]`` (before the model's normalisation):

* ``mean``: the model's mean colour, i.e. 0 after normalisation (RISE's deletion substrate ``zeros_like`` of the
  normalised tensor);
* ``black``: 0 in [0, 1] space (Chefer's perturbation fill);
* ``blur``: the image blurred by RISE's kernel (``klen`` 11, ``sigma`` 5: its ``gkern``, :func:`gaussian_kernel`;
  insertion's start), convolved channel-wise with zero padding **in the normalised space** (as RISE blurs the
  normalised tensor: the border pads with the mean colour);
* ``road``: ROAD's noisy linear imputation of the removed pixels (:mod:`evaluation.road_imputation`), noise drawn
  per sample index, step and stream from ``seed``.

Units: ``pixel`` (the ``H * W`` pixels, scored by the protocols' pixel maps, :func:`evaluation.pixel_maps`) or
``patch`` (the model's patch grid ``layout.grid``: a token map's scores as they are, a pixel map averaged per patch;
a removed patch removes its pixels).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from methods.random_baseline import random_token_scores

from .perturbers import PixelPerturber
from .pixel_maps import pixel_maps
from .road_imputation import impute

SUBSTRATES = ("mean", "black", "blur", "road")
UNITS = ("pixel", "patch")


def gaussian_kernel(klen: int, sigma: float) -> Tensor:
    """RISE's blur kernel ``[klen, klen]`` (float64; its ``gkern``: a centred delta on a ``klen`` window filtered by
    a Gaussian of ``sigma`` truncated at ``4 sigma``, the window's border reflecting half a sample, so the mass
    that leaves the window folds back into it): the outer product of the folded 1-D kernel, summing to 1."""
    if klen < 1 or klen % 2 == 0 or sigma <= 0:
        raise ValueError(f"blur needs an odd kernel length and sigma > 0, got klen={klen}, sigma={sigma}")
    radius = int(4.0 * sigma + 0.5)
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float64)
    weights = torch.exp(-0.5 * offsets ** 2 / sigma ** 2)
    weights = weights / weights.sum()
    position = (offsets.long() + klen // 2) % (2 * klen)                 # half-sample reflection, period 2 klen
    position = torch.where(position >= klen, 2 * klen - 1 - position, position)
    folded = torch.zeros(klen, dtype=torch.float64).index_add_(0, position, weights)
    return folded[:, None] * folded[None, :]


def blur(images: Tensor, mean: Sequence[float], klen: int = 11, sigma: float = 5.0) -> Tensor:
    """``images`` ``[B, C, H, W]`` in [0, 1] blurred channel-wise, zero-padded in the normalised space (= padded
    with ``mean``)."""
    c = images.shape[1]
    m = torch.as_tensor(mean, dtype=torch.float64, device=images.device).reshape(1, c, 1, 1)
    kernel = gaussian_kernel(klen, sigma).to(images.device)[None, None].expand(c, 1, klen, klen)
    out = F.conv2d(images.to(torch.float64) - m, kernel, padding=klen // 2, groups=c) + m
    return out.to(images.dtype)


class SubstratePerturber(PixelPerturber):
    """Removes pixel or patch units of ``batch["image"]`` onto a substrate (module docstring).

    Args:
        substrate: ``mean``, ``black``, ``blur`` or ``road``.
        unit: ``pixel`` or ``patch``.
        klen, sigma: the blur kernel.
        noise: ROAD's imputation noise (standard deviation in [0, 1] space).
        seed: ROAD's noise seed.
    """

    def __init__(self, substrate: str = "mean", unit: str = "pixel", klen: int = 11, sigma: float = 5.0,
                 noise: float = 0.01, seed: int = 0) -> None:
        if substrate not in SUBSTRATES:
            raise ValueError(f"unknown substrate {substrate!r}; choose one of {SUBSTRATES}")
        if unit not in UNITS:
            raise ValueError(f"unknown image unit {unit!r}; choose one of {UNITS} (token units are text's)")
        gaussian_kernel(klen, sigma)
        self.substrate, self.unit = substrate, unit
        self.fill = "chefer" if substrate == "black" else "mean"
        self.klen, self.sigma, self.noise, self.seed = int(klen), float(sigma), float(noise), int(seed)
        self.name = f"{substrate}/{unit}"

    @staticmethod
    def _patch_grid(layout: Any, images: Tensor) -> Tuple[int, int]:
        grid = None if layout is None else getattr(layout, "grid", None)
        if grid is None:
            raise ValueError("patch units need the model's patch grid (outputs['layout'].grid)")
        h, w = (int(v) for v in grid)
        if images.shape[-2] % h or images.shape[-1] % w:
            raise ValueError(f"patch units: the image {tuple(images.shape[-2:])} is not a multiple of the grid "
                             f"{(h, w)}")
        return h, w

    def unit_scores(self, relevance: Tensor, batch: Mapping[str, Any], layout: Any = None) -> Tensor:
        if self.unit == "pixel":
            return super().unit_scores(relevance, batch, layout)
        images = self._images(batch)
        h, w = self._patch_grid(layout, images)
        rel = relevance.detach()
        if rel.dim() == 2 and rel.shape[1] == h * w:
            return rel.to(torch.float64)
        maps = pixel_maps(rel, images.shape[-2:], (h, w)).to(torch.float64)
        return F.adaptive_avg_pool2d(maps[:, None], (h, w)).flatten(1)

    def tie_scores(self, sample_ids: Tensor, batch: Mapping[str, Any], layout: Any, seed: int) -> Tensor:
        if self.unit == "pixel":
            return super().tie_scores(sample_ids, batch, layout, seed)
        h, w = self._patch_grid(layout, self._images(batch))
        return random_token_scores(sample_ids, h * w, seed).to(self._images(batch).device)

    def num_units(self, batch: Mapping[str, Any]) -> int:
        if self.unit == "pixel":
            return super().num_units(batch)
        if self._grid_hw is None:
            raise ValueError("patch units: set_layout(layout, batch) must name the patch grid first")
        return self._grid_hw[0] * self._grid_hw[1]

    def pixel_mask(self, removed: Tensor, images: Tensor) -> Tensor:
        """``[S, B, H, W]`` bool of the pixels of the removed units ``[S, B, N]``."""
        s, b, n = removed.shape
        height, width = images.shape[-2:]
        if n == height * width:
            return removed.reshape(s, b, height, width)
        grid = self._grid_hw
        if grid is None or grid[0] * grid[1] != n:
            raise ValueError(f"cannot place {n} patch units on a {height}x{width} image")
        cells = removed.reshape(s * b, 1, grid[0], grid[1]).to(torch.uint8)
        return F.interpolate(cells, size=(height, width), mode="nearest").bool().reshape(s, b, height, width)

    _grid_hw: Optional[Tuple[int, int]] = None

    def set_layout(self, layout: Any, batch: Mapping[str, Any]) -> None:
        """Remember the patch grid of the run (patch units)."""
        if self.unit == "patch":
            self._grid_hw = self._patch_grid(layout, self._images(batch))

    def substrate_images(self, images: Tensor, classifier: Any) -> Tensor:
        """The mask-independent substrate ``[B, C, H, W]`` (``mean``, ``black``, ``blur``)."""
        if self.substrate == "blur":
            return blur(images, classifier.mean, self.klen, self.sigma)
        fill = self.fill_value(classifier).to(images)
        return fill.reshape(1, -1, 1, 1).expand_as(images)

    def perturb(self, batch: Mapping[str, Any], removed: Tensor, classifier: Any, stream: int = 0) -> Tensor:
        images = self._images(batch)
        mask = self.pixel_mask(removed, images)                                  # [S, B, H, W]
        s, b = mask.shape[:2]
        if self.substrate == "road":
            index = batch.get("index")
            if not isinstance(index, Tensor):
                raise KeyError("ROAD's imputation noise is drawn per sample from batch['index'], which is missing")
            seeds = [road_seed(self.seed, stream, step, int(i)) for step in range(s) for i in index.tolist()]
            flat = images[None].expand(s, *images.shape).reshape(s * b, *images.shape[1:])
            return impute(flat, mask.reshape(s * b, *mask.shape[2:]), self.noise, seeds)
        substrate = self.substrate_images(images, classifier)
        return torch.where(mask[:, :, None], substrate[None], images[None]).flatten(0, 1)

    def __repr__(self) -> str:
        return f"SubstratePerturber(substrate={self.substrate!r}, unit={self.unit!r})"


def road_seed(seed: int, stream: int, step: int, index: int) -> int:
    """The noise seed of one imputed image: a function of the run's seed, the curve (``stream``), the step and the
    sample's dataset index alone."""
    return ((((int(seed) * 1_000_003) + int(stream)) * 1_000_003 + int(step)) * 1_000_003 + int(index)) % (2 ** 62)
