"""Synthetic shapes benchmark: the class is decided by ONE object whose pixel mask is known.

Every image shows a class object (a filled shape of a random bright colour, random size, position and rotation)
on a smooth, noisy, low-saturation textured background, plus *distractors* that are never a class shape: thin
line segments and small irregular speckle blobs in the same colour range as the objects (so colour is no cue).
The class is the shape kind (``SHAPES``: square, circle, triangle, cross, diamond, ring; the first
``num_classes`` are used). In the two-object mode an image holds two objects of *different* classes, one in
each half of the image (left/right or top/bottom, random), so their masks never overlap.

Conventions
-----------
* Sample ``i`` of a split is a pure function of ``(seed, split, i)`` and of the dataset's geometry options: it
  is drawn from its own ``numpy.random.Generator`` seeded with ``SeedSequence([seed, split_id, i])``; no
  global RNG is read or advanced, so order, workers and processes do not matter.
* Items are dicts ``{"image": FloatTensor[3, H, W] in [0, 1] (NOT normalised; models normalise),
  "label": LongTensor[], "mask": FloatTensor[H, W] in {0, 1} (the class object's pixels),
  "index": LongTensor[]}``; the two-object mode adds ``"other_label"`` and ``"other_mask"`` (the second
  object). Masks are exact: objects are drawn last and do not overlap, so every mask pixel shows its object.
* Default geometry is small for CPU training: 64 x 64 images (8 x 8 tokens with patch 8).
"""
from __future__ import annotations

import math
from typing import Dict, Tuple

import numpy as np
import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .split_loaders import SplitDataLoaders

SHAPES: Tuple[str, ...] = ("square", "circle", "triangle", "cross", "diamond", "ring")
SPLITS: Dict[str, int] = {"train": 0, "val": 1, "test": 2}


# ----------------------------------------------------------------------------------------------- drawing
def shape_mask(kind: str, u: np.ndarray, v: np.ndarray, r: float) -> np.ndarray:
    """Boolean mask of shape ``kind`` of half-extent ``r`` in object coordinates (``u`` right, ``v`` down)."""
    if kind == "square":
        return np.maximum(np.abs(u), np.abs(v)) <= 0.8 * r
    if kind == "circle":
        return u * u + v * v <= r * r
    if kind == "triangle":  # equilateral, pointing up (v < 0), circumradius r
        s3 = math.sqrt(3.0)
        return (v <= 0.5 * r) & (s3 * u - v <= r) & (-s3 * u - v <= r)
    if kind == "cross":
        arm = 0.32 * r
        return ((np.abs(u) <= arm) & (np.abs(v) <= r)) | ((np.abs(v) <= arm) & (np.abs(u) <= r))
    if kind == "diamond":
        return np.abs(u) + np.abs(v) <= r
    if kind == "ring":
        d2 = u * u + v * v
        return (d2 <= r * r) & (d2 >= (0.55 * r) ** 2)
    raise ValueError(f"unknown shape {kind!r}; known shapes: {', '.join(SHAPES)}")


