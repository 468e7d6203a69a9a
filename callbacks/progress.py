"""Resumable evaluation: progress checkpoints in the run folder, and what ``evaluate.py --resume`` reads back.

Layout of a run folder while its run is unfinished::

    <run folder>/progress/config.yaml   the resolved config of the run (global rank 0 writes it before any batch)
    <run folder>/progress/rank<r>.pt    process r's checkpoint (one file per process, each written by its process)

A rank file is written **atomically** (``torch.save`` to ``.rank<r>.pt.tmp`` in the same folder, flushed to disk,
then ``os.replace``): a process killed at any moment leaves the previous checkpoint or the new one, never a mix.
It is a dict of tensors and plain values (read with ``torch.load(weights_only=True)``: opening it runs no code)::

    {"format": FORMAT, "version": VERSION,
     "rank": r, "world_size": N,            # this process and the run's number of processes
     "num_samples": n,                      # samples of the test dataset (all processes)
     "batches": k,                          # batches this process finished (over every session of the run)
     "done": LongTensor,                    # the batch["index"] of every sample this process finished
     "config_sha256": str,                  # of progress/config.yaml: the checkpoint belongs to that config
     "callbacks": [{"class": "<module>.<class>", "state": {...}}, ...]}

``callbacks`` holds, in the order of ``trainer.callbacks``, every :class:`~callbacks.base.EvaluationCallback`
(its :meth:`~callbacks.base.EvaluationCallback.progress_state`: the states of its torchmetrics metrics, the
arguments its metrics were built with, its ``extra_progress_state()``) and every other callback that defines
``extra_progress_state()`` / ``load_extra_progress_state(state)`` (``{"extra": ...}``). The metric states of a
process and its ``done`` list always describe the same samples: both are taken after the callbacks' updates of
the same batch (:class:`ProgressCheckpoint` must come after every such callback in ``trainer.callbacks``).

When: after every ``every``-th batch of a process and after its last batch. A run that ends normally removes the
files it wrote in ``progress/`` (its results are in ``metrics.json``), and the folder when nothing else is left in
it; a killed run leaves them, and ``--resume`` continues:
each process restores its own checkpoint and evaluates only its samples not yet done
(:class:`datamodules.unrepeated.UnrepeatedTestData` with :meth:`RunProgress.split`). A process without a rank file
(killed before its first checkpoint) starts its share from the beginning. The processes write independently (no
collective): each file is consistent on its own, which is all a resume needs, since the metric states are sums
reduced across processes only at the end. What a new run and a resume refuse: :func:`check_fresh_run_dir`,
:func:`resume_config`, :meth:`RunProgress.load` (nothing is changed on disk), :meth:`RunProgress.check_world_size`.

Samples are named by ``batch["index"]``, which must be the sample's position in the test dataset (every
datamodule of this project does so); a process that sees an index outside its share or twice stops with an error
naming it.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import pytorch_lightning as pl
import torch

from datamodules.unrepeated import ResumeSplit

from .base import EvaluationCallback

PROGRESS_DIR = "progress"
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.json"
FORMAT = "token_attributions.evaluate_progress"
VERSION = 1
#: ``--progress_every`` when not given: batches of one process between two checkpoints
DEFAULT_EVERY = 10

PathLike = Union[str, os.PathLike]


class ProgressError(RuntimeError):
    """A run folder's progress cannot be used (missing, unreadable, or of another run); the message says why and
    what to do."""


def progress_dir(run_dir: PathLike) -> Path:
    return Path(os.path.expanduser(str(run_dir))) / PROGRESS_DIR


def rank_file(run_dir: PathLike, rank: int) -> Path:
    return progress_dir(run_dir) / f"rank{int(rank)}.pt"


#: the names of the files a run writes in ``progress/`` (temporary files included); nothing else there is removed
OWN_FILE = re.compile(r"rank\d+\.pt|config\.yaml|\.(rank\d+\.pt|config\.yaml)\.tmp")


def rank_files(run_dir: PathLike) -> Dict[int, Path]:
    """``{rank: path}`` of the rank files in the run folder (temporary files aside)."""
    folder = progress_dir(run_dir)
    found = {}
    if folder.is_dir():
        for path in folder.glob("rank*.pt"):
            number = path.stem[len("rank"):]
            if number.isdigit():
                found[int(number)] = path
    return dict(sorted(found.items()))


def sha256_file(path: PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_atomic(obj: Any, path: PathLike) -> Path:
    """``obj`` (UTF-8 text for a ``str``, else ``torch.save(obj)``) to ``path`` through a temporary file in the same
    folder, flushed to disk, and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        if isinstance(obj, str):
            f.write(obj.encode("utf-8"))
        else:
            torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_rank_file(path: PathLike) -> Dict[str, Any]:
    """A rank file's content (module docstring), or a :class:`ProgressError` naming the file and what to do."""
    path = Path(path)
    what_to_do = (f"it is only ever replaced whole, so it was damaged after it was written. Move it away to redo "
                  f"that process's samples from the start (the other processes' progress is kept), or start a new "
                  f"run; nothing in {str(path.parent)!r} was changed")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zip, garbage, or objects other than tensors and plain values
        raise ProgressError(f"progress file {str(path)!r} cannot be read ({type(err).__name__}: "
                            f"{str(err).splitlines()[0] if str(err) else 'no detail'}); {what_to_do}") from err
    required = ("rank", "world_size", "num_samples", "batches", "done", "config_sha256", "callbacks")
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ProgressError(f"{str(path)!r} is not a progress file of evaluate.py (format {FORMAT!r}); {what_to_do}")
    if state.get("version") != VERSION:
        raise ProgressError(f"progress file {str(path)!r} has version {state.get('version')!r}; this evaluate.py "
                            f"reads version {VERSION}: resume it with the code that wrote it, or start a new run")
    missing = [key for key in required if key not in state]
    if missing or not isinstance(state["done"], torch.Tensor):
        raise ProgressError(f"progress file {str(path)!r} lacks {missing or ['done (a tensor)']}; {what_to_do}")
    return state


