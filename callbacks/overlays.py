"""Heatmap overlays of the first few test images per method, logged as images through ``trainer.logger``.

Only the global-rank-0 process collects (its first ``num_images`` samples) and logs; maps are the protocols'
pixel maps (bilinear upsampling from the model's patch grid, per-image min-max;
:func:`evaluation.pixel_maps.pixel_maps`) of the ``class_setting`` (default ``predicted``), blended 50/50 with
the image through a jet-like colour map.
A logger without ``log_image`` (e.g. CSV) is skipped.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np
import pytorch_lightning as pl
from torch import Tensor

from evaluation.pixel_maps import pixel_maps


def jet(values: np.ndarray) -> np.ndarray:
    """``[..., 3]`` RGB in [0, 1] of values in [0, 1] (piecewise-linear jet: blue -> cyan -> yellow -> red)."""
    v = np.clip(values, 0.0, 1.0)[..., None]
    r = np.clip(1.5 - np.abs(4 * v - 3), 0, 1)
    g = np.clip(1.5 - np.abs(4 * v - 2), 0, 1)
    b = np.clip(1.5 - np.abs(4 * v - 1), 0, 1)
    return np.concatenate([r, g, b], axis=-1)


def overlay(image: Tensor, heatmap: Tensor, alpha: float = 0.5) -> np.ndarray:
    """uint8 ``[H, W, 3]``: ``(1 - alpha) * image + alpha * jet(heatmap)``."""
    img = image.detach().float().cpu().permute(1, 2, 0).numpy()
    blended = (1 - alpha) * img + alpha * jet(heatmap.detach().float().cpu().numpy())
    return (np.clip(blended, 0, 1) * 255).round().astype(np.uint8)


class HeatmapOverlays(pl.Callback):
    """Log ``num_images`` overlays per method under ``overlays/<method>`` (rank 0 only)."""

    def __init__(self, num_images: int = 4, class_setting: str = "predicted", alpha: float = 0.5) -> None:
        super().__init__()
        if num_images < 0:
            raise ValueError(f"num_images must be >= 0, got {num_images}")
        self.num_images = int(num_images)
        self.class_setting = class_setting
        self.alpha = float(alpha)
        self._images: List[Tensor] = []
        self._captions: List[str] = []
        self._maps: Dict[str, List[Tensor]] = {}

    def on_test_start(self, trainer, pl_module) -> None:
        self._images, self._captions, self._maps = [], [], {}

    # a resumed run (evaluate.py --resume) keeps the overlays collected before it was stopped
    def extra_progress_state(self) -> Dict[str, object]:
        return {"images": list(self._images), "captions": list(self._captions),
                "maps": {k: list(v) for k, v in self._maps.items()}}

    def load_extra_progress_state(self, state: Dict[str, object]) -> None:
        self._images, self._captions = list(state["images"]), list(state["captions"])
        self._maps = {k: list(v) for k, v in state["maps"].items()}

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        need = self.num_images - len(self._images)
        if not trainer.is_global_zero or need <= 0 or not outputs:
            return
        images = batch["image"][:need]
        preds = outputs["logits"].argmax(dim=-1)
        for b in range(images.shape[0]):
            self._captions.append(f"label {int(batch['label'][b])}, predicted {int(preds[b])}")
        self._images += [img.cpu() for img in images]
        layout = outputs.get("layout")
        grid = None if layout is None else tuple(layout.grid)
        for method, per_setting in outputs["relevance"].items():
            rel = per_setting.get(self.class_setting)
            if rel is None:
                continue
            maps = pixel_maps(rel[:need], images.shape[-2:], grid)
            self._maps.setdefault(method, []).extend(m.cpu() for m in maps)

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        logger = trainer.logger
        if not trainer.is_global_zero or logger is None or not hasattr(logger, "log_image") or not self._images:
            return
        for method, maps in self._maps.items():
            pictures = [overlay(img, m, self.alpha) for img, m in zip(self._images, maps)]
            logger.log_image(key=f"overlays/{method}", images=pictures, caption=self._captions[:len(pictures)])
