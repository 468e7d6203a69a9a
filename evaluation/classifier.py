"""The one way the evaluation protocols classify (perturbed) inputs: :class:`Classifier` (images) and
:class:`TextClassifier` (token sequences).

The evaluation module builds one from its model (:func:`classifier_for`: the class of the model's modality, its
adapter's ``modality``) and hands it to the callbacks in every ``test_step`` output (``outputs["classifier"]``);
a callback never calls the module itself. Both have the same three calls on the inputs their perturbers produce,
``logits``, ``predict`` and ``probabilities`` (``batch_size`` inputs per forward; gradients never recorded).
They also answer, for the evaluation module, what differs between the modalities: ``data_config()`` (what the
data must know of the model), ``model_inputs(batch)`` (what the model and the methods read of a batch),
``forward(inputs)`` (logits with autograd), ``num_samples(inputs)`` and ``take(inputs, index)`` (a part of the
samples).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

from methods.adapters import adapter_for
from methods.adapters.hf_decoder import last_real_positions, positions_from_mask
from models.sources import load_tokenizer

from .class_sets import GENERIC_NAME, model_class_names

#: the token tensors a Hugging Face sequence classifier's ``forward`` takes (others in a batch are ignored)
MODEL_TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def model_logits(model: nn.Module, inputs: Any) -> Tensor:
    """The logits ``[M, C]`` of ``model`` on ``inputs``: an image tensor, or a mapping of token tensors for a
    Hugging Face classifier (its ``forward(**inputs).logits``; keys outside :data:`MODEL_TEXT_KEYS` dropped)."""
    if isinstance(inputs, Mapping):
        out = model(**{k: inputs[k] for k in MODEL_TEXT_KEYS if inputs.get(k) is not None})
    else:
        out = model(inputs)
    return out.logits if hasattr(out, "logits") else out


class _ChunkedClassifier:
    """``logits`` / ``predict`` / ``probabilities`` from a subclass's ``_chunks`` and ``forward``."""

    batch_size: int = 64

    def _chunks(self, inputs: Any, step: int):
        raise NotImplementedError

    def forward(self, inputs: Any) -> Tensor:
        """The model's logits ``[M, C]`` of ``inputs`` in one forward (autograd as the caller has it)."""
        raise NotImplementedError

    def model_logits(self, inputs: Any) -> Tensor:
        """The logits ``[M, C]`` of what :meth:`model_inputs` returns (already normalised images, token tensors),
        in one forward: the clean logits of the evaluation module."""
        return model_logits(self.model, inputs)

    def method_targets(self, classes: Tensor) -> Tensor:
        """What a method's ``target`` is for the classes ``classes`` ``[M]``: the class indices themselves (an
        :class:`AnswerTokenClassifier`: the answer tokens' vocabulary ids)."""
        return classes

    @torch.no_grad()
    def logits(self, inputs: Any, batch_size: Optional[int] = None) -> Tensor:
        """Logits ``[M, C]`` of ``inputs`` (``batch_size`` per forward)."""
        step = int(batch_size or self.batch_size)
        parts = [self.forward(chunk) for chunk in self._chunks(inputs, step)]
        if not parts:
            raise ValueError("no inputs to classify")
        return torch.cat(parts)

    def predict(self, inputs: Any, batch_size: Optional[int] = None) -> Tensor:
        """Predicted classes ``[M]``."""
        return self.logits(inputs, batch_size).argmax(dim=-1)

    def probabilities(self, inputs: Any, batch_size: Optional[int] = None) -> Tensor:
        """Class probabilities ``[M, C]`` (softmax of the logits, float64)."""
        return torch.softmax(self.logits(inputs, batch_size).double(), dim=-1)


