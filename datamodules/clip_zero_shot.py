"""CLIP zero-shot classification data: images plus the prompt set the zero-shot classifier is built from.

Images (batches as the other image datamodules give them: ``{"image": [B, 3, H, W] in [0, 1], NOT normalised,
"label": [B], "index": [B], ...}``; CLIP's own mean/std, :data:`CLIP_MEAN` / :data:`CLIP_STD`, are the
datamodule's ``mean`` / ``std`` for the model to normalise with):

* ``images="imagenet"``: ImageNet class folders ``<root>/<split>/<wnid>/*.JPEG`` (standard 1000-class labels,
  :mod:`datamodules.imagenet`); ``preprocessing="clip"`` is CLIP's own eval transform (shorter side resized to
  ``image_size`` with bicubic interpolation, centre crop, Radford et al. 2021 / ``CLIPProcessor``), ``"chefer"``
  the squash of the ViT tests. ``subset_index``: a ``.npy`` file of indices into the full validation list in
  torchvision's ``ImageNet(split="val")`` order (class folders sorted by wnid, files sorted within each: the
  order :func:`datamodules.imagenet.scan_split` gives); ``"bi"`` is Beyond Intuition's fixed 5,000-image subset
  (the authors' ``pert_index.npy``, ``../shared/data/bi_clip/``), kept in the file's order.
  ``images_per_class`` draws a per-class subset instead (see :class:`datamodules.imagenet.ImageNetDataModule`).
* ``images="synthetic"``: the synthetic shapes benchmark's test split (with its ground-truth masks), class names
  the shape names.

Prompt sets (``prompts``, default ``"openai"``; ``classnames``, ``templates``): :mod:`models.clip_prompts`
(``"openai"``, ``"simple"``, ``"bi_legacy"``, ``"custom"``); on the synthetic images the sets' templates are
filled with the shape names.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Sequence, Union

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from methods.config_values import PlainDict
from models.clip import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, ZeroShotClassifier
from models.clip_prompts import build_prompt_set

from .imagenet import LAYOUT, ImageFolderDataset, scan_split
from .imagenet_common import build_transform
from .synthetic_shapes import SyntheticShapesDataModule

#: CLIP's normalisation (OpenAI's preprocessing; ``CLIPImageProcessor``'s image_mean / image_std)
CLIP_MEAN, CLIP_STD = OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
IMAGE_SOURCES = ("imagenet", "synthetic")
PREPROCESSINGS = ("clip", "chefer")
#: Beyond Intuition's 5,000-image subset, beside the checkout (``../shared/data/bi_clip/pert_index.npy``)
BI_SUBSET_FILE = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "bi_clip" / "pert_index.npy"


# ------------------------------------------------------------------------------------------ images
def clip_transform(image_size: int = 224, preprocessing: str = "clip"):
    """PIL RGB -> FloatTensor[3, S, S] in [0, 1]: ``clip`` = resize the shorter side to ``image_size`` (bicubic),
    centre crop (CLIP's own preprocessing, before its normalisation: timm's eval transform with ``crop_pct=1``);
    ``chefer`` = ``Resize((S, S))`` (:func:`datamodules.imagenet_common.build_transform`)."""
    if preprocessing not in PREPROCESSINGS:
        raise ValueError(f"unknown preprocessing {preprocessing!r}; choose one of {PREPROCESSINGS}")
    clip = {"input_size": (3, image_size, image_size), "crop_pct": 1.0, "interpolation": "bicubic"}
    return build_transform("timm" if preprocessing == "clip" else "chefer", image_size, clip)


def subset_by_index(samples: list, index_file: Union[str, Path], folder: Union[str, Path]) -> list:
    """``samples`` (the full split in torchvision's order) at the indices of ``index_file`` (``.npy``, integers),
    in the file's order; errors name the file and the folder."""
    path = Path(index_file).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"subset index file {str(path)!r} does not exist")
    try:
        indices = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ValueError(f"subset index file {str(path)!r} is not a .npy array: {err}") from err
    if indices.ndim != 1 or not np.issubdtype(indices.dtype, np.integer):
        raise ValueError(f"subset index file {str(path)!r} must hold a 1-d integer array, got {indices.dtype} "
                         f"{indices.shape}")
    if len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= len(samples)):
        raise ValueError(f"subset index file {str(path)!r} indexes images up to {int(indices.max())}, but "
                         f"{str(folder)!r} holds {len(samples)} images: the indices refer to the full split in "
                         f"torchvision's order (the 50,000-image ImageNet validation set for Beyond Intuition's file)")
    return [samples[int(i)] for i in indices]