@dataclass
class RunProgress:
    """The progress of an unfinished run, as its folder holds it (:meth:`load`).

    ``ranks``: the content of every rank file by rank (processes without one start from the beginning);
    ``config``: ``progress/config.yaml``, the config the checkpoints belong to.
    """

    run_dir: Path
    config: Path
    ranks: Dict[int, Dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, run_dir: PathLike) -> "RunProgress":
        """Read and check every rank file of ``run_dir`` (:class:`ProgressError` when a file cannot be used)."""
        run_dir = Path(os.path.expanduser(str(run_dir)))
        config = resume_config(run_dir)
        digest = sha256_file(config)
        ranks = {rank: read_rank_file(path) for rank, path in rank_files(run_dir).items()}
        for rank, state in ranks.items():
            path = rank_file(run_dir, rank)
            if int(state["rank"]) != rank:
                raise ProgressError(f"progress file {str(path)!r} holds the progress of process {state['rank']}, "
                                    f"not {rank}: put it back under its own name")
            if state["config_sha256"] != digest:
                raise ProgressError(f"progress file {str(path)!r} was written for another config than "
                                    f"{str(config)!r} (changed since?): restore that config, or start a new run")
        for key in ("world_size", "num_samples"):
            values = {rank: int(state[key]) for rank, state in ranks.items()}
            if len(set(values.values())) > 1:
                raise ProgressError(f"the progress files of {str(progress_dir(run_dir))!r} disagree on {key} "
                                    f"({values}): they are of different runs")
        progress = cls(run_dir, config, ranks)
        stray = [rank for rank in ranks if rank >= int(progress.world_size or 0)]
        if stray:
            raise ProgressError(f"{str(progress_dir(run_dir))!r} holds files of processes {stray} but the run had "
                                f"{progress.world_size} processes: they are of another run")
        return progress

    @property
    def world_size(self) -> Optional[int]:
        """The run's number of processes (``None`` when no process saved progress)."""
        return int(next(iter(self.ranks.values()))["world_size"]) if self.ranks else None

    @property
    def num_samples(self) -> Optional[int]:
        return int(next(iter(self.ranks.values()))["num_samples"]) if self.ranks else None

    def done(self, rank: int) -> List[int]:
        state = self.ranks.get(rank)
        return [] if state is None else [int(i) for i in state["done"].tolist()]

    @property
    def num_done(self) -> int:
        return sum(int(state["done"].numel()) for state in self.ranks.values())

    def split(self) -> Optional[ResumeSplit]:
        """What the test dataloader skips (``None``: nothing was done, the run starts from the beginning)."""
        if not self.ranks:
            return None
        return ResumeSplit(self.world_size, self.num_samples, {rank: self.done(rank) for rank in self.ranks})

    def check_world_size(self, world_size: int) -> None:
        """Refuse to resume on another number of processes than the run's (its split of the samples)."""
        if self.world_size is not None and int(world_size) != self.world_size:
            raise ProgressError(f"the run in {str(self.run_dir)!r} was evaluated by {self.world_size} processes; "
                                f"resume it with the same number (--trainer.devices {self.world_size}, "
                                f"--trainer.num_nodes as before), not {world_size}")


