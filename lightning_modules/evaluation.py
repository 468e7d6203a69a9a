"""The LightningModule that runs attribution methods on a classifier for the evaluation callbacks.

``AttributionEvaluationModule`` holds a classifier (a stock timm ``VisionTransformer`` or a Hugging Face sequence
classifier) and the methods to evaluate; what differs between images and texts is the classifier wrapper's
(``evaluation.classifier.classifier_for``: the data config, the inputs of a batch). Its ``test_step`` takes a batch

* images: ``{"image": [B, 3, H, W] in [0, 1] (NOT normalised), "label": [B], "index": [B], ...}``; the images
  are normalised with the model's own mean/std;
* texts: the text datamodules' batches ``{"input_ids", "attention_mask", ["token_type_ids"],
  "special_tokens_mask": [B, N], "label", "index", ...}`` (``datamodules/text_common.py``), passed to the
  methods as they are;

explains them with every method and returns the dict that :mod:`callbacks.base` describes (raw relevance per
method and class setting, the targets, the clean logits, ``class_specific``, the layout and the classifier, and
``explain``: :meth:`AttributionEvaluationModule.explain`, for the tests that re-explain perturbed inputs).

Class settings (:mod:`evaluation.method_specs`): the module explains its ``class_settings`` and those the run's
evaluation callbacks declare (:meth:`AttributionEvaluationModule.add_class_settings`; ``evaluate.py`` hands them
over); ``other`` only when the batch has ``other_label``. A class-agnostic method (``method.class_specific ==
False``) runs once per batch and the *same tensor* is returned for every setting.

A decoder language model (``*ForCausalLM``) is a classifier over its answer tokens
(``evaluation.classifier.AnswerTokenClassifier``): the classes, labels, targets and clean logits are answer
indices; a method's ``target`` is the class's vocabulary id (the wrapper's ``method_targets``). The answer tokens
are the ones its ``config.id2label`` names or, for prompted classification of real text (a datamodule with a
``prompt`` template), a ``verbalizer`` ``{class: word}``: then the explained logit is the next-token logit of the
gold (``target``) or predicted class's word at the template's answer cue.

Every method is called as ``method(model, inputs, target=..., sample_ids=batch["index"])``: the dataset index of
each sample travels explicitly (the random baseline draws its map from it). Each method's options are checked
against the model when the module is built (``method.check(model)``: block indices within the depth, options
that need a capability of the model's adapter), not at the first batch.

Gradients: most methods need autograd, so the trainer must run with ``inference_mode=False`` (``evaluate.py``
sets it); the classifier's parameters are frozen (methods differentiate activations, not weights).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor, nn

from evaluation.class_sets import data_class_names, label_translation, model_num_classes
from evaluation.classifier import classifier_for
from evaluation.method_specs import CLASS_SETTINGS, IF_DEFINED, MethodsSpec, check_class_settings, method_specs
from methods import MethodUndefinedError, build_method
from methods.adapters import adapter_for
from methods.config_values import PlainDict
from models.concepts import load_concept_heads, resolve_concept
from models.sources import load_model


def token_layout(model: nn.Module, inputs: Tensor):
    """The layout of ``model``'s token scores for the (normalised) ``inputs``: what a callback needs to place the
    scores on the input (``.grid`` = ``(h, w)`` patches for images), from the model's adapter."""
    adapter = adapter_for(model)
    return adapter.inputs.layout(adapter.inputs.prepare(inputs))


def check_finite_relevance(method: str, setting: str, relevance: Tensor, sample_ids: Optional[Tensor]) -> None:
    """A ``ValueError`` naming the method, class setting and samples (dataset index) whose map holds NaN or Inf:
    a broken map would otherwise be ranked silently (NaN sorts arbitrarily)."""
    bad = ~torch.isfinite(relevance.detach().flatten(1)).all(dim=1)
    if bool(bad.any()):
        ids = (sample_ids[bad] if isinstance(sample_ids, Tensor) else bad.nonzero().flatten()).tolist()
        raise ValueError(f"method {method!r} ({setting} class) returned NaN or Inf scores for samples {ids} (dataset "
                         "index); nothing of this batch is scored. Check the method's options on this model (e.g. a "
                         "start_layer past its depth) or the samples; results of earlier batches are kept in the "
                         "run's progress files (evaluate.py --resume)")


