"""Train a classifier (linear probe or fine-tuned ViT) and export it as a stock timm model.

    python train.py                                    # configs/train/synthetic_vit.yaml (the default)
    python train.py --config configs/train/dino_vits8_linear_probe.yaml --data.init_args.root /data/imagenet \
        --model.backbone_checkpoint /weights/dino_deitsmall8_pretrain.pth
    python train.py --trainer.max_epochs 1 --output /tmp/vit.pt
    python train.py --config configs/train/synthetic_linear_probe.yaml      # probe + concept heads (CDAM)

The command line (``--config`` files, whose ``base:`` files apply first; ``--key.sub value`` overrides; W&B
offline by default; mixed precision on CUDA when ``trainer.precision`` is unset) is :class:`cli.TrainCLI`. The
model is :class:`lightning_modules.probe.LinearProbe`, the data any LightningDataModule.

``--output`` is where the exported classifier goes (default ``<trainer.default_root_dir>/classifier.pt``):
after ``fit`` the best checkpoint (``ModelCheckpoint`` on ``val/loss``) is reloaded, validated, exported with
``save_classifier`` and its path printed (:func:`models.training.fit_and_export`).

Concept heads (CDAM): ``--concepts.kinds '[mean, cav]'`` (see :class:`models.concepts.ConceptsConfig`) builds,
from the exported classifier, one concept file per kind next to it (``concepts_<kind>.pt``): the concepts are
the dataset's classes (first ``per_concept`` validation images of each) or the sub-folders of
``--concepts.folder``. ``evaluate.py --model.concepts FILE`` explains them with ``cdam``.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from cli import TrainCLI, check_data_paths
from models.training import fit_and_export


def main(args: Optional[List[str]] = None) -> Optional[Path]:
    cli = TrainCLI(args)  # config files + command line -> trainer, module, datamodule
    check_data_paths(cli.datamodule)
    return fit_and_export(cli.trainer, cli.model, cli.datamodule,
                          output=cli.config.get("output"), concepts=cli.config.get("concepts"))


if __name__ == "__main__":
    main()
