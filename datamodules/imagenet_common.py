"""Pieces shared by the ImageNet datamodules: the standard 1000-class index and the preprocessing choices.

Class index: the position of the class's WordNet id in the **sorted** list of the 1000 ImageNet-1k wnids
(``n01440764`` = 0, tench, ...), the standard mapping of torchvision's ``ImageFolder`` on the full val set and of
every ImageNet classifier; taken from timm's bundled ImageNet-1k synset list, so it needs no download and is
the same for a folder that holds only some classes.

Preprocessing (images stay in [0, 1], NOT normalised: the evaluated model normalises with its own mean/std):

* ``chefer``: ``Resize((size, size))`` (a squash, no crop; bilinear) + ``ToTensor`` - the reference's perturbation
  and segmentation input;
* ``timm``: the model's own data config: resize the shorter side to ``floor(size / crop_pct)`` with its
  interpolation, centre crop ``size`` (timm's eval transform) + ``ToTensor``;
* ``train``: ``RandomResizedCrop(size)`` + ``RandomHorizontalFlip`` + ``ToTensor`` (probe heads).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

PREPROCESSINGS = ("chefer", "timm")


def imagenet_wnids() -> List[str]:
    from timm.data import ImageNetInfo

    wnids = list(ImageNetInfo().label_names())
    if len(wnids) != 1000 or wnids != sorted(wnids):
        raise RuntimeError("timm's ImageNet-1k synset list is not the sorted 1000 wnids")
    return wnids


def standard_class_index() -> Dict[str, int]:
    return {wnid: i for i, wnid in enumerate(imagenet_wnids())}


def _interpolation(name: str):
    from torchvision.transforms import InterpolationMode

    try:
        return InterpolationMode(name)
    except ValueError:
        choices = [m.value for m in InterpolationMode]
        raise ValueError(f"unknown interpolation {name!r}; choose one of {choices}") from None


def build_transform(preprocessing: str, image_size: int = 224, data_config: Optional[Dict[str, Any]] = None,
                    train: bool = False):
    """The torchvision transform PIL RGB -> FloatTensor[3, H, W] in [0, 1] (see the module docstring)."""
    from torchvision import transforms as T

    if train:
        return T.Compose([T.RandomResizedCrop(image_size), T.RandomHorizontalFlip(), T.ToTensor()])
    if preprocessing == "chefer":
        return T.Compose([T.Resize((image_size, image_size)), T.ToTensor()])
    if preprocessing == "timm":
        if not data_config:
            raise ValueError("preprocessing='timm' needs the model's data config (timm.data.resolve_data_config); "
                             "pass data_config or let evaluate.py set it from the model")
        size = int(data_config.get("input_size", (3, image_size, image_size))[-1])
        crop_pct = float(data_config.get("crop_pct", 0.875) or 1.0)
        interpolation = _interpolation(str(data_config.get("interpolation", "bilinear")))
        if data_config.get("crop_mode", "center") != "center":
            raise ValueError("only timm's centre-crop eval transform is supported, "
                             f"got crop_mode={data_config['crop_mode']!r}")
        return T.Compose([T.Resize(int(math.floor(size / crop_pct)), interpolation=interpolation),
                          T.CenterCrop(size), T.ToTensor()])
    raise ValueError(f"unknown preprocessing {preprocessing!r}; choose one of {PREPROCESSINGS}")