class CLIPZeroShotDataModule(pl.LightningDataModule):
    """Images and a prompt set for CLIP zero-shot classification (module docstring).

    ``prompt_set``: the :class:`models.clip_prompts.PromptSet`; ``classnames``; ``zero_shot_classifier(clip,
    tokenizer)``: the :class:`models.clip.ZeroShotClassifier` built from it; ``mean`` / ``std``: CLIP's
    normalisation. The test, validation and predict loaders give the evaluated images; ``index`` is the position in
    the evaluated list.
    """

    def __init__(self, images: str = "imagenet", root: Optional[str] = None, split: str = "val",
                 prompts: str = "openai", classnames: Union[None, Sequence[str], PlainDict] = None,
                 templates: Union[None, str, Sequence[str]] = None, subset_index: Optional[str] = None,
                 images_per_class: Optional[int] = None, subset_seed: int = 0, image_size: int = 224,
                 preprocessing: str = "clip", num_classes: int = 4, test_size: int = 512, two_objects: bool = False,
                 seed: int = 0, batch_size: int = 16, num_workers: int = 0,
                 synthetic_options: Optional[PlainDict] = None) -> None:
        super().__init__()
        if images not in IMAGE_SOURCES:
            raise ValueError(f"images must be one of {IMAGE_SOURCES}, got {images!r}")
        if preprocessing not in PREPROCESSINGS:
            raise ValueError(f"unknown preprocessing {preprocessing!r}; choose one of {PREPROCESSINGS}")
        if images == "imagenet" and root is None:
            raise ValueError("images='imagenet' needs root (the folder holding <split>/<wnid>/*.JPEG)")
        if images == "synthetic" and (subset_index is not None or images_per_class is not None):
            raise ValueError("subset_index and images_per_class select ImageNet images; the synthetic benchmark "
                             "takes test_size")
        if subset_index is not None and images_per_class is not None:
            raise ValueError("give subset_index or images_per_class, not both")
        if batch_size < 1 or num_workers < 0:
            raise ValueError(f"batch_size must be >= 1 and num_workers >= 0, got {batch_size}, {num_workers}")
        self.save_hyperparameters()
        self.images, self.root, self.split = images, (os.path.expanduser(root) if root else None), split
        self.subset_index = str(BI_SUBSET_FILE) if subset_index == "bi" else subset_index
        self.images_per_class, self.subset_seed = images_per_class, subset_seed
        self.image_size, self.preprocessing = image_size, preprocessing
        self.batch_size, self.num_workers = batch_size, num_workers
        self.mean, self.std = CLIP_MEAN, CLIP_STD
        self._synthetic = None
        if images == "synthetic":
            self._synthetic = SyntheticShapesDataModule(
                image_size=image_size, num_classes=num_classes, test_size=test_size, two_objects=two_objects,
                seed=seed, batch_size=batch_size, num_workers=num_workers, **(synthetic_options or {}))
        shape_names = list(self._synthetic.classes) if self._synthetic is not None else None
        self.prompt_set = build_prompt_set(prompts, shape_names, classnames, templates, imagenet=images == "imagenet")
        self._dataset: Optional[Dataset] = None

    @property
    def classnames(self) -> List[str]:
        return self.prompt_set.classnames

    @property
    def num_classes(self) -> int:
        return len(self.prompt_set)

    def zero_shot_classifier(self, clip, tokenizer, batch_size: int = 256) -> ZeroShotClassifier:
        """The zero-shot classifier of the prompt set (OpenAI's recipe: :meth:`ZeroShotClassifier.from_prompts`),
        one class per entry of the set in its order: OpenAI's ImageNet names repeat "missile" and "sunglasses",
        each repeat its own class."""
        prompts = self.prompt_set
        return ZeroShotClassifier.from_prompt_lists(clip, tokenizer, prompts.classnames, prompts.prompts,
                                                    batch_size=batch_size)

    def dataset(self) -> Dataset:
        if self._dataset is None:
            if self._synthetic is not None:
                self._dataset = self._synthetic.dataset("test")
            else:
                if not Path(self.root).is_dir():
                    raise FileNotFoundError(f"ImageNet root {self.root!r} does not exist; expected layout {LAYOUT}")
                folder = Path(self.root) / self.split
                samples = scan_split(folder, self.images_per_class, self.subset_seed)
                if self.subset_index is not None:
                    samples = subset_by_index(samples, self.subset_index, folder)
                self._dataset = ImageFolderDataset(samples, clip_transform(self.image_size, self.preprocessing))
        return self._dataset

    def setup(self, stage: Optional[str] = None) -> None:
        self.dataset()

    def _loader(self) -> DataLoader:
        return DataLoader(self.dataset(), batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0, drop_last=False)

    val_dataloader = test_dataloader = predict_dataloader = _loader

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` in [0, 1] -> CLIP-normalised pixels."""
        mean = torch.tensor(self.mean, dtype=images.dtype, device=images.device)[:, None, None]
        std = torch.tensor(self.std, dtype=images.dtype, device=images.device)[:, None, None]
        return (images - mean) / std
