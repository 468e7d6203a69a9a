"""The one way the evaluation protocols classify (perturbed) inputs: :class:`Classifier` (images) and
:class:`TextClassifier` (token sequences).

The evaluation module builds one from its model (:func:`classifier_for`: the class of the model's modality, its
adapter's ``layout_class.modality``) and hands it to the callbacks in every ``test_step`` output
(``outputs["classifier"]``); a callback never calls the module itself. Both have the same three calls on the inputs
their perturbers produce, ``logits``, ``predict`` and ``probabilities`` (``batch_size`` inputs per forward;
gradients never recorded). They also answer, for the evaluation module, what differs between the modalities:
``data_config()`` (what the data must know of the model), ``model_inputs(batch)`` (what the model and the methods
read of a batch), ``forward(inputs)`` (logits with autograd), ``num_samples(inputs)`` and ``take(inputs, index)`` (a
part of the samples).
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from methods.adapters import adapter_for
from methods.adapters.tokens import last_real_positions, positions_from_mask
from models.sources import load_tokenizer

from .class_sets import GENERIC_NAME, model_class_names

#: the token tensors a Hugging Face sequence classifier's ``forward`` takes (others in a batch are ignored)
MODEL_TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids")
#: the batch key of a prompted text batch marking the template's tokens (``datamodules.prompts``)
TEMPLATE_MASK = "template_mask"
#: what a verbalizer word of several tokens does (:meth:`AnswerTokenClassifier.from_verbalizer`)
MULTI_TOKEN_POLICIES = ("error", "first")


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

    def class_names(self) -> Optional[List[str]]:
        """The classifier's class names in index order (the model's: ``evaluation.class_sets.model_class_names``),
        or ``None`` when it names none."""
        return model_class_names(self.model)

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


def align_last_real_token(input_ids: Tensor, attention_mask: Tensor) -> Tuple[Tensor, Tensor]:
    """``input_ids`` and ``attention_mask`` ``[M, N]`` with each row rolled to the right so that its last real
    token lies in the last column (right padding becomes left padding; masked holes inside a row stay where they
    are among its tokens). With the position ids of the mask (``positions_from_mask``), a causal LM gives each row's
    logits unchanged."""
    n = input_ids.shape[1]
    shift = (n - 1) - last_real_positions(attention_mask)
    if not bool(shift.any()):
        return input_ids, attention_mask
    index = (torch.arange(n, device=input_ids.device)[None, :] - shift[:, None]) % n
    return input_ids.gather(1, index), attention_mask.gather(1, index)


def _takes_logits_to_keep(model: nn.Module) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):   # pragma: no cover - a forward without a signature
        return False


class AnswerTokenClassifier(TextClassifier):
    """A frozen decoder language model (``*ForCausalLM``) as a classifier over a set of **answer tokens**: the
    logits of class ``c`` are the model's next-token logit of the token ``answer_ids[c]`` at each row's last real
    token (the decoder adapters' read-out; left or right padding, position ids ``attention_mask.cumsum(-1) - 1``
    as ``generate()`` and the adapters give them, so a token removed by the ``pad`` convention moves the later
    tokens' positions as a deletion does).

    The classes, in class order, are either the tokens the model's ``config.id2label`` names (an LM exported by
    ``lightning_modules.answer_lm.AnswerLMModule``: :meth:`from_model`) or a **verbalizer**, ``{class name:
    word}`` (prompted classification of real text, e.g. ``{NEG: " negative", POS: " positive"}`` after a prompt
    ``"Review: {text}\\nSentiment:"``: :meth:`from_verbalizer`); the evaluation compares the class names with the
    datamodule's classes as for any classifier. The clean prediction, the perturbation tests' predictions and
    ERASER's probabilities are taken among these tokens (softmax over them); a method explains the vocabulary
    logit of the class's token (:meth:`method_targets`: class index -> token id), the gold class's or the
    predicted one's as the class setting says.

    Forward: each chunk is rolled so that every row's last real token lies in the last column
    (:func:`align_last_real_token`) and the model computes the vocabulary logits of that column only
    (``logits_to_keep=1``, where the model's ``forward`` takes it): memory ``[M, vocab]`` instead of
    ``[M, N, vocab]``, the model's own logits (a final soft-capping included).

    Prompted batches (they carry ``template_mask``): every row's last real token must be a template token (the
    answer cue), else :meth:`model_inputs` raises (e.g. a tokenizer that appends an EOS after the prompt).

    Args:
        model: a ``transformers`` causal LM (``forward(...).logits`` ``[M, N, V]``).
        answer_ids: the vocabulary id of each class's token ``[C]``.
        pad_token_id, mask_token_id, batch_size, tokenizer: as :class:`TextClassifier`.
        class_names: the classes' names in index order (default: the model's ``config.id2label``).
    """

    def __init__(self, model: nn.Module, answer_ids: Sequence[int], pad_token_id: int,
                 mask_token_id: Optional[int] = None, batch_size: int = 64, tokenizer: Optional[str] = None,
                 class_names: Optional[Sequence[str]] = None) -> None:
        super().__init__(model, pad_token_id, mask_token_id, batch_size, tokenizer)
        ids = [int(i) for i in answer_ids]
        vocab = int(model.get_output_embeddings().weight.shape[0])
        if len(ids) < 2 or len(set(ids)) != len(ids) or not all(0 <= i < vocab for i in ids):
            raise ValueError(f"answer_ids must be at least 2 distinct vocabulary ids in [0, {vocab}), got {ids}")
        if class_names is not None and len(class_names) != len(ids):
            raise ValueError(f"{len(class_names)} class names for {len(ids)} answer tokens")
        self.answer_ids = torch.tensor(ids, dtype=torch.long)
        self._class_names = None if class_names is None else [str(n) for n in class_names]
        self._logits_to_keep = _takes_logits_to_keep(model)

    @classmethod
    def from_model(cls, model: nn.Module, batch_size: int = 64, verbalizer: Optional[Mapping[str, str]] = None,
                   verbalizer_multi_token: str = "error", **_other_modalities) -> "AnswerTokenClassifier":
        """The classifier over the answer tokens that ``model.config.id2label`` names, looked up in the tokenizer
        saved with the model; an error when the config names none (generic ``LABEL_<i>``) or the tokenizer lacks
        one. With a ``verbalizer``: :meth:`from_verbalizer`."""
        if verbalizer is not None:
            return cls.from_verbalizer(model, verbalizer, batch_size, verbalizer_multi_token)
        text = TextClassifier.from_model(model, batch_size)
        names = model_class_names(model) or []
        if len(names) < 2 or any(GENERIC_NAME.fullmatch(n) for n in names):
            raise ValueError(f"{type(model).__name__} is a language model: it is evaluated as a classifier over its "
                             "answer tokens, which a verbalizer names (--model.verbalizer '{<class>: <word>, ...}', "
                             "e.g. '{NEG: \" negative\", POS: \" positive\"}' with a prompt template in the data) "
                             "or its config.id2label in class order (as "
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

    @classmethod
    def from_verbalizer(cls, model: nn.Module, verbalizer: Mapping[str, str], batch_size: int = 64,
                        multi_token: str = "error") -> "AnswerTokenClassifier":
        """The classifier whose classes are the keys of ``verbalizer`` ``{class name: word}`` (in its order) and
        whose class ``c``'s token is its word, tokenized alone by the tokenizer saved with the model (no special
        tokens added; it continues the prompt's answer cue, so write the space a byte-level BPE such as GPT-2's,
        Llama 3's or Qwen's puts before a word: ``" positive"``). A word of several tokens is an error
        (``multi_token="error"``, default) or stands for its first token (``multi_token="first"``: the class's
        logit is the first token's, the usual single-step approximation); two classes with the same token are an
        error."""
        if multi_token not in MULTI_TOKEN_POLICIES:
            raise ValueError(f"verbalizer_multi_token must be one of {MULTI_TOKEN_POLICIES}, got {multi_token!r}")
        if not isinstance(verbalizer, Mapping) or len(verbalizer) < 2:
            raise ValueError(f"a verbalizer maps at least 2 class names to their words ({{class: word}}), got "
                             f"{verbalizer!r}")
        text = TextClassifier.from_model(model, batch_size)
        if text.tokenizer is None:
            raise ValueError(f"the language model at {getattr(model, 'name_or_path', None)!r} was saved without "
                             "its tokenizer: its verbalizer words cannot be tokenized")
        tokenizer = load_tokenizer(text.tokenizer)
        ids: List[int] = []
        for name, word in verbalizer.items():
            if not isinstance(word, str) or not word:
                raise ValueError(f"verbalizer: the word of class {name!r} must be a non-empty string, got {word!r}")
            pieces = list(tokenizer(word, add_special_tokens=False)["input_ids"])
            if not pieces:
                raise ValueError(f"verbalizer: the word {word!r} of class {name!r} has no token in the model's "
                                 "tokenizer")
            if len(pieces) > 1 and multi_token == "error":
                raise ValueError(f"verbalizer: the word {word!r} of class {name!r} is {len(pieces)} tokens "
                                 f"{tokenizer.convert_ids_to_tokens(pieces)} of the model's tokenizer, but a class is "
                                 "one next token: choose a word of one token (a byte-level BPE usually needs its "
                                 "leading space, ' positive'), or let its first token stand for it "
                                 "(--model.verbalizer_multi_token first)")
            ids.append(int(pieces[0]))
        seen: Dict[int, str] = {}
        for name, token in zip(verbalizer, ids):
            if token in seen:
                raise ValueError(f"verbalizer: classes {seen[token]!r} and {name!r} have the same token "
                                 f"{tokenizer.convert_ids_to_tokens(token)!r}; each class needs its own token")
            seen[token] = str(name)
        return cls(model, ids, text.pad_token_id, text.mask_token_id, batch_size, tokenizer=text.tokenizer,
                   class_names=[str(n) for n in verbalizer])

    def class_names(self) -> Optional[List[str]]:
        if self._class_names is not None:
            return list(self._class_names)
        return super().class_names()

    def answer_tokens(self) -> List[str]:
        """The tokens of the classes as text (the tokenizer saved with the model; the ids when there is none)."""
        ids = self.answer_ids.tolist()
        if self.tokenizer is None:
            return [str(i) for i in ids]
        return list(load_tokenizer(self.tokenizer).convert_ids_to_tokens(ids))

    def model_inputs(self, batch: Mapping[str, Any]) -> Dict[str, Tensor]:
        """As :meth:`TextClassifier.model_inputs`; a prompted batch (``template_mask``) must end every row at its
        template's answer cue (``ValueError`` naming the samples otherwise)."""
        inputs = super().model_inputs(batch)
        template = batch.get(TEMPLATE_MASK)
        if isinstance(template, Tensor):
            mask = inputs.get("attention_mask")
            mask = torch.ones_like(inputs["input_ids"]) if mask is None else mask
            rows = torch.arange(mask.shape[0], device=mask.device)
            bad = template[rows, last_real_positions(mask)] == 0
            if bool(bad.any()):
                ids = batch["index"][bad] if isinstance(batch.get("index"), Tensor) else bad.nonzero().flatten()
                raise ValueError(f"samples {ids.tolist()} (dataset index) do not end with the prompt template's "
                                 "answer cue: a language model is read out at each row's last real token, which "
                                 "here is not the template's (does the tokenizer append a special token, an EOS, "
                                 "after the prompt? use one that does not)")
        return inputs

    def forward(self, inputs: Mapping[str, Tensor]) -> Tensor:
        ids = inputs["input_ids"]
        mask = inputs.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else mask
        ids, mask = align_last_real_token(ids, mask)
        keep = {"logits_to_keep": 1} if self._logits_to_keep else {}
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask), **keep)
        return out.logits[:, -1][:, self.answer_ids.to(ids.device)]

    def model_logits(self, inputs: Mapping[str, Tensor]) -> Tensor:
        return self.forward(inputs)

    def method_targets(self, classes: Tensor) -> Tensor:
        return self.answer_ids.to(classes.device)[classes]

    def __repr__(self) -> str:
        return (f"AnswerTokenClassifier({type(self.model).__name__}, {len(self.answer_ids)} answer tokens, "
                f"pad_token_id={self.pad_token_id}, batch_size={self.batch_size})")