def padded_index(start: int, stop: int, width: int) -> Tensor:
    """The positions ``start, ..., stop - 1`` followed by copies of ``stop - 1``, ``width`` in all."""
    index = torch.arange(start, stop)
    return torch.cat([index, index[-1:].expand(width - len(index))])


class AttributionEvaluationModule(pl.LightningModule):
    """Classifier + attribution methods; ``test_step`` returns raw maps per method and class setting.

    Args:
        classifier: ``"synthetic"``, a ``save_classifier`` file, ``"timm:<name>"`` or ``"hf:<name or folder>"``
            (``models.sources.load_model``).
        pretrained: for ``timm:`` classifiers.
        model_kwargs: extra ``timm.create_model`` arguments for ``timm:`` classifiers.
        methods: what to evaluate (``evaluation.method_specs.parse_methods``); default every registered method.
        method_options: options per *registered* method name, merged under the options given in ``methods``
            (e.g. ``{beyond_intuition_token: {start_layer: 2}}`` for a 4-block model with ``methods: null``).
        class_settings: settings always explained (the run adds the ones its callbacks declare).
        mean, std: normalisation override of an image classifier (default: the model's ``pretrained_cfg`` via
            timm's data config; ``evaluation.classifier.Classifier.from_model``).
        forward_batch_size: images per plain forward of the :class:`~evaluation.classifier.Classifier` (the
            callbacks' forwards of perturbed images).
        method_batch_size: images per method call (default: the whole batch). Every call runs at the loader's
            batch size or this, whichever is smaller: a short batch or chunk is padded with copies of its last
            sample (:meth:`_call_width`).
        concepts: concept files of this classifier (``ConceptHead.save``; ``train.py --concepts``). A method
            entry ``{name: {method: cdam, concept: <concept name>}}`` explains that concept (``<kind>:<name>``
            when several files hold the name); ``concept_methods: true`` adds ``cdam_concept_<name>`` for every
            concept of the files (``cdam_<kind>_concept_<name>`` with several files).
        allow_pickle: read classifier and concept files that need unpickling (``torch.load(weights_only=False)``,
            which runs code stored in the file): only for files you trust. Off by default.
        trust_remote_code: let a Hugging Face folder run its own Python (``auto_map``; ``models.sources``, "Remote
            code"): only for folders you trust. Off by default; ``model_kwargs`` may not set it.
        class_map: ``{data class name: model class name}`` where the model calls the data's classes otherwise or
            orders them differently (labels are translated to the model's indices); without it the model's class
            set (names, or count) must be the datamodule's (:mod:`evaluation.class_sets`).
        verbalizer: a causal LM's classes and their words, ``{class name: word}`` in class order (e.g. ``{NEG: "
            negative", POS: " positive"}``): class ``c``'s logit is the next-token logit of its word's token at each
            row's last real token (:meth:`evaluation.classifier.AnswerTokenClassifier.from_verbalizer`); the class
            names are compared with the data's. Default: the answer tokens that the LM's ``config.id2label`` names.
        verbalizer_multi_token: a verbalizer word of several tokens is an ``error`` (default) or stands for its
            ``first`` token.
    """

    def __init__(self, classifier: str = "synthetic", pretrained: bool = True,
                 model_kwargs: Optional[PlainDict] = None, methods: MethodsSpec = None,
                 method_options: Optional[Dict[str, PlainDict]] = None,
                 class_settings: Sequence[str] = ("predicted",), mean: Optional[Sequence[float]] = None,
                 std: Optional[Sequence[float]] = None, forward_batch_size: int = 64,
                 method_batch_size: Optional[int] = None,
                 concepts: Union[None, str, List[str]] = None, concept_methods: bool = False,
                 allow_pickle: bool = False, trust_remote_code: bool = False,
                 class_map: Optional[Dict[str, str]] = None, verbalizer: Optional[Dict[str, str]] = None,
                 verbalizer_multi_token: str = "error") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.class_settings = check_class_settings(class_settings)
        if forward_batch_size < 1 or (method_batch_size is not None and method_batch_size < 1):
            raise ValueError("forward_batch_size and method_batch_size must be >= 1")
        self.model = load_model(classifier, pretrained, model_kwargs, allow_pickle, trust_remote_code)
        self.model.requires_grad_(False)
        self.model.eval()
        self.concept_heads = load_concept_heads(concepts, allow_pickle=allow_pickle)
        self.method_specs = method_specs(methods, method_options, self.concept_heads, concept_methods)
        self.methods = self._build_methods(self.method_specs)
        self.classifier = classifier_for(self.model, forward_batch_size, mean=mean, std=std, verbalizer=verbalizer,
                                         verbalizer_multi_token=verbalizer_multi_token)
        if verbalizer is not None:
            tokens = self.classifier.answer_tokens()
            rank_zero_info("verbalizer (class -> token, vocabulary id): " + ", ".join(
                f"{name} -> {token!r} ({int(i)})" for name, token, i in
                zip(verbalizer, tokens, self.classifier.answer_ids.tolist())))
        self.class_map = dict(class_map) if class_map else None
        self.label_index: Optional[Tensor] = None

    # -------------------------------------------------------------------------------- set-up
    def _build_methods(self, specs: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
        adapter_for(self.model)  # every method runs on every supported family; TypeError names the families
        built = {}
        undefined = {}
        for name, options in specs.items():
            options = dict(options)
            registered = options.pop("method")
            if_defined = options.pop(IF_DEFINED, False)
            if isinstance(options.get("concept"), str):
                options["concept"] = resolve_concept(self.concept_heads, options["concept"], method=name)
                width = getattr(self.model, "num_features", None)
                if width is not None and options["concept"].numel() != width:
                    raise ValueError(f"method {name!r}: concept vector has {options['concept'].numel()} entries but "
                                     f"the classifier's latent has {width}: the concept file is of another model")
            built[name] = build_method(registered, **options)
            try:
                built[name].check(self.model)   # options against this model: at set-up, not the first batch
            except MethodUndefinedError as err:
                if not if_defined:
                    raise
                undefined[name] = str(err)       # selected by a set (null, all, a tag): left out, said below
                del built[name]
            except ValueError as err:
                raise ValueError(f"method {name!r}: {err}" if name != registered else str(err)) from None
        for name, reason in undefined.items():
            rank_zero_info(f"method {name!r} left out: it is not defined on this model ({reason})")
            del specs[name]
        if not built:
            raise ValueError(f"no attribution method to evaluate (asked for {list(specs)})")
        return built

    def data_config(self) -> Dict[str, Any]:
        """What the data must know of the model (the classifier's ``data_config``): for images timm's data config
        of the classifier (input size, interpolation, crop, mean/std); for texts ``{"tokenizer": the model's
        folder or name, "pad_token_id", "mask_token_id"}`` (the tokenizer saved with the model, when there is
        one)."""
        return self.classifier.data_config()

    def add_class_settings(self, settings: Sequence[str]) -> None:
        """Also explain ``settings`` (the union the run's evaluation callbacks declare, handed over by whoever
        builds the run before it starts)."""
        wanted = set(self.class_settings) | set(check_class_settings(settings))
        self.class_settings = tuple(s for s in CLASS_SETTINGS if s in wanted)

    def _settings_for(self, batch: Dict[str, Any]) -> List[str]:
        settings = [s for s in CLASS_SETTINGS if s in self.class_settings]
        if "other" in settings and "other_label" not in batch:
            settings.remove("other")  # a callback that needs it raises its own error naming the missing data
        return settings

    # -------------------------------------------------------------------------------- forward
    def forward(self, inputs: Any) -> Tensor:
        """Logits of [0, 1] images, or of a text batch (a mapping of token tensors)."""
        return self.classifier.forward(inputs)

    def model_inputs(self, batch: Dict[str, Any]) -> Union[Tensor, Dict[str, Tensor]]:
        """What the methods and the model read of a batch: normalised images, or the token tensors."""
        return self.classifier.model_inputs(batch)

    def _attribute(self, method, inputs: Union[Tensor, Dict[str, Tensor]], target: Optional[Tensor],
                   sample_ids: Optional[Tensor], width: Optional[int] = None,
                   model: Optional[torch.nn.Module] = None, embedding_offset: Optional[Tensor] = None) -> Tensor:
        """The method's maps of ``inputs``, ``method_batch_size`` samples per call (default: all), on ``model``
        (default: the module's). With ``width`` (:meth:`_call_width`) every call runs at exactly ``width``
        samples: a shorter chunk is padded with copies of its last sample, whose maps are dropped.
        ``embedding_offset`` ``[M, N, D]``: each chunk's rows of it go with the chunk into the method call, which
        adds them to the rows' input embeddings (:mod:`methods.adapters.embedding_offset`)."""
        model = self.model if model is None else model
        size = self.classifier.num_samples(inputs)
        step = width or self.hparams.method_batch_size or size
        parts = []
        for start in range(0, size, step):
            stop = min(start + step, size)
            index: Union[slice, Tensor] = slice(start, stop)
            if width is not None and stop - start < width:
                index = padded_index(start, stop, width)
            chunk = self.classifier.take(inputs, index)
            targets = None if target is None else self.classifier.method_targets(target[index])
            ids = None if sample_ids is None else sample_ids[index]
            offset = {} if embedding_offset is None else {"embedding_offset": embedding_offset[index]}
            parts.append(method(model, chunk, target=targets, sample_ids=ids, **offset)[:stop - start])
        return torch.cat(parts)

    def explain(self, method: str, inputs: Union[Tensor, Dict[str, Tensor]], target: Optional[Tensor],
                sample_ids: Optional[Tensor] = None, model: Optional[torch.nn.Module] = None,
                embedding_offset: Optional[Tensor] = None) -> Tensor:
        """The entry point of the tests that re-explain perturbed copies of a batch (``outputs["explain"]``; e.g.
        :class:`callbacks.robustness.RobustnessTest`): method ``method``'s maps of ``inputs`` (what
        :meth:`model_inputs` returns: normalised images, token tensors) for the classes ``target`` ``[M]`` (ignored
        by a class-agnostic method), at the test loop's call width (:meth:`_call_width`), with autograd on whatever
        the caller has; detached. ``model``: explain with another model of the same architecture instead of the
        module's (the randomised copies of :class:`callbacks.sanity.RandomisationTest`; default: the module's).
        ``embedding_offset`` ``[M, N, D]`` (token inputs only): the method explains the inputs whose input
        embeddings (the adapter's ``input_embedding()`` output) are shifted by it, every forward of the method
        included, the offset carried by the rows (:mod:`methods.adapters.embedding_offset`; the embedding-space
        perturbations of :class:`callbacks.robustness.RobustnessTest`). A method the run does not have is a
        ``KeyError`` naming those it has."""
        if method not in self.methods:
            raise KeyError(f"explain: no method {method!r} in this run; it has {sorted(self.methods)}")
        if embedding_offset is not None and not isinstance(inputs, dict):
            raise ValueError("explain: embedding_offset shifts token embeddings; these inputs are images (perturb "
                             "their pixels instead)")
        chosen = self.methods[method]
        with torch.enable_grad():
            maps = self._attribute(chosen, inputs, target if chosen.class_specific else None, sample_ids,
                                   self._call_width(), model, embedding_offset)
        return maps.detach()

    def _loader_batch_size(self) -> Optional[int]:
        """The test loader's batch size (``None`` outside a test loop or for a loader without one)."""
        loaders = self._trainer.test_dataloaders if self._trainer is not None else None
        batch_size = getattr(loaders, "batch_size", None)
        return batch_size if isinstance(batch_size, int) else None

    def _call_width(self) -> Optional[int]:
        """How many samples every method call of the test loop runs at: the test loader's batch size, or
        ``method_batch_size`` where that is smaller. A shorter batch (the last of each process, the batches of a
        resumed run) or chunk is padded up to it, and a short batch's clean forward to the loader's batch size
        (:meth:`test_step`). A float32 matrix product rounds a row differently for different numbers of rows
        (measured on the CPU, MKL: 1 to 3 rows against 4 or more; with 2 threads also 5 to 11), so unpadded a
        sample's logits, gradients and maps would depend on the size of the batch it falls in, which differs
        between one process and several (benchmarks/README.md, 2026-11-27)."""
        sizes = [n for n in (self.hparams.method_batch_size, self._loader_batch_size()) if n is not None]
        return min(sizes) if sizes else None

    def _attribute_settings(self, method, inputs: Union[Tensor, Dict[str, Tensor]], targets: Dict[str, Tensor],
                            sample_ids: Optional[Tensor], width: Optional[int] = None) -> Dict[str, Tensor]:
        """A class-specific method's maps for every class setting. A sample whose target in a later setting equals
        its target in the first one (``predicted`` and ``target`` of a correctly classified sample) reuses that
        map: only the samples whose targets differ are explained again, as a smaller batch of the same padded
        width (a method's map of a sample does not depend on the other samples of its batch: the contract tests;
        up to float rounding: that smaller batch is not padded to ``width``, :meth:`_call_width`)."""
        out: Dict[str, Tensor] = {}
        first_setting = None
        for setting, target in targets.items():
            if first_setting is None:
                first_setting = setting
                out[setting] = self._attribute(method, inputs, target, sample_ids, width)
                continue
            differ = target != targets[first_setting]
            if not bool(differ.any()):
                out[setting] = out[first_setting]
            elif bool(differ.all()):
                out[setting] = self._attribute(method, inputs, target, sample_ids, width)
            else:
                idx = differ.nonzero().flatten()
                sub = self.classifier.take(inputs, idx)
                part = self._attribute(method, sub, target[idx], None if sample_ids is None else sample_ids[idx])
                rel = out[first_setting].clone()
                rel[idx] = part.to(rel.dtype)
                out[setting] = rel
        return out

    # -------------------------------------------------------------------------------- test loop
    def setup(self, stage: str) -> None:
        """The model's class set against the datamodule's, before the first batch (:mod:`evaluation.class_sets`)."""
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        self.label_index = label_translation(self.classifier.class_names(), model_num_classes(self.model),
                                             data_class_names(datamodule), self.class_map, warn=rank_zero_warn)

    def on_test_start(self) -> None:
        if torch.is_inference_mode_enabled():
            raise RuntimeError("attribution methods need autograd: build the Trainer with inference_mode=False "
                               "(evaluate.py does; --trainer.inference_mode false)")

    def test_step(self, batch: Dict[str, Any], batch_idx: int) -> Dict[str, Any]:
        if "label" not in batch:
            raise KeyError(f"evaluation batches need 'label'; got keys {sorted(batch)}")
        if self.label_index is not None:   # class_map: the labels in the model's indices, for the callbacks too
            index = self.label_index.to(batch["label"].device)
            batch.update({k: index[batch[k]] for k in ("label", "other_label") if k in batch})
        labels = batch["label"]
        inputs = self.model_inputs(batch)   # NaN or Inf pixels: ValueError naming the samples
        size, full = self.classifier.num_samples(inputs), self._loader_batch_size()
        padded = inputs if full is None or full <= size else self.classifier.take(inputs, padded_index(0, size, full))
        with torch.no_grad():   # a short batch padded to the loader's batch size (:meth:`_call_width`)
            logits = self.classifier.model_logits(padded)[:size]
        width = self._call_width()
        num_classes = logits.shape[-1]
        bad = (labels < 0) | (labels >= num_classes)
        if bool(bad.any()):
            where = batch["index"][bad].tolist() if isinstance(batch.get("index"), Tensor) else bad.nonzero().tolist()
            raise ValueError(f"labels {labels[bad].tolist()} (samples {where}) lie outside the classifier's "
                             f"{num_classes} classes: the data and the model do not match")
        targets = {"predicted": logits.argmax(dim=-1), "target": labels}
        settings = self._settings_for(batch)
        if "other" in settings:
            targets["other"] = batch["other_label"]
        targets = {s: targets[s] for s in settings}
        sample_ids = batch.get("index")
        relevance: Dict[str, Dict[str, Tensor]] = {}
        with torch.enable_grad():
            for name, method in self.methods.items():
                self.explaining = name   # what callbacks.run_clock.RunClock's progress lines name
                if not method.class_specific:
                    shared = self._attribute(method, inputs, None, sample_ids, width)
                    relevance[name] = {s: shared for s in settings}
                else:
                    relevance[name] = self._attribute_settings(method, inputs, targets, sample_ids, width)
                for setting, rel in relevance[name].items():
                    check_finite_relevance(name, setting, rel, sample_ids)
        self.explaining = None
        return {"relevance": relevance, "targets": targets, "logits": logits,
                "class_specific": {name: bool(method.class_specific) for name, method in self.methods.items()},
                "layout": token_layout(self.model, inputs), "classifier": self.classifier, "explain": self.explain,
                "model": self.model}

    def configure_optimizers(self):  # evaluation only
        return None
