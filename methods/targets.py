"""Resolution of the explained class of each sample (``target=None | int | LongTensor[B]``)."""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

TargetType = Optional[Union[int, Tensor]]


def resolve_target(logits: Tensor, target: TargetType) -> Tensor:
    """Return a ``LongTensor[B]`` of class indices on ``logits.device``.

    ``None`` explains each sample's predicted class (argmax of its logits, as every reference does); an ``int``
    explains that class for every sample; a tensor gives one class per sample.
    """
    batch, num_classes = logits.shape[0], logits.shape[-1]
    if target is None:
        return logits.detach().argmax(dim=-1)
    if isinstance(target, int) and not isinstance(target, bool):
        target = torch.full((batch,), target, dtype=torch.long, device=logits.device)
    elif isinstance(target, Tensor):
        if target.dtype.is_floating_point or target.dtype == torch.bool:
            raise TypeError(f"target must hold integer class indices, got dtype {target.dtype}")
        target = target.to(device=logits.device, dtype=torch.long).reshape(-1)
        if target.numel() == 1 and batch != 1:
            target = target.expand(batch)
        if target.shape[0] != batch:
            raise ValueError(f"target has {target.shape[0]} entries but the batch has {batch} samples")
    else:
        raise TypeError(f"target must be None, an int or a LongTensor[B], got {type(target).__name__}")
    if (target < 0).any() or (target >= num_classes).any():
        raise ValueError(f"target classes must lie in [0, {num_classes}), got {target.tolist()}")
    return target


def class_score(logits: Tensor, target: Tensor) -> Tensor:
    """Sum over the batch of each sample's target logit: its gradient w.r.t. any per-sample tensor is that
    sample's own gradient (samples never interact in an eval-mode Transformer)."""
    return logits.gather(-1, target[:, None]).sum()
