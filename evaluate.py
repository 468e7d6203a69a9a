"""Evaluate attribution methods on a classifier: perturbation and segmentation tests, logged and saved.

    python evaluate.py                                     # configs/evaluate/synthetic.yaml (the default)
    python evaluate.py --config configs/evaluate/imagenet_perturbation.yaml --data.init_args.root /data/imagenet
    python evaluate.py --model.methods '[rollout, gradcam]' --data.init_args.test_size 32
    python evaluate.py --trainer.devices 2 --trainer.strategy ddp --trainer.accelerator cpu

LightningCLI (``--config`` files, ``--key.sub value`` overrides); the run mode is ``trainer.test``. The model is
``lightning_modules.evaluation.AttributionEvaluationModule``, the data any LightningDataModule (batches
``{"image" in [0, 1], "label", "index", ["mask"], ...}``), the tests are ``EvaluationCallback``s in
``trainer.callbacks`` (``callbacks.perturbation.PerturbationTest``, ``callbacks.segmentation.SegmentationTest``,
``callbacks.cdam_analysis.CDAMAnalysis``, ...; ``callbacks.accuracy.CleanAccuracyTest`` is added when not listed).
The module explains the class settings the tests declare; every result leaves through one
``callbacks.reporter.ResultsReporter``, which ``main`` adds and whose results it returns.

On N processes every test sample is evaluated exactly once (``datamodules.unrepeated.UnrepeatedTestData``) and
the metrics are torchmetrics states reduced across processes, so ``metrics.json`` matches a 1-process run.

Outputs: every result goes to the logger (scalars; curves as a table; heatmap overlays as images; the resolved
config as hyperparameters) and to ``metrics.json`` in the run folder ``--output_dir`` (default
``<trainer.default_root_dir>/evaluate/<date-time>``), whose path is printed with a results table at the end;
beside it ``metrics.meta.json`` holds each result's declared direction and each curve's x values, and
``gallery.npz`` the maps of the samples with dataset index 0 to 3 (``callbacks.map_gallery.MapGallery``, added
when not listed; the sanity checks add their maps on the randomised models), which ``compare.py`` shows.
W&B is the default logger and runs offline unless ``WANDB_MODE=online`` (or the logger's init args) say
otherwise. The progress bar is shown in a terminal and hidden in CI (``CI`` set or stdout not a TTY); when stdout is
not a terminal a progress line (samples done, the current step, the time left) is printed every
``--progress_interval`` seconds (default 180; :mod:`callbacks.run_clock`), and the run's model passes and their
share of the wall time are printed and written under ``run`` in ``metrics.meta.json``.

Resumable runs (:mod:`callbacks.progress`, which describes the files and the checks): every process checkpoints
its progress to ``<run folder>/progress/`` every ``--progress_every`` batches (default 10; 0: off);
``python evaluate.py --resume <run folder>`` continues a killed run with the config saved there, so that
``metrics.json`` equals an uninterrupted run's. A new run refuses a folder that holds an earlier run unless
``--overwrite``. The command line of a resume may change only where results and logs go and how progress is shown
and saved (``cli.commands.RESUME_MAY_CHANGE``); a saved config that lets files run code needs
``--trust_run_config`` (README, "Trust model"). W&B: a resume logs to a new W&B run in the killed run's group,
tagged ``resumed``.
"""
from __future__ import annotations

import datetime
import os
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol, runtime_checkable

# OpenMP's threads sleep between parallel regions instead of spinning (unless the environment says otherwise), set
# before torch loads its OpenMP runtime: on cores shared with other jobs a spinning thread waits for its
# descheduled partner at every operation's barrier. Measured on 2 cores at load average 18 (benchmarks/README.md):
# one SmolLM2 forward of 8 x 64 tokens took 43 s wall / 10 s CPU with 2 spinning threads, 6 s / 1.5 s passive.
# The results are bit for bit the same (same threads, same partition of the work).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytorch_lightning as pl