#: the classifier of each modality an adapter declares (``adapter.inputs.layout_class.modality``)
CLASSIFIERS = {cls.modality: cls for cls in (Classifier, TextClassifier)}


def classifier_for(model: nn.Module, batch_size: int = 64, verbalizer: Optional[Mapping[str, str]] = None,
                   verbalizer_multi_token: str = "error", **options) -> _ChunkedClassifier:
    """The classifier of ``model``'s modality, built from the model (``from_model``; ``mean`` / ``std``: the
    normalisation of an image classifier, ignored for texts); a decoder language model (its adapter's ``decoder.is_lm``)
    is an :class:`AnswerTokenClassifier` (over the ``verbalizer``'s words when one is given, which only a language
    model takes)."""
    adapter = adapter_for(model)
    if adapter.decoder is not None and adapter.decoder.is_lm:
        return AnswerTokenClassifier.from_model(model, batch_size, verbalizer=verbalizer,
                                                verbalizer_multi_token=verbalizer_multi_token, **options)
    if verbalizer is not None:
        raise ValueError(f"a verbalizer names the answer tokens of a causal language model (*ForCausalLM); "
                         f"{type(model).__name__} is a classifier with its own classes: leave model.verbalizer unset")
    return CLASSIFIERS[adapter.inputs.layout_class.modality].from_model(model, batch_size, **options)
