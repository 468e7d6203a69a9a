"""The one way the evaluation protocols classify (perturbed) inputs: :class:`Classifier`.

The evaluation module builds it from its model and the model's normalisation and hands it to the callbacks in
every ``test_step`` output (``outputs["classifier"]``); a callback never calls the module itself.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor, nn


class Classifier:
    """A frozen image classifier: normalisation with the model's ``mean`` / ``std`` and forwards in chunks.

    Args:
        model: the classifier (its logits ``[N, C]``).
        mean, std: per-channel normalisation of [0, 1] images (the model's own).
        batch_size: images per forward unless a call says otherwise.
    """

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float], batch_size: int = 64) -> None:
        mean = tuple(float(v) for v in mean)
        std = tuple(float(v) for v in std)
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean and std must have 3 entries (std > 0), got mean={mean} std={std}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.mean, self.std = mean, std
        self.batch_size = int(batch_size)
        self._mean = torch.tensor(mean).view(1, 3, 1, 1)
        self._std = torch.tensor(std).view(1, 3, 1, 1)

    def normalize(self, images: Tensor) -> Tensor:
        """[0, 1] images -> the model's input (``(x - mean) / std``)."""
        return (images - self._mean.to(images)) / self._std.to(images)

    @torch.no_grad()
    def predict(self, images: Tensor, batch_size: Optional[int] = None) -> Tensor:
        """Predicted classes ``[N]`` of [0, 1] images ``[N, 3, H, W]``, ``batch_size`` images per forward."""
        step = batch_size or self.batch_size
        preds = [self.model(self.normalize(chunk)).argmax(dim=-1) for chunk in images.split(step)]
        return torch.cat(preds) if preds else torch.empty(0, dtype=torch.long, device=images.device)

    def __repr__(self) -> str:
        return (f"Classifier({type(self.model).__name__}, mean={self.mean}, std={self.std}, "
                f"batch_size={self.batch_size})")
