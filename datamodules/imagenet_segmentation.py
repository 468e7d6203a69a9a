"""ImageNet-Segmentation (Guillaumin et al.; ``gtsegs_ijcv.mat``, 4,276 images) as a LightningDataModule.

File layout (MATLAB v7.3 = HDF5; PROTOCOLS.md section 3), read with h5py:

* ``/value/img[i, 0]``: object reference to a uint8 array ``(3, W, H)`` -> transposed ``(2, 1, 0)`` to ``(H, W, 3)``;
* ``/value/gt[i, 0]``: reference to a MATLAB *cell* (an array of references) whose ``[0, 0]`` element references
  the uint8 mask ``(W, H)`` in {0, 1} -> transposed to ``(H, W)``;
* ``/value/target[i, 0]`` and ``/value/id[i, 0]``: references to uint16 character arrays (the wnid, e.g.
  ``n01440764``, and the image id).

Preprocessing as the reference: image ``Resize((224, 224))`` (bilinear) + ``ToTensor`` (in [0, 1], NOT
normalised; the module normalises with the model's mean/std, 0.5/0.5 for the reference ViT); mask
``Resize((224, 224), NEAREST)``. Batches: ``{"image": FloatTensor[B, 3, H, W], "mask": FloatTensor[B, H, W] in
{0, 1}, "label": LongTensor[B] (standard 1000-class index of the wnid), "index": LongTensor[B]}``.
The HDF5 file is opened lazily in each process / dataloader worker.
"""
from __future__ import annotations

import os
from typing import Dict, Optional

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from .imagenet_common import standard_class_index

LAYOUT = ("HDF5 (MATLAB v7.3) with /value/img, /value/gt, /value/target, /value/id: [N, 1] object references "
          "(img -> uint8 (3, W, H); gt -> cell whose [0, 0] references uint8 (W, H); target/id -> uint16 chars)")
KEYS = ("img", "gt", "target")


def _chars(array: np.ndarray) -> str:
    """A MATLAB char array (uint16 codes, any shape) as a Python string."""
    return "".join(chr(int(c)) for c in np.asarray(array).flatten(order="F") if int(c) != 0)


class ImageNetSegmentationDataset(Dataset):
    def __init__(self, path: str, image_size: int = 224) -> None:
        self.path = os.path.expanduser(path)
        self.image_size = int(image_size)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"ImageNet-Segmentation file {self.path!r} does not exist (gtsegs_ijcv.mat; "
                                    f"expected {LAYOUT})")
        import h5py

        try:
            with h5py.File(self.path, "r") as f:
                group = f.get("value")
                missing = [k for k in KEYS if group is None or k not in group]
                if missing:
                    raise ValueError(f"{self.path!r} lacks /value/{', /value/'.join(missing)}; expected {LAYOUT}")
                self.size = int(group["img"].shape[0])
                if any(int(group[k].shape[0]) != self.size for k in KEYS):
                    raise ValueError(f"{self.path!r}: /value/img, /value/gt and /value/target have different lengths")
        except OSError as err:
            raise ValueError(f"{self.path!r} is not an HDF5 / MATLAB v7.3 file ({err}); expected {LAYOUT}") from err
        self._file = None
        self._class_index = standard_class_index()

    def __len__(self) -> int:
        return self.size

    def __getstate__(self):  # h5py handles do not pickle (dataloader workers reopen the file)
        state = dict(self.__dict__)
        state["_file"] = None
        return state

    def _handle(self):
        if self._file is None:
            import h5py

            self._file = h5py.File(self.path, "r")
        return self._file

    def raw(self, index: int):
        """``(image uint8 [H, W, 3], mask uint8 [H, W], wnid, image id)`` of sample ``index``."""
        f = self._handle()
        value = f["value"]
        try:
            image = np.array(f[value["img"][index, 0]]).transpose(2, 1, 0)
            cell = f[value["gt"][index, 0]]
            mask = np.array(f[cell[0, 0]]).transpose(1, 0)
            wnid = _chars(f[value["target"][index, 0]])
            image_id = _chars(f[value["id"][index, 0]]) if "id" in value else str(index)
        except Exception as err:
            raise ValueError(f"{self.path!r}: sample {index} does not follow the layout {LAYOUT}: {err}") from err
        if image.ndim != 3 or image.shape[2] != 3 or mask.shape != image.shape[:2]:
            raise ValueError(f"{self.path!r}: sample {index} has image {image.shape} and mask {mask.shape}; "
                             f"expected (H, W, 3) and (H, W) after transposing ({LAYOUT})")
        return image, mask, wnid, image_id

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        from PIL import Image
        from torchvision import transforms as T
        from torchvision.transforms import InterpolationMode

        if not 0 <= index < self.size:
            raise IndexError(f"index {index} out of range for {self.size} samples")
        image, mask, wnid, _ = self.raw(index)
        if wnid not in self._class_index:
            raise ValueError(f"{self.path!r}: sample {index} has target {wnid!r}, not an ImageNet-1k wnid")
        size = (self.image_size, self.image_size)
        img = T.ToTensor()(T.Resize(size)(Image.fromarray(np.ascontiguousarray(image.astype(np.uint8)))))
        mask_image = Image.fromarray(np.ascontiguousarray(mask.astype(np.uint8)))
        gt = T.Resize(size, interpolation=InterpolationMode.NEAREST)(mask_image)
        gt = torch.from_numpy((np.array(gt) > 0).astype(np.float32))
        return {"image": img, "mask": gt, "label": torch.tensor(self._class_index[wnid], dtype=torch.long),
                "index": torch.tensor(index, dtype=torch.long)}


class ImageNetSegmentationDataModule(pl.LightningDataModule):
    """The whole ``gtsegs_ijcv.mat`` as the test split (see the module docstring)."""

    def __init__(self, path: str, image_size: int = 224, batch_size: int = 8, num_workers: int = 0,
                 limit: Optional[int] = None) -> None:
        super().__init__()
        if batch_size < 1 or num_workers < 0 or (limit is not None and limit < 1):
            raise ValueError("batch_size >= 1, num_workers >= 0 and limit >= 1 needed, "
                             f"got {batch_size}, {num_workers}, {limit}")
        self.save_hyperparameters()
        self.path = os.path.expanduser(path)
        self.image_size, self.batch_size, self.num_workers, self.limit = image_size, batch_size, num_workers, limit
        self._dataset = None

    def dataset(self):
        if self._dataset is None:
            data = ImageNetSegmentationDataset(self.path, self.image_size)
            if self.limit is not None and self.limit < len(data):
                data = torch.utils.data.Subset(data, range(self.limit))  # the first ``limit`` images
            self._dataset = data
        return self._dataset

    def setup(self, stage: Optional[str] = None) -> None:
        self.dataset()

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.dataset(), batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0, drop_last=False)

    predict_dataloader = test_dataloader
