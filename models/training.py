"""Training a classifier end to end: fit, reload the best epoch, validate, export (and build concept heads).

:func:`fit_and_export` is what ``train.py`` runs after parsing its command line, and what
:func:`models.synthetic.ensure_synthetic_classifier` runs to train the synthetic benchmark's ViT.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Optional, Union

import pytorch_lightning as pl

from models.checkpoint_io import read_checkpoint
from models.classifier_file import load_classifier, save_classifier
from models.concepts import ConceptsConfig, build_concept_heads

PathLike = Union[str, os.PathLike]


def best_checkpoint(trainer: pl.Trainer) -> str:
    """Path of the best checkpoint that the trainer's ``ModelCheckpoint`` kept ('' when none)."""
    callback = trainer.checkpoint_callback
    return getattr(callback, "best_model_path", "") if callback is not None else ""


def load_best_weights(module: pl.LightningModule, checkpoint: PathLike) -> None:
    """Load the ``state_dict`` of a Lightning checkpoint into ``module`` (same architecture: nothing is fetched
    again). The checkpoint is read as tensors and plain values (``torch.load(weights_only=True)``)."""
    payload = read_checkpoint(checkpoint, what="Lightning checkpoint")
    if not isinstance(payload, dict) or "state_dict" not in payload:
        raise RuntimeError(f"Lightning checkpoint {str(checkpoint)!r} holds no 'state_dict'")
    module.load_state_dict(payload["state_dict"])


def fit_and_export(trainer: pl.Trainer, module: pl.LightningModule, datamodule: pl.LightningDataModule,
                   output: Optional[PathLike] = None, concepts: Any = None) -> Optional[Path]:
    """Train ``module`` and export it; returns the classifier file on the global-zero process (else ``None``).

    1. ``trainer.fit``; 2. reload the best checkpoint's weights (``ModelCheckpoint`` on ``val/loss``), if any;
    3. ``trainer.validate`` (every process); 4. on global zero: ``save_classifier(module.to_timm())`` at
    ``output`` (default ``<trainer.default_root_dir>/classifier.pt``) with the validation metrics, then the
    concept heads of ``concepts`` (:class:`models.concepts.ConceptsConfig`) next to it. A ``cls+mean_patch``
    probe has no stock timm form: its best Lightning checkpoint is returned instead.
    """
    trainer.fit(module, datamodule=datamodule)
    best = best_checkpoint(trainer)
    if best:  # the best epoch's weights
        load_best_weights(module, best)
    val = trainer.validate(module, datamodule=datamodule, verbose=False)
    metrics = {k: float(v) for k, v in (val[0] if val else {}).items()}
    if not trainer.is_global_zero:
        return None
    if module.hparams.features == "cls+mean_patch":
        print(f"'cls+mean_patch' probes have no stock timm form; best Lightning checkpoint: {best}", flush=True)
        if concepts is not None:
            print("concept heads not built: they are computed from an exported classifier", flush=True)
        return Path(best) if best else None
    output = Path(output or Path(trainer.default_root_dir) / "classifier.pt")
    path = save_classifier(
        module.to_timm(), output, val_metrics=metrics, best_checkpoint=best, backbone=module.hparams.backbone,
        features=module.hparams.features, classes=getattr(datamodule, "classes", None),
    )
    print(f"validation: {metrics}", flush=True)
    print(f"saved classifier: {path.resolve()}", flush=True)
    if concepts is not None:
        save_concepts(concepts, path, datamodule, module.hparams.num_classes)
    return path


def save_concepts(spec: Any, classifier_path: Path, datamodule: pl.LightningDataModule,
                  num_classes: int) -> List[Path]:
    """Concept heads of the exported classifier (reloaded from its file, as evaluate.py will see it), one file
    per kind next to it (``concepts_<kind>.pt``)."""
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