class Classifier(_ChunkedClassifier):
    """A frozen image classifier: normalisation with the model's ``mean`` / ``std`` and forwards in chunks.

    Inputs are [0, 1] images ``[M, 3, H, W]`` (the pixel perturbers' output).

    Args:
        model: the classifier (its logits ``[N, C]``).
        mean, std: per-channel normalisation of [0, 1] images (the model's own).
        batch_size: images per forward unless a call says otherwise.
    """

    modality = "image"

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float], batch_size: int = 64) -> None:
        mean = tuple(float(v) for v in mean)
        std = tuple(float(v) for v in std)
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean and std must have 3 entries (std > 0), got mean={mean} std={std}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.mean, self.std = mean, std
        self.batch_size = int(batch_size)
        self._mean = torch.tensor(mean).view(1, 3, 1, 1)
        self._std = torch.tensor(std).view(1, 3, 1, 1)

    @classmethod
    def from_model(cls, model: nn.Module, batch_size: int = 64, mean: Optional[Sequence[float]] = None,
                   std: Optional[Sequence[float]] = None, **_other_modalities) -> "Classifier":
        """The classifier of ``model`` normalising with ``mean`` / ``std``, by default the model's own
        (:meth:`data_config`)."""
        cfg = cls.data_config_of(model)
        return cls(model, cfg["mean"] if mean is None else mean, cfg["std"] if std is None else std, batch_size)

    @staticmethod
    def data_config_of(model: nn.Module) -> Dict[str, Any]:
        from timm.data import resolve_data_config

        return resolve_data_config({}, model=model)

    def data_config(self) -> Dict[str, Any]:
        """timm's data config of the model (input size, interpolation, crop, mean/std: its ``pretrained_cfg``)."""
        return self.data_config_of(self.model)

    def normalize(self, images: Tensor) -> Tensor:
        """[0, 1] images -> the model's input (``(x - mean) / std``)."""
        return (images - self._mean.to(images)) / self._std.to(images)

    def model_inputs(self, batch: Mapping[str, Any]) -> Tensor:
        """The normalised ``batch["image"]``; ``ValueError`` naming the samples (``batch["index"]``) that hold
        NaN or Inf."""
        if "image" not in batch:
            raise KeyError(f"evaluation batches of an image classifier need 'image'; got keys {sorted(batch)}")
        inputs = self.normalize(batch["image"])
        if not bool(torch.isfinite(inputs).all()):
            bad = ~torch.isfinite(inputs.flatten(1)).all(dim=1)
            ids = batch["index"][bad] if isinstance(batch.get("index"), Tensor) else bad.nonzero().flatten()
            many = len(ids) > 1
            raise ValueError(f"sample{'s' if many else ''} {', '.join(str(int(i)) for i in ids)} (dataset index) "
                             f"{'hold' if many else 'holds'} NaN or Inf pixel values: a corrupt or wrongly decoded "
                             "image; fix or remove it (evaluate.py --resume continues a run after the fix)")
        return inputs

    @staticmethod
    def num_samples(images: Tensor) -> int:
        return int(images.shape[0])

    @staticmethod
    def take(images: Tensor, index) -> Tensor:
        """The samples ``index`` (a slice or indices) of ``images``."""
        return images[index]

    def _chunks(self, images: Tensor, step: int):
        return images.split(step)

    def forward(self, images: Tensor) -> Tensor:
        """Logits of [0, 1] images."""
        return model_logits(self.model, self.normalize(images))

    def predict(self, images: Tensor, batch_size: Optional[int] = None) -> Tensor:
        if images.shape[0] == 0:
            return torch.empty(0, dtype=torch.long, device=images.device)
        return super().predict(images, batch_size)

    def __repr__(self) -> str:
        return (f"Classifier({type(self.model).__name__}, mean={self.mean}, std={self.std}, "
                f"batch_size={self.batch_size})")


