"""Evaluate attribution methods on a classifier: perturbation and segmentation tests, logged and saved.

    python evaluate.py                                     # configs/evaluate/synthetic.yaml (the default)
    python evaluate.py --config configs/evaluate/imagenet_perturbation.yaml --data.init_args.root /data/imagenet
    python evaluate.py --model.methods '[rollout, gradcam]' --data.init_args.test_size 32
    python evaluate.py --trainer.devices 2 --trainer.strategy ddp --trainer.accelerator cpu

LightningCLI (``--config`` files, ``--key.sub value`` overrides); the run mode is ``trainer.test``. The model is
``lightning_modules.evaluation.AttributionEvaluationModule``, the data any LightningDataModule (batches
``{"image" in [0, 1], "label", "index", ["mask"], ...}``), the tests are ``EvaluationCallback``s in
``trainer.callbacks`` (``callbacks.perturbation.PerturbationTest``, ``callbacks.segmentation.SegmentationTest``,
``callbacks.cdam_analysis.CDAMAnalysis``, ...).

On N processes every test sample is evaluated exactly once (``datamodules.unrepeated.UnrepeatedTestData``) and
the metrics are torchmetrics states reduced across processes, so ``metrics.json`` matches a 1-process run.

Outputs: every result goes to the logger (scalars; curves as a table; heatmap overlays as images; the resolved
config as hyperparameters) and to ``metrics.json`` in the run folder ``--output_dir`` (default
``<trainer.default_root_dir>/evaluate/<date-time>``), whose path is printed with a results table at the end.
W&B is the default logger and runs offline unless ``WANDB_MODE=online`` (or the logger's init args) say
otherwise. The progress bar is shown in a terminal and hidden in CI (``CI`` set or stdout not a TTY).
"""
from __future__ import annotations

import datetime
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

os.environ.setdefault("WANDB_MODE", "offline")

import pytorch_lightning as pl  # noqa: E402
from pytorch_lightning.cli import LightningCLI  # noqa: E402

from callbacks.report import collect_results, log_curves, results_table, write_metrics_json  # noqa: E402
from datamodules.unrepeated import UnrepeatedTestData  # noqa: E402
from lightning_modules.evaluation import AttributionEvaluationModule  # noqa: E402

# EvaluationCallback logs values that torchmetrics already reduced across processes: Lightning's advice to
# add sync_dist=True (a second reduction) does not apply
warnings.filterwarnings("ignore", message=r".*when logging on epoch level in distributed setting.*")

ROOT = Path(__file__).resolve().parent
DEFAULT_CONFIG = ROOT / "configs" / "evaluate" / "synthetic.yaml"


def interactive() -> bool:
    return sys.stdout.isatty() and not os.environ.get("CI")


class EvaluateCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--output_dir", type=Optional[str], default=None,
                            help="folder of metrics.json (default <trainer.default_root_dir>/evaluate/<date-time>)")

    def before_instantiate_classes(self) -> None:
        trainer = self.config["trainer"]
        trainer["inference_mode"] = False  # the methods need autograd inside test_step
        if trainer.get("enable_progress_bar") is None:
            trainer["enable_progress_bar"] = interactive()
        if trainer.get("default_root_dir") in (None, ""):
            trainer["default_root_dir"] = "outputs"
        root = trainer["default_root_dir"]
        logger = trainer.get("logger")
        for item in (logger if isinstance(logger, list) else [logger]):
            if hasattr(item, "get") and "WandbLogger" in str(item.get("class_path", "")):
                args = item["init_args"]
                if args.get("save_dir") in (None, ".", ""):
                    args["save_dir"] = str(root)
                Path(args["save_dir"]).mkdir(parents=True, exist_ok=True)


def _check_data(datamodule: pl.LightningDataModule) -> None:
    for attr, what in (("root", "data folder"), ("path", "data file")):
        value = getattr(datamodule, attr, None)
        if isinstance(value, (str, os.PathLike)) and not Path(os.path.expanduser(str(value))).exists():
            raise SystemExit(f"error: {what} {str(value)!r} does not exist; pass it with --data.init_args.{attr} PATH")


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


def _fractions(trainer: pl.Trainer) -> Optional[List[float]]:
    for callback in trainer.callbacks:
        if hasattr(callback, "fractions"):
            return list(callback.fractions)
    return None


def main(args: Optional[List[str]] = None) -> Optional[Dict[str, Any]]:
    from_argv = args is None
    args = list(sys.argv[1:] if from_argv else args)
    if not any(a in ("--config", "-c") or a.startswith("--config=") for a in args) and not {"-h", "--help"} & set(args):
        args = ["--config", str(DEFAULT_CONFIG)] + args
    if from_argv:  # LightningCLI reads sys.argv itself; DDP children re-run this same command line
        sys.argv[1:] = args
    cli = EvaluateCLI(
        AttributionEvaluationModule, pl.LightningDataModule, subclass_mode_data=True, run=False,
        args=None if from_argv else args, save_config_kwargs={"overwrite": True}, seed_everything_default=0,
    )
    trainer, module, datamodule = cli.trainer, cli.model, cli.datamodule
    _check_data(datamodule)
    if hasattr(datamodule, "set_model_data_config"):  # e.g. ImageNet with preprocessing="timm"
        datamodule.set_model_data_config(module.data_config())
    if trainer.logger is not None:
        trainer.logger.log_hyperparams(cli.config.as_dict())  # rank-zero only inside the logger
    trainer.test(module, datamodule=UnrepeatedTestData(datamodule), verbose=False)

    results = collect_results(trainer, module)
    if not trainer.is_global_zero:
        return results
    out = _output_dir(cli, trainer)
    path = write_metrics_json(results, out / "metrics.json")
    log_curves(trainer.logger, results, _fractions(trainer))
    if trainer.logger is not None:
        trainer.logger.save()
    print(results_table(results))
    print(f"\nmetrics written to {path}", flush=True)
    return results


if __name__ == "__main__":
    main()
