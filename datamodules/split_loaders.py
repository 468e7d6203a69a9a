"""The four dataloaders of a datamodule that keeps one dataset per split.

A datamodule mixes :class:`SplitDataLoaders` in before ``pl.LightningDataModule``, provides ``dataset(split)``,
``batch_size`` and ``num_workers``, and says which split each stage reads (:meth:`SplitDataLoaders.split_for`)
and how a batch is collated (:meth:`SplitDataLoaders.collate_fn`). Training shuffles; the other stages keep the
dataset order, and no stage drops a last, smaller batch. ``setup(stage)`` builds the datasets the stage reads.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

from torch.utils.data import DataLoader

#: the loaders each Lightning stage reads
STAGE_LOADERS = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("predict",)}


class SplitDataLoaders:
    """``train/val/test/predict_dataloader`` over ``self.dataset(split)``."""

    #: the split each stage reads (``predict`` reads the test split)
    stage_splits: Dict[str, str] = {"train": "train", "val": "val", "test": "test", "predict": "test"}

    def split_for(self, stage: str) -> str:
        """The split stage ``stage`` (``train``, ``val``, ``test``, ``predict``) reads."""
        return self.stage_splits[stage]

    def has_split(self, split: str) -> bool:
        """Whether ``split`` can be loaded (``setup()`` without a stage loads the splits that can)."""
        return True

    def setup(self, stage: Optional[str] = None) -> None:
        for split in dict.fromkeys(map(self.split_for, STAGE_LOADERS.get(stage, self.stage_splits))):
            if stage in STAGE_LOADERS or self.has_split(split):
                self.dataset(split)

    def collate_fn(self) -> Optional[Callable]:
        """The collate function of every loader (``None``: PyTorch's default)."""
        return None

    def _loader(self, stage: str) -> DataLoader:
        return DataLoader(self.dataset(self.split_for(stage)), batch_size=self.batch_size, shuffle=stage == "train",
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0, drop_last=False,
                          collate_fn=self.collate_fn())

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("predict")