def _hsv_to_rgb(h: float, s: float, v: float) -> np.ndarray:
    i = int(h * 6.0) % 6
    f = h * 6.0 - int(h * 6.0)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    return np.array([(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i], dtype=np.float32)


def _bright_colour(rng: np.random.Generator) -> np.ndarray:
    return _hsv_to_rgb(rng.random(), rng.uniform(0.55, 1.0), rng.uniform(0.75, 1.0))


def _smooth_noise(rng: np.random.Generator, size: int, cells: int, channels: int) -> np.ndarray:
    """Bilinear upsampling of a ``cells x cells`` random grid to ``size x size`` (numpy only, deterministic)."""
    grid = rng.random((channels, cells + 1, cells + 1)).astype(np.float32)
    pos = (np.arange(size, dtype=np.float32) + 0.5) / size * cells
    i0 = np.clip(np.floor(pos).astype(int), 0, cells - 1)
    w = (pos - i0)[None, :]
    rows = grid[:, i0, :] * (1 - w[..., None]) + grid[:, i0 + 1, :] * w[..., None]  # [C, size, cells+1]
    return rows[:, :, i0] * (1 - w[:, None, :]) + rows[:, :, i0 + 1] * w[:, None, :]


class SyntheticShapesDataset(Dataset):
    """One split of the synthetic shapes benchmark (see the module docstring for the conventions)."""

    def __init__(
        self,
        size: int,
        seed: int = 0,
        split: str = "train",
        image_size: int = 64,
        num_classes: int = 4,
        two_objects: bool = False,
        object_scale: Tuple[float, float] = (0.16, 0.24),
        num_distractors: Tuple[int, int] = (2, 5),
        noise_std: float = 0.04,
        cache: bool = False,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
        if not 2 <= num_classes <= len(SHAPES):
            raise ValueError(f"num_classes must be in [2, {len(SHAPES)}] (shapes: {', '.join(SHAPES)}), "
                             f"got {num_classes}")
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        if image_size < 16:
            raise ValueError(f"image_size must be >= 16 pixels, got {image_size}")
        lo, hi = object_scale
        if not 0.05 <= lo <= hi <= 0.25:
            # half-extent as a fraction of the image side; <= 0.25 so that an object fits in half an image
            raise ValueError(f"object_scale must satisfy 0.05 <= low <= high <= 0.25, got {object_scale}")
        self.size = int(size)
        self.seed = int(seed)
        self.split = split
        self.image_size = int(image_size)
        self.num_classes = int(num_classes)
        self.classes = SHAPES[: self.num_classes]
        self.two_objects = bool(two_objects)
        self.object_scale = (float(lo), float(hi))
        self.num_distractors = (int(num_distractors[0]), int(num_distractors[1]))
        self.noise_std = float(noise_std)
        self.cache = bool(cache)
        self._items: Dict[int, Dict[str, Tensor]] = {}

    def __len__(self) -> int:
        return self.size

    # ------------------------------------------------------------------------------------------- sample
    def _rng(self, index: int) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, SPLITS[self.split], index])))

    def _object(self, rng, kind, box, yy, xx) -> np.ndarray:
        """Mask of a ``kind`` object placed at random inside ``box = (y0, y1, x0, x1)`` (pixels)."""
        n = self.image_size
        r = rng.uniform(*self.object_scale) * n
        y0, y1, x0, x1 = box
        cy = rng.uniform(y0 + r, y1 - r)
        cx = rng.uniform(x0 + r, x1 - r)
        angle = rng.uniform(-math.pi / 6, math.pi / 6)
        c, s = math.cos(angle), math.sin(angle)
        dx, dy = xx - cx, yy - cy
        return shape_mask(kind, c * dx + s * dy, -s * dx + c * dy, r)

    def __getitem__(self, index: int) -> Dict[str, Tensor]:
        if not -self.size <= index < self.size:
            raise IndexError(f"index {index} out of range for a {self.split} split of {self.size} samples")
        index = index % self.size if self.size else index
        if self.cache:
            if index not in self._items:
                self._items[index] = self._make(index)
            return {k: v.clone() for k, v in self._items[index].items()}
        return self._make(index)

    def _make(self, index: int) -> Dict[str, Tensor]:
        rng = self._rng(index)
        n = self.image_size
        yy, xx = np.mgrid[0:n, 0:n].astype(np.float32) + 0.5

        # background: smooth low-saturation texture + fine noise
        base = rng.uniform(0.15, 0.5)
        tint = _smooth_noise(rng, n, int(rng.integers(2, 6)), 3) * 0.25 - 0.125
        lum = _smooth_noise(rng, n, int(rng.integers(4, 10)), 1) * rng.uniform(0.1, 0.3)
        image = np.clip(base + 0.5 * tint + lum, 0.0, 1.0)

        # distractors: thin line segments and small speckle blobs, never a class shape
        for _ in range(int(rng.integers(self.num_distractors[0], self.num_distractors[1] + 1))):
            colour = _bright_colour(rng)[:, None]
            if rng.random() < 0.5:
                length = rng.uniform(0.15, 0.35) * n
                theta = rng.uniform(0, math.pi)
                x0, y0 = rng.uniform(0, n), rng.uniform(0, n)
                ux, uy = math.cos(theta), math.sin(theta)
                t = (xx - x0) * ux + (yy - y0) * uy
                d = np.abs(-(xx - x0) * uy + (yy - y0) * ux)
                m = (t >= 0) & (t <= length) & (d <= max(0.6, n / 96))
            else:
                rad = rng.uniform(0.04, 0.08) * n
                cx, cy = rng.uniform(0, n), rng.uniform(0, n)
                speckle = _smooth_noise(rng, n, max(2, n // 3), 1)[0]
                m = ((xx - cx) ** 2 + (yy - cy) ** 2 <= rad * rad) & (speckle > 0.5)
            image[:, m] = colour

        # class object(s)
        label = int(rng.integers(self.num_classes))
        full = (0.0, float(n), 0.0, float(n))
        if self.two_objects:
            other = int(rng.integers(self.num_classes - 1))
            other = other + (other >= label)
            half = n / 2.0
            if rng.random() < 0.5:  # left / right
                boxes = [(0.0, float(n), 0.0, half), (0.0, float(n), half, float(n))]
            else:  # top / bottom
                boxes = [(0.0, half, 0.0, float(n)), (half, float(n), 0.0, float(n))]
            if rng.random() < 0.5:
                boxes = boxes[::-1]
            objects = [(label, boxes[0]), (other, boxes[1])]
        else:
            objects = [(label, full)]
        masks = []
        for cls, box in objects:
            m = self._object(rng, self.classes[cls], box, yy, xx)
            shade = 1.0 + 0.08 * (_smooth_noise(rng, n, 4, 1)[0] - 0.5)
            image[:, m] = np.clip(_bright_colour(rng)[:, None] * shade[m][None, :], 0.0, 1.0)
            masks.append(m)

        image = image + rng.normal(0.0, self.noise_std, size=image.shape).astype(np.float32)
        item = {
            "image": torch.from_numpy(np.clip(image, 0.0, 1.0).astype(np.float32)),
            "label": torch.tensor(label, dtype=torch.long),
            "mask": torch.from_numpy(masks[0].astype(np.float32)),
            "index": torch.tensor(index, dtype=torch.long),
        }
        if self.two_objects:
            item["other_label"] = torch.tensor(objects[1][0], dtype=torch.long)
            item["other_mask"] = torch.from_numpy(masks[1].astype(np.float32))
        return item


class SyntheticShapesDataModule(SplitDataLoaders, pl.LightningDataModule):
    """Train/val/test splits of :class:`SyntheticShapesDataset` (one object per image; ``two_objects`` makes
    the *test* split two-object images for class discrimination). Batches are dicts of stacked tensors.

    Images are in [0, 1] and not normalised: the models normalise with their own mean/std.
    ``cache_train`` keeps generated train samples in memory (identical values; saves regenerating them every
    epoch, ~65 kB per 64x64 sample, per dataloader worker).
    """

    def __init__(
        self,
        image_size: int = 64,
        num_classes: int = 4,
        train_size: int = 4096,
        val_size: int = 512,
        test_size: int = 512,
        two_objects: bool = False,
        seed: int = 0,
        batch_size: int = 128,
        num_workers: int = 0,
        object_scale: Tuple[float, float] = (0.16, 0.24),
        num_distractors: Tuple[int, int] = (2, 5),
        noise_std: float = 0.04,
        cache_train: bool = False,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self.save_hyperparameters()
        self.image_size = image_size
        self.num_classes = num_classes
        self.classes = SHAPES[:num_classes]
        self.batch_size = batch_size
        self.num_workers = num_workers
        self._sizes = {"train": train_size, "val": val_size, "test": test_size}
        self._common = dict(
            seed=seed, image_size=image_size, num_classes=num_classes, object_scale=tuple(object_scale),
            num_distractors=tuple(num_distractors), noise_std=noise_std,
        )
        self.two_objects = two_objects
        self.datasets: Dict[str, SyntheticShapesDataset] = {}

    def dataset(self, split: str) -> SyntheticShapesDataset:
        if split not in self.datasets:
            two = self.two_objects and split == "test"
            cache = self.hparams.cache_train and split == "train"
            self.datasets[split] = SyntheticShapesDataset(self._sizes[split], split=split, two_objects=two,
                                                          cache=cache, **self._common)
        return self.datasets[split]

