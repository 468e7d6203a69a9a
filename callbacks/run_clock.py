"""Where a long evaluation is, and what its time went to: :class:`RunClock`.

* **Progress lines.** When stdout is not a terminal (a job scheduler, a pipe, CI: no progress bar is drawn), a line
  ``[progress] 12/64 samples (18.8%) | 3m10s elapsed, about 13m40s left | now: PerturbationTest`` every
  ``interval_s`` seconds (default 180), from a background thread, so a batch that takes longer than the interval
  still reports: the samples done by this process (of its share of the test set), the step it is in (``explaining:
  <method>`` while the module computes a method's maps, else the test callback whose batch hook runs) and the time
  left, extrapolated from the mean time per sample so far (none before the first batch ends). Rank zero prints.
* **Model passes.** Every forward pass of the evaluated model (the module's ``model``: the methods' passes, the
  classifier's clean and perturbed passes) is counted with the rows it carried and the seconds it took (backward
  passes are not model calls and are not counted). At the end ``metrics.meta.json`` gets ``run``:
  ``{"model_passes", "model_pass_rows", "model_pass_seconds", "wall_seconds", "model_pass_share"}`` (the share of
  the wall time between test start and end spent inside forward passes; the rest is the methods' backward passes,
  the protocol's bookkeeping and the data), and the same is printed.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import pytorch_lightning as pl
import torch

from callbacks.reporter import ResultsReporter

DEFAULT_INTERVAL_S = 180.0
#: the run facts' key in ``metrics.meta.json``
RUN_KEY = "run"


def format_seconds(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _rows(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() else 1
    if isinstance(value, dict):
        return next((_rows(v) for v in value.values() if isinstance(v, torch.Tensor)), 0)
    if isinstance(value, (list, tuple)) and value:
        return _rows(value[0])
    return 0


class RunClock(pl.Callback):
    """Progress lines when stdout is not a terminal, and the run's model passes (module docstring).

    Args:
        interval_s: seconds between progress lines.
        lines: ``None`` (default): print them when stdout is not a terminal; ``True`` / ``False``: always / never.
        stream: where the lines go (default ``sys.stdout``).
    """

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, lines: Optional[bool] = None,
                 stream: Any = None) -> None:
        super().__init__()
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {interval_s}")
        self.interval_s = float(interval_s)
        self.lines = lines
        self.stream = stream
        self.facts: Dict[str, Any] = {}
        self._reset()

    def _reset(self) -> None:
        self._start = self._first_batch = None
        self._total = self._done = 0
        self._passes = self._rows = 0
        self._pass_seconds = 0.0
        self._depth = 0
        self._entered: List[float] = []
        self._step = "starting"
        self._module: Optional[pl.LightningModule] = None
        self._handles: List[Any] = []
        self._wrapped: List[Any] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -------------------------------------------------------------------------------- hooks
    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()
        self.facts = {}
        self._start = time.perf_counter()
        self._module = pl_module
        self._total = self._share(trainer)
        model = getattr(pl_module, "model", None)
        if isinstance(model, torch.nn.Module):
            clock = self   # plain functions as hooks: a deep copy of the model (the sanity checks' randomised
            # copies) copies a function by reference, where a bound method would drag the clock's lock along

            def enter(module, args, kwargs) -> None:
                clock._enter(module, args, kwargs)

            def leave(module, args, output) -> None:
                clock._leave(module, args, output)

            self._handles = [model.register_forward_pre_hook(enter, with_kwargs=True),
                             model.register_forward_hook(leave, always_call=True)]
        for callback in trainer.callbacks:
            if callback is not self and type(callback).on_test_batch_end is not pl.Callback.on_test_batch_end:
                self._wrap(callback)
        show = self.lines if self.lines is not None else not _is_terminal(self._out)
        if show and trainer.is_global_zero:
            self._thread = threading.Thread(target=self._report, name="run-clock", daemon=True)
            self._thread.start()

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._step = "explaining"

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._done += _rows(batch.get("label") if isinstance(batch, dict) else batch)
        if self._first_batch is None:
            self._first_batch = time.perf_counter()

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for handle in self._handles:
            handle.remove()
        for callback, original in self._wrapped:
            callback.on_test_batch_end = original
        wall = time.perf_counter() - (self._start or time.perf_counter())
        self.facts = {"model_passes": self._passes, "model_pass_rows": self._rows,
                      "model_pass_seconds": round(self._pass_seconds, 3), "wall_seconds": round(wall, 3),
                      "model_pass_share": round(self._pass_seconds / wall, 4) if wall > 0 else None}
        for reporter in (cb for cb in trainer.callbacks if isinstance(cb, ResultsReporter)):
            reporter.run_facts = dict(self.facts)
        if trainer.is_global_zero:
            share = self.facts["model_pass_share"]
            print(f"[run] {self._done} samples in {format_seconds(wall)}: {self._passes} model passes "
                  f"({self._rows} rows) took {format_seconds(self._pass_seconds)}"
                  f"{'' if share is None else f' ({100 * share:.1f}% of the wall time)'}", file=self._out, flush=True)

    # -------------------------------------------------------------------------------- what it reads
    @property
    def _out(self):
        return self.stream if self.stream is not None else sys.stdout

    @staticmethod
    def _share(trainer: pl.Trainer) -> int:
        loaders = trainer.test_dataloaders
        loaders = loaders[0] if isinstance(loaders, (list, tuple)) and loaders else loaders
        try:
            size = len(getattr(loaders, "dataset", None))   # type: ignore[arg-type]
        except TypeError:
            return 0
        world, rank = max(1, trainer.world_size), trainer.global_rank
        return len(range(rank, size, world))

    def _enter(self, module, args, kwargs) -> None:
        if self._depth == 0:
            self._entered.append(time.perf_counter())
            self._passes += 1
            self._rows += _rows(args[0] if args else kwargs)
        self._depth += 1

    def _leave(self, module, args, output) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth == 0 and self._entered:
            self._pass_seconds += time.perf_counter() - self._entered.pop()

    def _wrap(self, callback: pl.Callback) -> None:
        original = callback.on_test_batch_end
        name = type(callback).__name__

        def timed(*args: Any, **kwargs: Any) -> Any:
            self._step = name
            return original(*args, **kwargs)

        self._wrapped.append((callback, original))
        callback.on_test_batch_end = timed   # type: ignore[method-assign]

    def step(self) -> str:
        """What the run is doing now (module docstring)."""
        method = getattr(self._module, "explaining", None) if self._step == "explaining" else None
        return f"explaining: {method}" if method else self._step

    def line(self) -> str:
        """The progress line of now (module docstring)."""
        now = time.perf_counter()
        elapsed = now - (self._start or now)
        total = self._total or None
        share = f"{self._done}/{total} samples ({100 * self._done / total:.1f}%)" if total else f"{self._done} samples"
        left = ""
        if total and self._done:
            left = f", about {format_seconds(elapsed / self._done * (total - self._done))} left"
        return f"[progress] {share} | {format_seconds(elapsed)} elapsed{left} | now: {self.step()}"

    def _report(self) -> None:
        while not self._stop.wait(self.interval_s):
            print(self.line(), file=self._out, flush=True)


def _is_terminal(stream: Any) -> bool:
    isatty: Optional[Callable[[], bool]] = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:   # a closed stream
        return False
