"""Evaluation data for N processes without padding: every sample is evaluated exactly once.

Lightning's default distributed sampler for ``trainer.test`` is a padded ``DistributedSampler``: with 5 samples
on 2 processes one sample is evaluated twice and counted twice by the metrics. :class:`UnrepeatedTestData`
wraps any LightningDataModule and, when the trainer runs on more than one process, rebuilds its test dataloader
with Lightning's ``UnrepeatedDistributedSampler`` (rank ``r`` gets samples ``r, r + N, r + 2N, ...``; the
processes may run a different number of batches). Lightning leaves a ``DistributedSampler`` that the loader
already carries alone, so nothing is padded. Each process needs at least one sample (the metrics' ``compute``
is a collective that every rank must reach).
"""
from __future__ import annotations

from typing import Optional

import pytorch_lightning as pl
from pytorch_lightning.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader


def unrepeated_loader(loader: DataLoader, num_replicas: int, rank: int) -> DataLoader:
    """``loader`` rebuilt with an ``UnrepeatedDistributedSampler`` (same dataset, batch size, collate, workers)."""
    dataset = loader.dataset
    if len(dataset) < num_replicas:
        raise ValueError(f"{len(dataset)} test samples cannot be split over {num_replicas} processes without "
                         "padding: use at least as many samples as processes")
    sampler = UnrepeatedDistributedSampler(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
    return DataLoader(
        dataset, batch_size=loader.batch_size, sampler=sampler, num_workers=loader.num_workers,
        collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, drop_last=False,
        persistent_workers=loader.num_workers > 0 and getattr(loader, "persistent_workers", False),
        worker_init_fn=loader.worker_init_fn,
    )


class UnrepeatedTestData(pl.LightningDataModule):
    """Wraps ``datamodule``; its ``test_dataloader`` splits the data over processes without repetition."""

    def __init__(self, datamodule: pl.LightningDataModule) -> None:
        super().__init__()
        self.inner = datamodule

    def prepare_data(self) -> None:
        self.inner.prepare_data()

    def setup(self, stage: Optional[str] = None) -> None:
        self.inner.trainer = self.trainer
        self.inner.setup(stage)

    def teardown(self, stage: Optional[str] = None) -> None:
        self.inner.teardown(stage)

    def test_dataloader(self) -> DataLoader:
        loader = self.inner.test_dataloader()
        trainer = self.trainer
        if trainer is None or trainer.world_size <= 1:
            return loader
        return unrepeated_loader(loader, trainer.world_size, trainer.global_rank)

    def __getattr__(self, name: str):
        # plain attributes of the wrapped datamodule (e.g. ``classes``) stay reachable
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
