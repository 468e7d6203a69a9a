"""Train a classifier (linear probe or fine-tuned ViT) and export it with ``save_classifier``.

    python train.py                                    # configs/train/synthetic_vit.yaml (the default)
    python train.py --config configs/train/dino_vits8_linear_probe.yaml --data.init_args.root /data/imagenet \
        --model.backbone_checkpoint /weights/dino_deitsmall8_pretrain.pth
    python train.py --trainer.max_epochs 1 --output /tmp/vit.pt
    python train.py --config configs/train/synthetic_linear_probe.yaml      # probe + concept heads (CDAM)

LightningCLI: ``--config`` files and ``--key.sub value`` overrides; ``--output`` is where the exported stock
timm classifier goes (default ``<trainer.default_root_dir>/classifier.pt``). After ``fit`` the best checkpoint
(``ModelCheckpoint`` on ``val/loss``) is reloaded, exported, saved, and its path printed.

Concept heads (CDAM): ``--concepts.kinds '[mean, cav]'`` (see ``lightning_modules.concepts.ConceptsConfig``)
builds, from the exported classifier, one concept file per kind next to it (``concepts_<kind>.pt``): the concepts
are the dataset's classes (first ``per_concept`` validation images of each) or the sub-folders of
``--concepts.folder``. ``evaluate.py --model.concepts FILE`` explains them with ``cdam``.

W&B is the default logger and runs offline unless ``WANDB_MODE=online`` (or the logger's init args) say
otherwise; its ``save_dir`` defaults to ``trainer.default_root_dir``. Mixed precision: when
``trainer.precision`` is not set, ``bf16-mixed`` (``16-mixed`` without bf16 support) on a CUDA accelerator,
``32-true`` otherwise.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

os.environ.setdefault("WANDB_MODE", "offline")

import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
from pytorch_lightning.cli import LightningCLI  # noqa: E402

from lightning_modules.checkpoints import save_classifier  # noqa: E402
from lightning_modules.concepts import ConceptsConfig, build_concept_heads  # noqa: E402
from lightning_modules.probe import LinearProbe  # noqa: E402

ROOT = Path(__file__).resolve().parent
DEFAULT_CONFIG = ROOT / "configs" / "train" / "synthetic_vit.yaml"


class TrainCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--output", type=Optional[str], default=None,
                            help="path of the exported classifier (save_classifier); default <default_root_dir>/classifier.pt")
        parser.add_argument("--concepts", type=Optional[ConceptsConfig], default=None,
                            help="also build concept heads of the trained classifier (CDAM concepts), saved next to it")

    def before_instantiate_classes(self) -> None:
        cfg = self.config
        trainer = cfg["trainer"]
        if trainer.get("precision") is None:
            accel = str(trainer.get("accelerator") or "auto")
            cuda = torch.cuda.is_available() and accel in ("auto", "gpu", "cuda")
            trainer["precision"] = ("bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed") if cuda else "32-true"
        logger = trainer.get("logger")
        loggers = logger if isinstance(logger, list) else [logger]
        root = trainer.get("default_root_dir") or os.getcwd()
        for item in loggers:
            if hasattr(item, "get") and "WandbLogger" in str(item.get("class_path", "")):
                args = item["init_args"]
                if args.get("save_dir") in (None, ".", ""):
                    args["save_dir"] = str(root)
                Path(args["save_dir"]).mkdir(parents=True, exist_ok=True)


def _check_data(datamodule: pl.LightningDataModule) -> None:
    root = getattr(datamodule, "root", None) or getattr(datamodule, "data_dir", None)
    if root is not None and not Path(os.path.expanduser(str(root))).exists():
        raise SystemExit(f"error: data folder {str(root)!r} does not exist; pass it with --data.init_args.root PATH")


def main(args: Optional[List[str]] = None) -> Optional[Path]:
    from_argv = args is None
    args = list(sys.argv[1:] if from_argv else args)
    if not any(a in ("--config", "-c") or a.startswith("--config=") for a in args) and not {"-h", "--help"} & set(args):
        args = ["--config", str(DEFAULT_CONFIG)] + args
    if from_argv:  # LightningCLI reads sys.argv itself
        sys.argv[1:] = args
    cli = TrainCLI(
        LinearProbe, pl.LightningDataModule, subclass_mode_data=True, run=False, args=None if from_argv else args,
        save_config_kwargs={"overwrite": True}, seed_everything_default=0,
    )
    _check_data(cli.datamodule)
    trainer, module = cli.trainer, cli.model
    trainer.fit(module, datamodule=cli.datamodule)

    ckpt = trainer.checkpoint_callback
    best = getattr(ckpt, "best_model_path", "") if ckpt is not None else ""
    if best:  # the best epoch's weights (same architecture: no weights to fetch again)
        module.load_state_dict(torch.load(best, map_location="cpu", weights_only=False)["state_dict"])
    val = trainer.validate(module, datamodule=cli.datamodule, verbose=False)
    metrics = {k: float(v) for k, v in (val[0] if val else {}).items()}
    if not trainer.is_global_zero:
        return None
    if module.hparams.features == "cls+mean_patch":
        print(f"'cls+mean_patch' probes have no stock timm form; best Lightning checkpoint: {best}", flush=True)
        if cli.config.get("concepts") is not None:
            print("concept heads not built: they are computed from an exported classifier", flush=True)
        return Path(best) if best else None
    output = Path(cli.config.get("output") or Path(trainer.default_root_dir) / "classifier.pt")
    path = save_classifier(
        module.to_timm(), output, val_metrics=metrics, best_checkpoint=best,
        backbone=module.hparams.backbone, features=module.hparams.features, classes=getattr(cli.datamodule, "classes", None),
    )
    print(f"validation: {metrics}", flush=True)
    print(f"saved classifier: {path.resolve()}", flush=True)
    spec = cli.config.get("concepts")
    if spec is not None:
        save_concepts(spec, path, cli.datamodule, module.hparams.num_classes)
    return path


def save_concepts(spec, classifier_path: Path, datamodule: pl.LightningDataModule, num_classes: int) -> List[Path]:
    """Concept heads of the exported classifier (reloaded from its file, as evaluate.py will see it)."""
    from lightning_modules.checkpoints import load_classifier

    if not isinstance(spec, ConceptsConfig):
        spec = ConceptsConfig(**dict(spec))
    model = load_classifier(classifier_path)
    dataset = None
    if spec.folder is None:
        datamodule.setup("validate")
        dataset = datamodule.val_dataloader().dataset
    heads = build_concept_heads(model, spec, dataset=dataset, class_names=getattr(datamodule, "classes", None),
                                num_classes=num_classes)
    paths = []
    for kind, head in heads.items():
        out = head.save(classifier_path.with_name(f"concepts_{kind}.pt"), classifier=str(classifier_path.resolve()),
                        per_concept=spec.per_concept, source=spec.folder or "dataset classes (validation split)")
        print(f"saved {kind} concepts {head.names}: {out.resolve()}", flush=True)
        paths.append(out)
    return paths


if __name__ == "__main__":
    main()
