"""ImageNet in the standard class-folder layout (``<root>/<split>/<wnid>/*.JPEG``) as a LightningDataModule.

Batches: ``{"image": FloatTensor[B, 3, H, W] in [0, 1] (NOT normalised), "label": LongTensor[B] (standard
1000-class index, see ``datamodules.imagenet_common``), "index": LongTensor[B] (position in the evaluated list)}``.

* ``split`` (default ``val``) is the evaluated split (``test_dataloader`` and ``val_dataloader``); ``train`` is
  the training split of probe heads (``RandomResizedCrop`` + flip).
* ``images_per_class``: a fixed subset of N images per class (Beyond Intuition's 5,000-image subset is
  ``images_per_class=5``): within each class, files sorted by name are permuted by a generator seeded with
  ``(subset_seed, class index)`` and the first N kept; the result is sorted by (class, file name), so the subset
  does not depend on the machine, the file system order or the number of processes.
* ``preprocessing``: ``chefer`` (``Resize((224, 224))`` squash) or ``timm`` (the model's data config:
  ``set_model_data_config`` is called by ``evaluate.py``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import Dataset

from methods.config_values import PlainDict

from .imagenet_common import PREPROCESSINGS, build_transform, standard_class_index
from .split_loaders import SplitDataLoaders

IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
LAYOUT = "<root>/<split>/<wnid>/<image>.JPEG (one folder per class, named by its WordNet id, e.g. n01440764)"


def scan_split(folder: Path, images_per_class: Optional[int] = None, seed: int = 0) -> List[Tuple[str, int]]:
    """``[(path, class index)]`` of a class-folder split, sorted by (class, file name); errors name the folder."""
    if not folder.is_dir():
        raise FileNotFoundError(f"ImageNet split folder {str(folder)!r} does not exist; expected layout {LAYOUT}")
    index = standard_class_index()
    entries = sorted(os.scandir(folder), key=lambda e: e.name)
    class_dirs = [e for e in entries if e.is_dir()]
    loose = [e.name for e in entries if e.is_file() and e.name.lower().endswith(IMAGE_SUFFIXES)]
    if loose:
        raise ValueError(f"{str(folder)!r} holds image files directly ({loose[0]}, ...): expected the class-folder "
                         f"layout {LAYOUT} (the flat ILSVRC val release must be sorted into class folders first)")
    if not class_dirs:
        raise ValueError(f"{str(folder)!r} has no class folders; expected layout {LAYOUT}")
    unknown = [e.name for e in class_dirs if e.name not in index]
    if unknown:
        raise ValueError(f"{str(folder)!r} has folders that are not ImageNet-1k wnids ({', '.join(unknown[:3])}); "
                         f"expected layout {LAYOUT}")
    samples: List[Tuple[str, int]] = []
    for entry in class_dirs:
        label = index[entry.name]
        files = sorted(f.path for f in os.scandir(entry.path)
                       if f.is_file() and f.name.lower().endswith(IMAGE_SUFFIXES))
        if images_per_class is not None:
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), label])))
            keep = np.sort(rng.permutation(len(files))[:images_per_class])
            files = [files[i] for i in keep]
        samples += [(f, label) for f in files]
    if not samples:
        raise ValueError(f"no images (*.JPEG) in the class folders of {str(folder)!r}; expected layout {LAYOUT}")
    return samples


class ImageFolderDataset(Dataset):
    """Items ``{"image", "label", "index"}`` of a list of (path, label); unreadable images raise naming the path."""

    def __init__(self, samples: List[Tuple[str, int]], transform) -> None:
        self.samples = samples
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        from PIL import Image

        path, label = self.samples[index]
        try:
            with Image.open(path) as img:
                img = img.convert("RGB")
        except Exception as err:
            raise RuntimeError(f"cannot read image {path!r} (corrupt or not an image): {err}") from err
        return {"image": self.transform(img), "label": torch.tensor(label, dtype=torch.long),
                "index": torch.tensor(index, dtype=torch.long)}


class ImageNetDataModule(SplitDataLoaders, pl.LightningDataModule):
    """ImageNet class-folder splits (see the module docstring)."""

    #: validation, test and prediction all read the evaluation split
    stage_splits = {"train": "train", "val": "eval", "test": "eval", "predict": "eval"}

    def __init__(self, root: str, split: str = "val", train_split: str = "train", preprocessing: str = "chefer",
                 image_size: int = 224, images_per_class: Optional[int] = None, subset_seed: int = 0,
                 batch_size: int = 16, num_workers: int = 0, data_config: Optional[PlainDict] = None) -> None:
        super().__init__()
        if preprocessing not in PREPROCESSINGS:
            raise ValueError(f"unknown preprocessing {preprocessing!r}; choose one of {PREPROCESSINGS}")
        if images_per_class is not None and images_per_class < 1:
            raise ValueError(f"images_per_class must be >= 1 or None, got {images_per_class}")
        if batch_size < 1 or num_workers < 0:
            raise ValueError(f"batch_size must be >= 1 and num_workers >= 0, got {batch_size}, {num_workers}")
        self.save_hyperparameters()
        self.root = os.path.expanduser(root)
        self.split, self.train_split = split, train_split
        self.preprocessing = preprocessing
        self.image_size = image_size
        self.images_per_class, self.subset_seed = images_per_class, subset_seed
        self.batch_size, self.num_workers = batch_size, num_workers
        self.data_config = dict(data_config) if data_config else None
        self.datasets: Dict[str, ImageFolderDataset] = {}

    def set_model_data_config(self, data_config: Dict[str, Any]) -> None:
        """The evaluated model's timm data config (used by ``preprocessing='timm'`` unless one was given)."""
        if self.data_config is None:
            self.data_config = dict(data_config)

    def dataset(self, which: str = "eval") -> ImageFolderDataset:
        if which not in self.datasets:
            if not Path(self.root).is_dir():
                raise FileNotFoundError(f"ImageNet root {self.root!r} does not exist; expected layout {LAYOUT}")
            if which == "train":
                samples = scan_split(Path(self.root) / self.train_split)
                transform = build_transform(self.preprocessing, self.image_size, train=True)
            else:
                samples = scan_split(Path(self.root) / self.split, self.images_per_class, self.subset_seed)
                transform = build_transform(self.preprocessing, self.image_size, self.data_config)
            self.datasets[which] = ImageFolderDataset(samples, transform)
        return self.datasets[which]

