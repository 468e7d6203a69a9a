"""The learning-rate schedule every training module here uses: a linear warm-up, then a constant rate, a cosine
decay or a linear decay to zero, stepped once per optimiser step."""
from __future__ import annotations

import math
from typing import Callable, Dict

import torch

DECAYS = ("constant", "cosine", "linear")


def warmup_then_decay(warmup_steps: int, total_steps: int, decay: str) -> Callable[[int], float]:
    """The factor of the base rate at optimiser step ``step`` (0-based): ``(step + 1) / warmup_steps`` during the
    warm-up, then ``decay``:

    * ``constant``: 1;
    * ``cosine``: ``(1 + cos(pi * p)) / 2``, with ``p`` the fraction of the steps after the warm-up done (capped
      at 1);
    * ``linear``: ``(total - step) / (total - warmup)``, down to 0.
    """
    if decay not in DECAYS:
        raise ValueError(f"decay must be one of {DECAYS}, got {decay!r}")
    warm, total = int(warmup_steps), int(total_steps)
    after = max(total - warm, 1)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if decay == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(step - warm, after) / after))
        if decay == "linear":
            return max(0.0, (total - step) / after)
        return 1.0

    return factor


def stepped_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, decay: str) -> Dict:
    """What ``configure_optimizers`` returns for :func:`warmup_then_decay`, stepped at every optimiser step."""
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_decay(warmup_steps, total_steps, decay))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
