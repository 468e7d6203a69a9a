"""Evaluation data for N processes without padding: every sample is evaluated exactly once, also across a resume.

Lightning's default distributed sampler for ``trainer.test`` is a padded ``DistributedSampler``: with 5 samples
on 2 processes one sample is evaluated twice and counted twice by the metrics. :class:`UnrepeatedTestData`
wraps any LightningDataModule and, when the trainer runs on more than one process, rebuilds its test dataloader
with a :class:`RemainingSampler`: rank ``r`` of ``N`` gets samples ``r, r + N, r + 2N, ...`` (:func:`rank_share`,
the split of Lightning's ``UnrepeatedDistributedSampler`` without shuffling; the processes may run a different
number of batches). Lightning leaves a ``DistributedSampler`` that the loader already carries alone, so nothing is
padded. In a new run each process needs at least one sample.

Resumed runs (``evaluate.py --resume``, :mod:`callbacks.progress`): given a :class:`ResumeSplit` (the original
run's number of processes and samples, and the samples each process finished), every process keeps the same
share as in the original run and skips its finished samples, so the batches that remain are those the original
run would have run next. The number of processes must be the original one (the saved metric states are per
process). A process with nothing left still reports one batch, and yields none: Lightning skips the whole test
loop, epoch-end hooks included, of a process whose loader has length 0, and the metrics' reduction at the epoch
end is a collective that every process must reach.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Dict, Iterator, List, Optional, Sequence

import pytorch_lightning as pl
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def rank_share(num_samples: int, num_replicas: int, rank: int) -> range:
    """The dataset positions of process ``rank`` of ``num_replicas``: ``rank, rank + N, ... < num_samples``."""
    if not 0 <= rank < num_replicas:
        raise ValueError(f"rank {rank} is not one of {num_replicas} processes")
    return range(rank, num_samples, num_replicas)


@dataclass(frozen=True)
class ResumeSplit:
    """What a resumed run skips: the original run's ``world_size`` and ``num_samples``, and ``done``, the dataset
    positions (``batch["index"]``) each process finished, by rank (a rank not listed finished none)."""

    world_size: int
    num_samples: int
    done: Dict[int, Sequence[int]] = field(default_factory=dict)


class RemainingSampler(DistributedSampler):
    """Process ``rank``'s share of the dataset (:func:`rank_share`) in order, without the ``done`` positions.

    ``len`` is at least 1 even when nothing remains (module docstring); iterating then yields nothing.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, done: Collection[int] = ()) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)
        share = rank_share(len(dataset), num_replicas, rank)
        done = set(int(i) for i in done)
        stray = sorted(i for i in done if i not in share)
        if stray:
            raise ValueError(f"samples {stray[:5]} are recorded as done by process {rank} of {num_replicas}, but "
                             f"they are not in its share of the {len(dataset)} samples: the progress is of another "
                             "split of the data")
        self.indices: List[int] = [i for i in share if i not in done]
        self.num_samples = len(self.indices)
        self.total_size = len(dataset)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return max(1, len(self.indices))


def unrepeated_loader(loader: DataLoader, num_replicas: int, rank: int, done: Collection[int] = ()) -> DataLoader:
    """``loader`` rebuilt with a :class:`RemainingSampler` (same dataset, batch size, collate, workers)."""
    dataset = loader.dataset
    if len(dataset) < num_replicas:
        raise ValueError(f"{len(dataset)} test samples cannot be split over {num_replicas} processes without "
                         "padding: use at least as many samples as processes")
    sampler = RemainingSampler(dataset, num_replicas=num_replicas, rank=rank, done=done)
    return DataLoader(
        dataset, batch_size=loader.batch_size, sampler=sampler, num_workers=loader.num_workers,
        collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, drop_last=False,
        persistent_workers=loader.num_workers > 0 and getattr(loader, "persistent_workers", False),
        worker_init_fn=loader.worker_init_fn,
    )


class UnrepeatedTestData(pl.LightningDataModule):
    """Wraps ``datamodule``; its ``test_dataloader`` splits the data over processes without repetition and, given
    ``resume``, without the samples the original run finished (module docstring)."""

    def __init__(self, datamodule: pl.LightningDataModule, resume: Optional[ResumeSplit] = None) -> None:
        super().__init__()
        self.inner = datamodule
        self.resume = resume

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
        world, rank = (1, 0) if trainer is None else (trainer.world_size, trainer.global_rank)
        if self.resume is None:
            return loader if world <= 1 else unrepeated_loader(loader, world, rank)
        if world != self.resume.world_size:
            raise ValueError(f"the resumed run was evaluated by {self.resume.world_size} processes, this one has "
                             f"{world}: resume with the same number of processes (its split of the samples)")
        if len(loader.dataset) != self.resume.num_samples:
            raise ValueError(f"the resumed run had {self.resume.num_samples} test samples, the data now has "
                             f"{len(loader.dataset)}: resume with the same data")
        return unrepeated_loader(loader, world, rank, self.resume.done.get(rank, ()))

    def __getattr__(self, name: str):
        # plain attributes of the wrapped datamodule (e.g. ``classes``) stay reachable
        if name in ("inner", "resume"):
            raise AttributeError(name)
        return getattr(self.inner, name)
