"""Train a classifier (linear probe, fine-tuned ViT, fine-tuned text classifier) and export it.

    python train.py                                    # configs/train/synthetic_vit.yaml (the default)
    python train.py --config configs/train/dino_vits8_linear_probe.yaml --data.init_args.root /data/imagenet \
        --model.backbone_checkpoint /weights/dino_deitsmall8_pretrain.pth
    python train.py --trainer.max_epochs 1 --output /tmp/vit.pt
    python train.py --config configs/train/synthetic_linear_probe.yaml      # probe + concept heads (CDAM)
    python train.py --config configs/train/planted_words_bert.yaml          # small BERT, built-in text benchmark
    python train.py --config configs/train/minilm_movie_reviews.yaml        # MiniLM on Movie Reviews (CPU)

The command line (``--config`` files, whose ``base:`` files apply first; ``--key.sub value`` overrides; W&B
offline by default; mixed precision on CUDA when ``trainer.precision`` is unset) is :class:`cli.TrainCLI`. The
model is any LightningModule that says how it exports (:func:`training.fit.exporter`):
:class:`lightning_modules.probe.LinearProbe` (the default when a config names no ``model.class_path``) or
:class:`lightning_modules.text_classifier.TextClassifierModule`; the data any LightningDataModule.

``--output`` is where the exported classifier goes (default ``<trainer.default_root_dir>/classifier.pt`` for a
probe, the folder ``<trainer.default_root_dir>/classifier`` for a text classifier): after ``fit`` the best
checkpoint (``ModelCheckpoint`` on ``val/loss``) is reloaded, validated (``--test true``: also tested), exported
(``save_classifier``: a stock timm model; ``save_pretrained``: a Hugging Face folder with the tokenizer) and its
path printed (:func:`training.fit.fit_and_export`). ``load_model("trained:<config.yaml>")`` trains the same
way on first use and caches the export (:mod:`training.cached_training`; importing :mod:`training` registers the
``trained:`` and ``synthetic`` specs, e.g. ``--model.backbone_checkpoint synthetic``).

Concept heads (CDAM): ``--concepts.kinds '[mean, cav]'`` (see :class:`models.concepts.ConceptsConfig`) builds,
from the exported classifier, one concept file per kind next to it (``concepts_<kind>.pt``): the concepts are
the dataset's classes (first ``per_concept`` validation images of each) or the sub-folders of
``--concepts.folder``. ``evaluate.py --model.concepts FILE`` explains them with ``cdam``.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from cli import TrainCLI, check_data_paths
from methods.cpu_memory import retain_freed_memory
from training.fit import fit_and_export  # the training package registers the trained: and synthetic sources


def main(args: Optional[List[str]] = None) -> Optional[Path]:
    retain_freed_memory()  # CPU: no fresh pages for every large tensor (methods/cpu_memory.py)
    cli = TrainCLI(args)  # config files + command line -> trainer, module, datamodule
    check_data_paths(cli.datamodule)
    return fit_and_export(cli.trainer, cli.model, cli.datamodule, output=cli.config.get("output"),
                          concepts=cli.config.get("concepts"), test=cli.config.get("test", False))


if __name__ == "__main__":
    main()
