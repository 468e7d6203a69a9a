"""The LightningModule that runs attribution methods on a classifier for the evaluation callbacks.

``AttributionEvaluationModule`` holds a stock timm ``VisionTransformer`` and the methods to evaluate. Its
``test_step`` takes a batch ``{"image": [B, 3, H, W] in [0, 1] (NOT normalised), "label": [B], "index": [B], ...}``,
normalises the images with the model's own mean/std, and returns the contract of ``callbacks/base.py``::

    {"relevance": {method_name: {class_setting: Tensor}},   # raw: [B, P] tokens or [B, H, W] pixels
     "targets":   {class_setting: LongTensor[B]},
     "logits":    Tensor[B, C]}                               # clean logits

Class settings: ``predicted`` (argmax of the clean logits), ``target`` (``batch["label"]``) and ``other``
(``batch["other_label"]``, two-object data). The module computes the union of its own ``class_settings`` and of
the settings the attached ``EvaluationCallback``s require; ``other`` only when the batch has ``other_label``.
A class-agnostic method (``method.class_specific == False``) runs once per batch and the *same tensor* is
returned for every setting (callbacks may use ``is`` to skip duplicate work).

The clean top-1 accuracy against ``batch["label"]`` is accumulated in a torchmetrics state (sum of correct and
of samples, reduced across processes) and logged as ``accuracy``; ``self.results`` holds it for ``metrics.json``.

Gradients: most methods need autograd, so the trainer must run with ``inference_mode=False`` (``evaluate.py``
sets it); the classifier's parameters are frozen (methods differentiate activations, not weights).
"""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import pytorch_lightning as pl
import torch
from torch import Tensor, nn
from torchmetrics import Metric

from methods import available_methods, build_method, method_class

CLASS_SETTINGS = ("predicted", "target", "other")
MethodsSpec = Union[None, str, List[str], Dict[str, Optional[Dict[str, Any]]]]


class CleanAccuracy(Metric):
    """Top-1 accuracy: float64 sums of correct predictions and of samples (reduced with ``sum``)."""

    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("correct", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, logits: Tensor, labels: Tensor) -> None:
        self.correct += (logits.argmax(dim=-1) == labels).sum().to(torch.float64)
        self.total += float(labels.numel())

    def compute(self) -> Tensor:
        return self.correct / self.total if self.total > 0 else torch.tensor(float("nan"), dtype=torch.float64)


# ------------------------------------------------------------------------------------------ model loading
def load_model(classifier: str, pretrained: bool = True, model_kwargs: Optional[Dict[str, Any]] = None) -> nn.Module:
    """The classifier named by ``classifier``:

    * ``"synthetic"``: the small ViT of the synthetic benchmark (``ensure_synthetic_classifier``: trained on
      first use, then cached) loaded with ``load_classifier``; ``"synthetic:<overrides.yaml>"``: the same with
      these ``train.py`` keys changed (e.g. ``configs/train/synthetic_vit_avgpool.yaml``);
    * a path to a file written by ``save_classifier``;
    * ``"timm:<name>"``: ``timm.create_model(name, pretrained=pretrained, **model_kwargs)`` (``pretrained=False``
      with ``model_kwargs`` gives a random model of any size, e.g. for tests). Offline, real weights come from a
      local file: ``model_kwargs={"pretrained_cfg_overlay": {"file": path}}`` (with ``num_classes`` the file's
      head is loaded, not re-initialised).
    """
    from lightning_modules.checkpoints import is_synthetic_spec, load_classifier, resolve_synthetic_spec

    if is_synthetic_spec(classifier):
        if model_kwargs:
            raise ValueError("model_kwargs apply to 'timm:<name>' classifiers only")
        return load_classifier(resolve_synthetic_spec(classifier))
    if classifier.startswith("timm:"):
        import timm

        name = classifier[len("timm:"):]
        kwargs = dict(model_kwargs or {})
        overlay = kwargs.get("pretrained_cfg_overlay")
        if overlay and overlay.get("file") and "num_classes" in kwargs and "num_classes" not in overlay:
            # timm silently re-initialises the head when num_classes differs from the pretrained config's: a local
            # weights file of a fine-tuned classifier holds its own head, so declare it
            kwargs["pretrained_cfg_overlay"] = {**overlay, "num_classes": kwargs["num_classes"]}
        try:
            return timm.create_model(name, pretrained=pretrained, **kwargs).eval()
        except Exception as err:
            raise ValueError(f"cannot create timm model {name!r} (pretrained={pretrained}): {err}") from err
    path = os.path.expanduser(classifier)
    if os.path.exists(path):
        if model_kwargs:
            raise ValueError("model_kwargs apply to 'timm:<name>' classifiers only")
        return load_classifier(path)
    raise FileNotFoundError(f"classifier {classifier!r} is neither 'synthetic', 'timm:<name>' nor an existing "
                            "classifier file (save_classifier)")