def resume_config(run_dir: PathLike) -> Path:
    """``<run_dir>/progress/config.yaml``, or a :class:`ProgressError` saying why the folder cannot be resumed."""
    run_dir = Path(os.path.expanduser(str(run_dir)))
    config = progress_dir(run_dir) / CONFIG_FILE
    if config.is_file():
        return config
    if not run_dir.is_dir():
        raise ProgressError(f"run folder {str(run_dir)!r} does not exist: give the folder of the run to resume "
                            f"(its --output_dir)")
    if (run_dir / METRICS_FILE).is_file():
        raise ProgressError(f"the run in {str(run_dir)!r} has finished ({METRICS_FILE} is written and its progress "
                            f"removed): there is nothing to resume")
    raise ProgressError(f"{str(run_dir)!r} is not a resumable evaluate.py run folder: it has no "
                        f"{PROGRESS_DIR}/{CONFIG_FILE} (written at the start of runs with --progress_every > 0)")


def check_fresh_run_dir(run_dir: PathLike, overwrite: bool = False) -> None:
    """Refuse to start a new run in a folder that holds an earlier run's results (``metrics.json``), the progress
    of an unfinished run, or files in ``progress/`` that no run wrote: they would be lost. With ``overwrite``
    (``--overwrite``) the earlier run's progress files are removed now and its results replaced at the end; files
    that no run wrote are kept."""
    run_dir = Path(os.path.expanduser(str(run_dir)))
    folder = progress_dir(run_dir)
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if (rank_files(run_dir) or CONFIG_FILE in names) and not overwrite:
        raise ProgressError(f"{str(run_dir)!r} holds the progress of an unfinished run ({str(folder)!r}): continue "
                            f"it with --resume {run_dir}, give another --output_dir, or --overwrite true to drop it")
    if (run_dir / METRICS_FILE).exists() and not overwrite:
        raise ProgressError(f"{str(run_dir)!r} holds the results of an earlier run ({str(run_dir / METRICS_FILE)!r}):"
                            f" give another --output_dir, or pass --overwrite true to replace them")
    foreign = [name for name in names if not OWN_FILE.fullmatch(name)]
    if foreign and not overwrite:
        raise ProgressError(f"{str(folder)!r} holds files that no evaluate.py run wrote ({', '.join(foreign[:5])}): "
                            f"give another --output_dir, move them away, or pass --overwrite true (they are kept)")
    if overwrite:
        remove_progress(run_dir)


