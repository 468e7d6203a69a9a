"""Training a classifier end to end: fit, reload the best epoch, validate (and test), export (and build concept
heads).

:func:`fit_and_export` is what ``train.py`` runs after parsing its command line, and what
:mod:`training.cached_training` runs to train a classifier on first use (the synthetic benchmark's ViT,
``trained:<config.yaml>`` specs).

How a module exports (:func:`exporter`): a module that has an ``export(output, datamodule, metadata)`` method
and an ``export_name`` says it itself (:class:`lightning_modules.text_classifier.TextClassifierModule`: a Hugging Face
folder, ``save_pretrained``); a :class:`lightning_modules.probe.LinearProbe` becomes a stock timm classifier file
(``save_classifier``, :func:`export_probe`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import pytorch_lightning as pl

from lightning_modules.probe import LinearProbe
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


Exporter = Callable[[Path, pl.LightningDataModule, Dict[str, Any]], Optional[Path]]


def exporter(module: pl.LightningModule) -> Tuple[str, Exporter]:
    """``(default output name, export function)`` of ``module`` (module docstring); an error names a module
    that cannot export. The function takes ``(output, datamodule, metadata)`` and returns what it wrote."""
    export = getattr(module, "export", None)
    name = getattr(module, "export_name", None)
    if callable(export) and isinstance(name, str):
        return name, export
    if isinstance(module, LinearProbe):
        return "classifier.pt", lambda output, datamodule, metadata: export_probe(module, output, datamodule,
                                                                                   metadata)
    raise TypeError(f"{type(module).__name__} does not say how it exports: give it an export(output, datamodule, "
                    "metadata) method and an export_name (see training.fit)")


def hand_over_data_config(module: pl.LightningModule, datamodule: pl.LightningDataModule) -> None:
    """What the data must know of the model (``module.data_config()``, e.g. a text model's tokenizer) given to a
    datamodule that takes it (``set_model_data_config``), as ``evaluate.py`` does; nothing for the others."""
    if callable(getattr(module, "data_config", None)) and callable(getattr(datamodule, "set_model_data_config", None)):
        datamodule.set_model_data_config(module.data_config())


def fit_and_export(trainer: pl.Trainer, module: pl.LightningModule, datamodule: pl.LightningDataModule,
                   output: Optional[PathLike] = None, concepts: Any = None, test: bool = False) -> Optional[Path]:
    """Train ``module`` and export it; returns the export (file or folder) on the global-zero process (else
    ``None``).

    0. the module's data facts to the datamodule (:func:`hand_over_data_config`); 1. ``trainer.fit``; 2. reload
    the best checkpoint's weights (``ModelCheckpoint`` on ``val/loss``), if any;
    3. ``trainer.validate`` (every process), and ``trainer.test`` when ``test`` (the datamodule's test split);
    4. on global zero: the module's export (:func:`exporter`) at ``output`` (default
    ``<trainer.default_root_dir>/<export name>``: ``classifier.pt`` for a probe, the folder ``classifier`` for a
    text classifier) with the metrics and the best checkpoint's path, its path printed (``saved classifier:``);
    then the concept heads of ``concepts`` (:class:`models.concepts.ConceptsConfig`, probes only) next to it. A
    ``cls+mean_patch`` probe has no stock timm form: its best Lightning checkpoint is returned instead.
    """
    name, export = exporter(module)  # before training: a module that cannot export fails now
    if concepts is not None and name != "classifier.pt":
        raise ValueError(f"concept heads (--concepts) are built from a timm classifier file; {type(module).__name__} "
                         "exports none")
    hand_over_data_config(module, datamodule)
    trainer.fit(module, datamodule=datamodule)
    best = best_checkpoint(trainer)
    if best:  # the best epoch's weights
        load_best_weights(module, best)
    val = trainer.validate(module, datamodule=datamodule, verbose=False)
    metrics = {k: float(v) for k, v in (val[0] if val else {}).items()}
    metadata: Dict[str, Any] = {"val_metrics": metrics, "best_checkpoint": best}
    if test:
        tested = trainer.test(module, datamodule=datamodule, verbose=False)
        metadata["test_metrics"] = {k: float(v) for k, v in (tested[0] if tested else {}).items()}
    if not trainer.is_global_zero:
        return None
    path = export(Path(output or Path(trainer.default_root_dir) / name), datamodule, metadata)
    if path is None:
        return None
    print(f"validation: {metrics}", flush=True)
    if test:
        print(f"test: {metadata['test_metrics']}", flush=True)
    if best and Path(path) == Path(best):  # no classifier to export, only the Lightning checkpoint
        if concepts is not None:
            print("concept heads not built: they are computed from an exported classifier", flush=True)
        return path
    print(f"saved classifier: {Path(path).resolve()}", flush=True)
    if concepts is not None:
        save_concepts(concepts, path, datamodule, module.hparams.num_classes)
    return path


def export_probe(module: pl.LightningModule, output: Path, datamodule: pl.LightningDataModule,
                 metadata: Dict[str, Any]) -> Optional[Path]:
    """A :class:`~lightning_modules.probe.LinearProbe` as a stock timm classifier file (``save_classifier`` of
    ``module.to_timm()``, with ``metadata``, the backbone, read-out and the datamodule's classes); a
    ``cls+mean_patch`` probe, which has none, returns its best Lightning checkpoint (``None`` without one)."""
    best = metadata.get("best_checkpoint")
    if module.hparams.features == "cls+mean_patch":
        print(f"'cls+mean_patch' probes have no stock timm form; best Lightning checkpoint: {best}", flush=True)
        return Path(best) if best else None
    return save_classifier(module.to_timm(), output, **metadata, backbone=module.hparams.backbone,
                           features=module.hparams.features, classes=getattr(datamodule, "classes", None))


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