def load_concept_heads(files: Union[None, str, List[str]]) -> Dict[str, Any]:
    """``{kind: ConceptHead}`` of concept files (one kind per file; a kind given twice is an error)."""
    from lightning_modules.concepts import ConceptHead

    if files is None:
        return {}
    heads: Dict[str, Any] = {}
    for path in [files] if isinstance(files, str) else list(files):
        head = ConceptHead.load(path)
        if head.kind in heads:
            raise ValueError(f"two concept files of kind {head.kind!r} (second: {path!r}); give one per kind")
        heads[head.kind] = head
    return heads


def resolve_concept(heads: Dict[str, Any], ref: str, method: str = "cdam") -> Tensor:
    """The vector named ``ref`` (``<name>`` or ``<kind>:<name>``) in ``heads``; errors list what exists."""
    if not heads:
        raise ValueError(f"method {method!r} names concept {ref!r} but no concept file is given "
                         "(--model.concepts FILE, written by train.py --concepts)")
    kind, _, name = ref.rpartition(":")
    if kind:
        if kind not in heads:
            raise KeyError(f"method {method!r}: no concept file of kind {kind!r} (loaded kinds: {sorted(heads)})")
        return heads[kind].vector(name)
    found = [k for k, head in heads.items() if name in head.names]
    if len(found) != 1:
        known = sorted(f"{k}:{n}" for k, head in heads.items() for n in head.names)
        what = "is ambiguous, use <kind>:<name>" if found else "is unknown"
        raise KeyError(f"method {method!r}: concept {name!r} {what}; concepts: {', '.join(known)}")
    return heads[found[0]].vector(name)


def parse_methods(methods: MethodsSpec) -> Dict[str, Dict[str, Any]]:
    """``{display name: {"method": registered name, **options}}`` from a method specification.

    ``None`` or ``"all"``: every registered method that supports timm ViTs; a list of names; or a mapping
    ``{display name: options}`` where options may carry ``method: <registered name>`` to evaluate one method
    under several option sets (e.g. ``{rollout_l4: {method: rollout, start_layer: 4}}``).
    """
    if methods is None or methods == "all":
        return {name: {"method": name} for name in available_methods()}
    if isinstance(methods, str):
        methods = [methods]
    if isinstance(methods, (list, tuple)):
        if len(set(methods)) != len(methods):
            raise ValueError(f"methods are listed twice: {list(methods)}")
        return {name: {"method": name} for name in methods}
    if isinstance(methods, dict):
        spec = {}
        for name, options in methods.items():
            options = dict(options or {})
            options.setdefault("method", name)
            spec[name] = options
        return spec
    raise TypeError(f"methods must be None, 'all', a list of names or a mapping name -> options, got {type(methods).__name__}")