class TextClassifier(_ChunkedClassifier):
    """A frozen Hugging Face sequence classifier on token batches, in chunks.

    Inputs are mappings of ``[M, N]`` tensors as a tokenizer (or a token perturber) gives them: ``input_ids``,
    ``attention_mask``, optional ``token_type_ids``; other keys are ignored. Each chunk is cut to its longest real
    sequence (trailing columns that are padding in every row are dropped; with the additive attention mask they
    do not change the logits, and dropping them saves the forward over them).

    Args:
        model: a ``transformers`` ``*ForSequenceClassification`` (``forward(...).logits``).
        pad_token_id: the id a removed token gets under the ``pad`` convention (the tokenizer's).
        mask_token_id: the ``[MASK]`` id (the ``mask`` convention); ``None`` if the tokenizer has none.
        batch_size: sequences per forward unless a call says otherwise.
        tokenizer: the folder or name of the tokenizer saved with the model, if any (:meth:`data_config`).
    """

    modality = "text"

    def __init__(self, model: nn.Module, pad_token_id: int, mask_token_id: Optional[int] = None,
                 batch_size: int = 64, tokenizer: Optional[str] = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.pad_token_id = int(pad_token_id)
        self.mask_token_id = None if mask_token_id is None else int(mask_token_id)
        self.batch_size = int(batch_size)
        self.tokenizer = tokenizer

    @classmethod
    def from_model(cls, model: nn.Module, batch_size: int = 64, **_other_modalities) -> "TextClassifier":
        """The classifier of ``model`` with the pad and mask ids of the tokenizer saved with it
        (``models.sources.load_tokenizer(model.name_or_path)``; a model saved without one: the model config's pad
        id, or 0, and no mask id; the datamodule names the tokenizer)."""
        source = getattr(model, "name_or_path", None) or None
        tokenizer = None
        if source:
            try:
                tokenizer = load_tokenizer(source)
            except (FileNotFoundError, ValueError):
                tokenizer = None
        pad = getattr(tokenizer, "pad_token_id", None)
        if pad is None:
            pad = getattr(model.config, "pad_token_id", None)
        return cls(model, 0 if pad is None else int(pad), getattr(tokenizer, "mask_token_id", None), batch_size,
                   tokenizer=source if tokenizer is not None else None)

    def data_config(self) -> Dict[str, Any]:
        """``{"tokenizer": the model's folder or name (None: saved without one), "pad_token_id",
        "mask_token_id"}``."""
        return {"tokenizer": self.tokenizer, "pad_token_id": self.pad_token_id, "mask_token_id": self.mask_token_id}

    def model_inputs(self, batch: Mapping[str, Any]) -> Dict[str, Tensor]:
        """The model's token tensors of ``batch`` and its ``special_tokens_mask`` (the adapter's content
        positions), if any."""
        inputs = self.inputs_of(batch)
        if isinstance(batch.get("special_tokens_mask"), Tensor):
            inputs["special_tokens_mask"] = batch["special_tokens_mask"]
        return inputs

    @staticmethod
    def num_samples(inputs: Mapping[str, Tensor]) -> int:
        return len(next(iter(inputs.values())))

    @staticmethod
    def take(inputs: Mapping[str, Tensor], index) -> Dict[str, Tensor]:
        """The samples ``index`` (a slice or indices) of every tensor of ``inputs``."""
        return {k: v[index] for k, v in inputs.items()}

    @staticmethod
    def inputs_of(batch: Mapping[str, Any]) -> Dict[str, Tensor]:
        """The model's token tensors of ``batch`` (``input_ids`` required)."""
        if "input_ids" not in batch:
            raise KeyError(f"text classification needs batch['input_ids'] [B, N]; got keys {sorted(batch)}")
        return {k: batch[k] for k in MODEL_TEXT_KEYS if isinstance(batch.get(k), Tensor)}

    def _chunks(self, inputs: Mapping[str, Any], step: int):
        tensors = self.inputs_of(inputs)
        ids = tensors["input_ids"]
        mask = tensors.get("attention_mask")
        for start in range(0, ids.shape[0], step):
            chunk = {k: v[start:start + step] for k, v in tensors.items()}
            if mask is not None:
                real = chunk["attention_mask"].any(dim=0).nonzero()
                width = int(real.max()) + 1 if real.numel() else 1
                chunk = {k: v[:, :width] for k, v in chunk.items()}
            yield chunk

    def forward(self, inputs: Mapping[str, Tensor]) -> Tensor:
        return model_logits(self.model, inputs)

    def __repr__(self) -> str:
        return (f"TextClassifier({type(self.model).__name__}, pad_token_id={self.pad_token_id}, "
                f"mask_token_id={self.mask_token_id}, batch_size={self.batch_size})")


class AnswerTokenClassifier(TextClassifier):
    """A frozen decoder language model (``*ForCausalLM``) as a classifier over a set of **answer tokens**: the
    logits of class ``c`` are the model's next-token logit of the token ``answer_ids[c]`` at each row's last real
    token (the decoder adapters' read-out; left or right padding, position ids ``attention_mask.cumsum(-1) - 1``
    as ``generate()`` and the adapters give them, so a token removed by the ``pad`` convention moves the later
    tokens' positions as a deletion does).

    The classes are the tokens the model's ``config.id2label`` names, in class order (an LM exported by
    ``lightning_modules.answer_lm.AnswerLMModule``; the evaluation compares them with the datamodule's classes as
    for any classifier). The clean prediction, the perturbation tests' predictions and ERASER's probabilities are
    taken among these tokens (softmax over them); a method explains the vocabulary logit of the class's token
    (:meth:`method_targets`: class index -> token id).

    Args:
        model: a ``transformers`` causal LM (``forward(...).logits`` ``[M, N, V]``).
        answer_ids: the vocabulary id of each class's token ``[C]``.
        pad_token_id, mask_token_id, batch_size, tokenizer: as :class:`TextClassifier`.
    """

    def __init__(self, model: nn.Module, answer_ids: Sequence[int], pad_token_id: int,
                 mask_token_id: Optional[int] = None, batch_size: int = 64, tokenizer: Optional[str] = None) -> None:
        super().__init__(model, pad_token_id, mask_token_id, batch_size, tokenizer)
        ids = [int(i) for i in answer_ids]
        vocab = int(model.get_output_embeddings().weight.shape[0])
        if len(ids) < 2 or len(set(ids)) != len(ids) or not all(0 <= i < vocab for i in ids):
            raise ValueError(f"answer_ids must be at least 2 distinct vocabulary ids in [0, {vocab}), got {ids}")
        self.answer_ids = torch.tensor(ids, dtype=torch.long)

    @classmethod
    def from_model(cls, model: nn.Module, batch_size: int = 64, **_other_modalities) -> "AnswerTokenClassifier":
        """The classifier over the answer tokens that ``model.config.id2label`` names, looked up in the tokenizer
        saved with the model; an error when the config names none (generic ``LABEL_<i>``) or the tokenizer lacks
        one."""
        text = TextClassifier.from_model(model, batch_size)
        names = model_class_names(model) or []
        if len(names) < 2 or any(GENERIC_NAME.fullmatch(n) for n in names):
            raise ValueError(f"{type(model).__name__} is a language model: it is evaluated as a classifier over its "
                             "answer tokens, which its config.id2label must name in class order (as "
                             f"lightning_modules.answer_lm.AnswerLMModule exports them); got {names}")
        if text.tokenizer is None:
            raise ValueError(f"the language model at {getattr(model, 'name_or_path', None)!r} was saved without "
                             "its tokenizer: its answer tokens cannot be looked up")
        vocab = load_tokenizer(text.tokenizer).get_vocab()
        missing = [n for n in names if n not in vocab]
        if missing:
            raise ValueError(f"the answer tokens {missing[:5]} (config.id2label) are not tokens of the model's "
                             "tokenizer")
        return cls(model, [vocab[n] for n in names], text.pad_token_id, text.mask_token_id, batch_size,
                   tokenizer=text.tokenizer)

    def forward(self, inputs: Mapping[str, Tensor]) -> Tensor:
        ids = inputs["input_ids"]
        mask = inputs.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else mask
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask))
        rows = torch.arange(ids.shape[0], device=ids.device)
        return out.logits[rows, last_real_positions(mask)][:, self.answer_ids.to(ids.device)]

    def model_logits(self, inputs: Mapping[str, Tensor]) -> Tensor:
        return self.forward(inputs)

    def method_targets(self, classes: Tensor) -> Tensor:
        return self.answer_ids.to(classes.device)[classes]

    def __repr__(self) -> str:
        return (f"AnswerTokenClassifier({type(self.model).__name__}, {len(self.answer_ids)} answer tokens, "
                f"pad_token_id={self.pad_token_id}, batch_size={self.batch_size})")


#: the classifier of each modality an adapter declares (``ModelAdapter.modality``)
CLASSIFIERS = {cls.modality: cls for cls in (Classifier, TextClassifier)}


def classifier_for(model: nn.Module, batch_size: int = 64, **options) -> _ChunkedClassifier:
    """The classifier of ``model``'s modality, built from the model (``from_model``; ``mean`` / ``std``: the
    normalisation of an image classifier, ignored for texts); a decoder language model (its adapter's ``is_lm``)
    is an :class:`AnswerTokenClassifier`."""
    adapter = adapter_for(model)
    if getattr(adapter, "is_lm", False):
        return AnswerTokenClassifier.from_model(model, batch_size, **options)
    return CLASSIFIERS[adapter.modality].from_model(model, batch_size, **options)
