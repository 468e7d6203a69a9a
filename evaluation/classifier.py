"""The one way the evaluation protocols classify (perturbed) inputs: :class:`Classifier` (images) and
:class:`TextClassifier` (token sequences).

The evaluation module builds one from its model and hands it to the callbacks in every ``test_step`` output
(``outputs["classifier"]``); a callback never calls the module itself. Both have the same three calls, on the
inputs their perturbers produce:

* ``logits(inputs, batch_size=None)`` -> ``[M, C]``;
* ``predict(inputs, batch_size=None)`` -> predicted classes ``[M]``;
* ``probabilities(inputs, batch_size=None)`` -> softmax ``[M, C]`` (ERASER's faithfulness scores).

``batch_size`` inputs per forward (default: the classifier's ``batch_size``); gradients are never recorded.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

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
    """``logits`` / ``predict`` / ``probabilities`` from a subclass's ``_chunks`` and ``_forward``."""

    batch_size: int = 64

    def _chunks(self, inputs: Any, step: int):
        raise NotImplementedError

    def _forward(self, chunk: Any) -> Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def logits(self, inputs: Any, batch_size: Optional[int] = None) -> Tensor:
        """Logits ``[M, C]`` of ``inputs`` (``batch_size`` per forward)."""
        step = int(batch_size or self.batch_size)
        parts = [self._forward(chunk) for chunk in self._chunks(inputs, step)]
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

    def normalize(self, images: Tensor) -> Tensor:
        """[0, 1] images -> the model's input (``(x - mean) / std``)."""
        return (images - self._mean.to(images)) / self._std.to(images)

    def _chunks(self, images: Tensor, step: int):
        return images.split(step)

    def _forward(self, chunk: Tensor) -> Tensor:
        return model_logits(self.model, self.normalize(chunk))

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
    """

    modality = "text"

    def __init__(self, model: nn.Module, pad_token_id: int, mask_token_id: Optional[int] = None,
                 batch_size: int = 64) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.pad_token_id = int(pad_token_id)
        self.mask_token_id = None if mask_token_id is None else int(mask_token_id)
        self.batch_size = int(batch_size)

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

    def _forward(self, chunk: Mapping[str, Tensor]) -> Tensor:
        return model_logits(self.model, chunk)

    def __repr__(self) -> str:
        return (f"TextClassifier({type(self.model).__name__}, pad_token_id={self.pad_token_id}, "
                f"mask_token_id={self.mask_token_id}, batch_size={self.batch_size})")