class AttributionEvaluationModule(pl.LightningModule):
    """Classifier + attribution methods; ``test_step`` returns raw maps per method and class setting.

    Args:
        classifier: ``"synthetic"``, a ``save_classifier`` file or ``"timm:<name>"`` (see :func:`load_model`).
        pretrained: for ``timm:`` classifiers.
        model_kwargs: extra ``timm.create_model`` arguments for ``timm:`` classifiers.
        methods: what to evaluate (see :func:`parse_methods`); default every registered method.
        method_options: options per *registered* method name, merged under the options given in ``methods``
            (e.g. ``{beyond_intuition_token: {start_layer: 2}}`` for a 4-block model with ``methods: null``).
        class_settings: settings always computed (callbacks add the ones they require).
        mean, std: normalisation override (default: the model's ``pretrained_cfg`` via timm's data config).
        forward_batch_size: images per plain forward in :meth:`classify` (masked forwards of the callbacks).
        method_batch_size: images per method call (default: the whole batch).
        concepts: concept files of this classifier (``ConceptHead.save``; ``train.py --concepts``). A method
            entry ``{name: {method: cdam, concept: <concept name>}}`` explains that concept (``<kind>:<name>``
            when several files hold the name); ``concept_methods: true`` adds ``cdam_concept_<name>`` for every
            concept of the files (``cdam_<kind>_concept_<name>`` with several files).
    """

    def __init__(self, classifier: str = "synthetic", pretrained: bool = True,
                 model_kwargs: Optional[Dict[str, Any]] = None, methods: MethodsSpec = None,
                 method_options: Optional[Dict[str, Dict[str, Any]]] = None,
                 class_settings: Sequence[str] = ("predicted",), mean: Optional[Sequence[float]] = None,
                 std: Optional[Sequence[float]] = None, forward_batch_size: int = 64,
                 method_batch_size: Optional[int] = None,
                 concepts: Union[None, str, List[str]] = None, concept_methods: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        bad = [s for s in class_settings if s not in CLASS_SETTINGS]
        if bad:
            raise ValueError(f"unknown class settings {bad}; choose from {CLASS_SETTINGS}")
        if forward_batch_size < 1 or (method_batch_size is not None and method_batch_size < 1):
            raise ValueError("forward_batch_size and method_batch_size must be >= 1")
        self.model = load_model(classifier, pretrained, model_kwargs)
        self.model.requires_grad_(False)
        self.model.eval()
        self.method_specs = parse_methods(methods)
        self.concept_heads = load_concept_heads(concepts)
        if concept_methods:
            if not self.concept_heads:
                raise ValueError("concept_methods needs concept files (concepts: FILE or [FILES])")
            for kind, head in self.concept_heads.items():
                for concept in head.names:
                    name = (f"cdam_concept_{concept}" if len(self.concept_heads) == 1
                            else f"cdam_{kind}_concept_{concept}")
                    if name in self.method_specs:
                        raise ValueError(f"method {name!r} is listed and also added by concept_methods")
                    self.method_specs[name] = {"method": "cdam", "concept": f"{kind}:{concept}"}
        for name, options in (method_options or {}).items():
            method_class(name)  # unknown names: KeyError listing the registered methods
            for spec in self.method_specs.values():
                if spec["method"] == name:
                    for key, value in (options or {}).items():
                        spec.setdefault(key, value)
        self.methods = self._build_methods(self.method_specs, explicit=methods not in (None, "all"))
        cfg = self._data_config()
        mean = tuple(float(v) for v in (mean if mean is not None else cfg["mean"]))
        std = tuple(float(v) for v in (std if std is not None else cfg["std"]))
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean and std must have 3 entries (std > 0), got mean={mean} std={std}")
        self.mean, self.std = mean, std
        self.register_buffer("_mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("_std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)
        self.class_settings = tuple(class_settings)
        self.accuracy = CleanAccuracy()
        self.results: Dict[str, float] = {}

    # -------------------------------------------------------------------------------- set-up
    def _build_methods(self, specs: Dict[str, Dict[str, Any]], explicit: bool) -> Dict[str, Any]:
        from methods.adapters import adapter_for

        built = {}
        for name, options in specs.items():
            options = dict(options)
            registered = options.pop("method")
            if isinstance(options.get("concept"), str):
                options["concept"] = resolve_concept(self.concept_heads, options["concept"], method=name)
                width = getattr(self.model, "num_features", None)
                if width is not None and options["concept"].numel() != width:
                    raise ValueError(f"method {name!r}: concept vector has {options['concept'].numel()} entries but "
                                     f"the classifier's latent has {width}: the concept file is of another model")
            families = getattr(method_class(registered), "families", None)
            try:
                adapter_for(self.model, families)
            except TypeError as err:
                if explicit:
                    raise TypeError(f"method {name!r} ({registered}) does not support this classifier: {err}") from None
                continue  # e.g. a text-only method in the default "every method" list
            built[name] = build_method(registered, **options)
        if not built:
            raise ValueError(f"no attribution method to evaluate (asked for {list(specs)})")
        return built

    def _data_config(self) -> Dict[str, Any]:
        from timm.data import resolve_data_config

        return resolve_data_config({}, model=self.model)

    def data_config(self) -> Dict[str, Any]:
        """timm's data config of the classifier (input size, interpolation, crop, mean/std)."""
        return self._data_config()

    @property
    def method_names(self) -> List[str]:
        return list(self.methods)

    def _required_settings(self, batch: Dict[str, Any]) -> List[str]:
        from callbacks.base import EvaluationCallback

        wanted = list(self.class_settings)
        trainer = self._trainer
        for callback in (trainer.callbacks if trainer is not None else []):
            if isinstance(callback, EvaluationCallback):
                wanted += list(callback.required_class_settings)
        settings = [s for s in CLASS_SETTINGS if s in wanted]
        if "other" in settings and "other_label" not in batch:
            settings.remove("other")  # a callback that needs it raises its own error naming the missing data
        return settings

    # -------------------------------------------------------------------------------- forward helpers
    def normalize(self, images: Tensor) -> Tensor:
        """[0, 1] images -> the model's input (``(x - mean) / std``)."""
        return (images - self._mean.to(images)) / self._std.to(images)

    def token_grid(self, images: Tensor) -> Tuple[int, int]:
        """The patch-token grid of the model for these images (e.g. for the random baseline's maps)."""
        from methods.adapters import adapter_for

        return tuple(adapter_for(self.model).grid_size(images))

    @torch.no_grad()
    def classify(self, images: Tensor, batch_size: Optional[int] = None) -> Tensor:
        """Predicted classes ``[N]`` of [0, 1] images ``[N, 3, H, W]``, ``batch_size`` images per forward."""
        step = batch_size or self.hparams.forward_batch_size
        preds = [self.model(self.normalize(chunk)).argmax(dim=-1) for chunk in images.split(step)]
        return torch.cat(preds) if preds else torch.empty(0, dtype=torch.long, device=images.device)

    def forward(self, images: Tensor) -> Tensor:
        return self.model(self.normalize(images))

    def _attribute(self, method, inputs: Tensor, target: Optional[Tensor], indices: Optional[Tensor]) -> Tensor:
        step = self.hparams.method_batch_size or inputs.shape[0]
        parts = []
        for start in range(0, inputs.shape[0], step):
            stop = start + step
            part_target = None if target is None else target[start:stop]
            bind = (method.bind_indices(indices[start:stop]) if getattr(method, "uses_sample_index", False)
                    and indices is not None else contextlib.nullcontext())
            with bind:
                parts.append(method(self.model, inputs[start:stop], target=part_target))
        return torch.cat(parts)

    # -------------------------------------------------------------------------------- test loop
    def on_test_start(self) -> None:
        self.accuracy.reset()
        if torch.is_inference_mode_enabled():
            raise RuntimeError("attribution methods need autograd: build the Trainer with inference_mode=False "
                               "(evaluate.py does; --trainer.inference_mode false)")

    def test_step(self, batch: Dict[str, Any], batch_idx: int) -> Dict[str, Any]:
        for key in ("image", "label"):
            if key not in batch:
                raise KeyError(f"evaluation batches need {key!r}; got keys {sorted(batch)}")
        images, labels = batch["image"], batch["label"]
        inputs = self.normalize(images)
        with torch.no_grad():
            logits = self.model(inputs)
        self.accuracy.update(logits, labels)
        targets = {"predicted": logits.argmax(dim=-1), "target": labels}
        settings = self._required_settings(batch)
        if "other" in settings:
            targets["other"] = batch["other_label"]
        targets = {s: targets[s] for s in settings}
        indices = batch.get("index")
        relevance: Dict[str, Dict[str, Tensor]] = {}
        with torch.enable_grad():
            for name, method in self.methods.items():
                if not method.class_specific:
                    shared = self._attribute(method, inputs, None, indices)
                    relevance[name] = {s: shared for s in settings}
                else:
                    relevance[name] = {s: self._attribute(method, inputs, targets[s], indices) for s in settings}
        return {"relevance": relevance, "targets": targets, "logits": logits}

    def on_test_epoch_end(self) -> None:
        value = float(self.accuracy.compute())  # every rank: torchmetrics reduces the sums
        self.results = {"accuracy": value}
        self.log("accuracy", value, sync_dist=False, rank_zero_only=False)

    def configure_optimizers(self):  # evaluation only
        return None