def carries_progress(callback: Any) -> bool:
    """Whether a progress checkpoint keeps ``callback``'s state (module docstring)."""
    return isinstance(callback, EvaluationCallback) or (
        callable(getattr(callback, "extra_progress_state", None))
        and callable(getattr(callback, "load_extra_progress_state", None)))


def _class_name(callback: Any) -> str:
    return f"{type(callback).__module__}.{type(callback).__qualname__}"


class ProgressCheckpoint(pl.Callback):
    """Writes this process's progress every ``every`` batches and after its last batch; restores it on resume.

    Args:
        run_dir: the run folder (global rank 0's choice is broadcast to every process at setup).
        every: batches of this process between two checkpoints (0: none; a resumed run still restores).
        config_text: the run's resolved config, written to ``progress/config.yaml`` by a new run.
        resumed: the progress a resumed run continues (:meth:`RunProgress.load`), ``None`` for a new run.
    """

    def __init__(self, run_dir: PathLike, every: int = DEFAULT_EVERY, config_text: Optional[str] = None,
                 resumed: Optional[RunProgress] = None) -> None:
        super().__init__()
        if every < 0:
            raise ValueError(f"progress_every must be >= 0 batches (0: no checkpoints), got {every}")
        if resumed is None and not config_text:
            raise ValueError("a new run's progress needs its resolved config (config_text)")
        self.run_dir = Path(os.path.expanduser(str(run_dir)))
        self.every = int(every)
        self.config_text = config_text
        self.resumed = resumed
        self._done: List[int] = []
        self._done_set: set = set()
        self._batches = 0
        self._since_save = 0
        self._num_samples = 0
        self._config_sha256 = ""

    # -------------------------------------------------------------------------------- set-up
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.run_dir = Path(trainer.strategy.broadcast(str(self.run_dir), src=0))
        callbacks = list(trainer.callbacks)
        mine = callbacks.index(self)
        late = [type(cb).__name__ for cb in callbacks[mine + 1:] if carries_progress(cb)]
        if late:
            raise RuntimeError(f"ProgressCheckpoint must come after every callback whose state it keeps; "
                               f"{late} come after it in trainer.callbacks")
        config = progress_dir(self.run_dir) / CONFIG_FILE
        if self.resumed is None and trainer.is_global_zero:
            write_atomic(self.config_text, config)
        trainer.strategy.barrier("progress_config")
        self._config_sha256 = sha256_file(config)
        if self.resumed is not None and trainer.is_global_zero:
            r = self.resumed
            if r.ranks:
                print(f"resuming {self.run_dir}: {r.num_done} of {r.num_samples} samples done "
                      f"({len(r.ranks)} of {r.world_size} processes saved progress)", flush=True)
            else:
                print(f"resuming {self.run_dir}: no progress was saved, starting from the first sample", flush=True)

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # runs after every other callback's on_test_start (their reset), so what it restores stays
        self._num_samples = self._test_dataset_size(trainer)
        self._done, self._done_set, self._batches, self._since_save = [], set(), 0, 0
        state = None if self.resumed is None else self.resumed.ranks.get(trainer.global_rank)
        if state is None:
            return
        if int(state["num_samples"]) != self._num_samples:
            raise ProgressError(f"{str(rank_file(self.run_dir, trainer.global_rank))!r}: the run had "
                                f"{state['num_samples']} test samples, the data now has {self._num_samples}")
        keepers = [cb for cb in trainer.callbacks if carries_progress(cb)]
        saved = list(state["callbacks"])
        names, saved_names = [_class_name(cb) for cb in keepers], [entry["class"] for entry in saved]
        if names != saved_names:
            raise ProgressError(f"{str(rank_file(self.run_dir, trainer.global_rank))!r} holds the state of the "
                                f"callbacks {saved_names}; this run has {names}")
        for callback, entry in zip(keepers, saved):
            if isinstance(callback, EvaluationCallback):
                callback.build_from_progress(entry["state"], pl_module.device)
            else:
                callback.load_extra_progress_state(dict(entry["state"].get("extra") or {}))
        self._done = [int(i) for i in state["done"].tolist()]
        self._done_set = set(self._done)
        self._batches = int(state["batches"])

    @staticmethod
    def _test_dataset_size(trainer: pl.Trainer) -> int:
        loaders = trainer.test_dataloaders
        if isinstance(loaders, (list, tuple)):
            if len(loaders) != 1:
                raise ValueError(f"progress checkpoints support one test dataloader, the run has {len(loaders)}")
            loaders = loaders[0]
        dataset = getattr(loaders, "dataset", None)
        try:
            return len(dataset)
        except TypeError:
            raise ValueError("progress checkpoints need a test dataset with a length (a map-style dataset whose "
                             "samples batch['index'] names); use --progress_every 0 for this data") from None

    # -------------------------------------------------------------------------------- batches
    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if "index" not in batch:
            raise KeyError("progress checkpoints name the finished samples by batch['index'] (their position in "
                           "the test dataset), but the batch has no 'index'; use --progress_every 0 for this data")
        rank, world = trainer.global_rank, trainer.world_size
        indices = [int(i) for i in torch.as_tensor(batch["index"]).flatten().tolist()]
        for i in indices:
            if not 0 <= i < self._num_samples or i % world != rank:
                raise ValueError(f"process {rank} of {world} got a sample with batch['index'] {i}, which is not in "
                                 f"its share ({rank}, {rank} + {world}, ... < {self._num_samples}): batch['index'] "
                                 f"must be each sample's position in the test dataset")
            if i in self._done_set:
                raise ValueError(f"sample {i} (batch['index']) was evaluated twice by process {rank}: batch['index'] "
                                 f"must be each sample's position in the test dataset, each given once")
            self._done_set.add(i)
        self._done.extend(indices)
        self._batches += 1
        self._since_save += 1
        last = batch_idx + 1 >= trainer.num_test_batches[dataloader_idx]
        if self.every and (self._since_save >= self.every or last):
            self.save(trainer)

    def save(self, trainer: pl.Trainer) -> Path:
        """Write this process's checkpoint (module docstring)."""
        keepers = [cb for cb in trainer.callbacks if carries_progress(cb)]
        entries = [{"class": _class_name(cb),
                    "state": cb.progress_state() if isinstance(cb, EvaluationCallback)
                    else {"extra": cb.extra_progress_state()}} for cb in keepers]
        state = {"format": FORMAT, "version": VERSION, "rank": trainer.global_rank,
                 "world_size": trainer.world_size, "num_samples": self._num_samples, "batches": self._batches,
                 "done": torch.tensor(self._done, dtype=torch.long), "config_sha256": self._config_sha256,
                 "callbacks": entries}
        self._since_save = 0
        return write_atomic(state, rank_file(self.run_dir, trainer.global_rank))

    # -------------------------------------------------------------------------------- end
    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # every process is past its last batch (the metrics' reduction is a collective): the run is complete and
        # its results written (the reporter comes before this callback)
        if trainer.is_global_zero:
            remove_progress(self.run_dir)


def remove_progress(run_dir: PathLike) -> None:
    """Remove a run's progress files (:data:`OWN_FILE`, no other file): the rank files first, the config last, so
    that a kill in between leaves a folder that still resumes correctly (a process without a rank file redoes its
    share from the start); then the ``progress`` folder if nothing else is left in it."""
    folder = progress_dir(run_dir)
    if not folder.is_dir():
        return
    names = sorted((p.name for p in folder.iterdir() if OWN_FILE.fullmatch(p.name)), key=lambda n: CONFIG_FILE in n)
    for name in names:
        (folder / name).unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:  # not empty: files that the run did not write
        pass
