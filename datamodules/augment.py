"""Batched train-time augmentation on [0, 1] image tensors: RandomResizedCrop and horizontal flip.

One affine ``grid_sample`` per batch (bilinear, ``align_corners=False``), output size = input size. The crop
follows torchvision's RandomResizedCrop parameters (area fraction in ``scale``, aspect ratio log-uniform in
``ratio``); boxes that do not fit are shrunk to the image instead of re-drawn. Draws from ``generator``
(or the global RNG), on the images' device.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

AUGMENTATIONS = ("none", "flip", "rrc+flip")


def random_resized_crop_flip(
    images: Tensor,
    crop: bool = True,
    flip: bool = True,
    scale: Tuple[float, float] = (0.08, 1.0),
    ratio: Tuple[float, float] = (3 / 4, 4 / 3),
    generator: Optional[torch.Generator] = None,
) -> Tensor:
    if images.dim() != 4:
        raise ValueError(f"expected images [B, C, H, W], got {tuple(images.shape)}")
    b, device = images.shape[0], images.device

    def rand(*shape):
        return torch.rand(*shape, generator=generator, device="cpu").to(device=device, dtype=images.dtype)

    if crop:
        area = scale[0] + (scale[1] - scale[0]) * rand(b)
        log_r = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * rand(b)
        aspect = torch.exp(log_r)
        w = torch.sqrt(area * aspect).clamp(max=1.0)  # fraction of the width
        h = torch.sqrt(area / aspect).clamp(max=1.0)
        cx = (1 - w) * (2 * rand(b) - 1)  # centre in normalised coords, box inside the image
        cy = (1 - h) * (2 * rand(b) - 1)
    else:
        w = h = torch.ones(b, device=device, dtype=images.dtype)
        cx = cy = torch.zeros(b, device=device, dtype=images.dtype)
    sx = w * (torch.where(rand(b) < 0.5, -1.0, 1.0) if flip else 1.0)
    theta = torch.zeros(b, 2, 3, device=device, dtype=images.dtype)
    theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = sx, cx, h, cy
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)