import training  # noqa: F401  (registers the trained: and synthetic model sources, in DDP children too)
from callbacks.accuracy import CleanAccuracyTest
from callbacks.base import EvaluationCallback
from callbacks.map_gallery import MapGallery
from callbacks.progress import ProgressCheckpoint, ProgressError, RunProgress, check_fresh_run_dir
from callbacks.reporter import ResultsReporter
from callbacks.run_clock import DEFAULT_INTERVAL_S, RunClock
from cli import EvaluateCLI, check_data_paths
from datamodules.unrepeated import UnrepeatedTestData
from methods.cpu_memory import retain_freed_memory

# ResultsReporter logs values that torchmetrics already reduced across processes: Lightning's advice to
# add sync_dist=True (a second reduction) does not apply
warnings.filterwarnings("ignore", message=r".*when logging on epoch level in distributed setting.*")


def _output_dir(cli, trainer: pl.Trainer) -> Path:
    given = cli.config.get("output_dir")
    if given:
        return Path(os.path.expanduser(given))
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(trainer.default_root_dir) / "evaluate"
    out, n = base / stamp, 1
    while out.exists():
        out, n = base / f"{stamp}-{n}", n + 1
    return out


@runtime_checkable
class UsesModelDataConfig(Protocol):
    """A datamodule whose preprocessing follows the evaluated model (e.g. ImageNet with ``preprocessing='timm'``):
    it is given the model's timm data config before its data is set up."""

    def set_model_data_config(self, data_config: Dict[str, Any]) -> None: ...


def main(args: Optional[List[str]] = None) -> Optional[Dict[str, Any]]:
    retain_freed_memory()  # CPU: no fresh pages for every attention-sized tensor (methods/cpu_memory.py)
    cli = EvaluateCLI(args)  # config files + command line -> trainer, module, datamodule (cli.commands)
    trainer, module, datamodule = cli.trainer, cli.model, cli.datamodule
    check_data_paths(datamodule)
    if isinstance(datamodule, UsesModelDataConfig):  # model facts -> data
        datamodule.set_model_data_config(module.data_config())
    # the tests declare the class settings they need; the module explains their union
    module.add_class_settings(EvaluationCallback.declared_class_settings(trainer.callbacks))
    if not any(isinstance(callback, CleanAccuracyTest) for callback in trainer.callbacks):
        trainer.callbacks.append(CleanAccuracyTest())
    if not any(isinstance(callback, MapGallery) for callback in trainer.callbacks):
        trainer.callbacks.append(MapGallery())   # the maps of the first samples, in the run folder (gallery.npz)
    output_dir = _output_dir(cli, trainer)
    # progress lines when stdout is no terminal; the run's model passes, handed to the reporter
    trainer.callbacks.append(RunClock(float(cli.config.get("progress_interval") or DEFAULT_INTERVAL_S)))
    reporter = ResultsReporter(output_dir)  # every result leaves through it (rank 0 writes)
    trainer.callbacks.append(reporter)
    progress = _progress(cli, trainer, output_dir)
    if progress is not None:  # after every callback whose state it keeps
        trainer.callbacks.append(progress)
    if trainer.logger is not None:
        trainer.logger.log_hyperparams(cli.config.as_dict())  # rank-zero only inside the logger
    resumed = None if progress is None or progress.resumed is None else progress.resumed.split()
    trainer.test(module, datamodule=UnrepeatedTestData(datamodule, resume=resumed), verbose=False)
    return reporter.results


def _progress(cli, trainer: pl.Trainer, output_dir: Path) -> Optional[ProgressCheckpoint]:
    """The run's progress checkpoints: restoring those of ``--resume``, writing new ones every
    ``--progress_every`` batches (``None``: neither)."""
    every = int(cli.config.get("progress_every") or 0)
    try:
        if cli.resume_dir is not None:
            resumed = RunProgress.load(output_dir)
            resumed.check_world_size(trainer.world_size)
            return ProgressCheckpoint(output_dir, every, resumed=resumed)
        # every process checks before it joins the others, so before any process writes to the folder
        check_fresh_run_dir(output_dir, overwrite=bool(cli.config.get("overwrite")))
        if every:
            return ProgressCheckpoint(output_dir, every, config_text=cli.parser.dump(cli.config, skip_none=False))
    except ProgressError as err:
        raise SystemExit(f"error: {err}") from None
    return None


if __name__ == "__main__":
    main()
