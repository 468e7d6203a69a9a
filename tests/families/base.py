"""What the conformance matrix (``tests/test_method_contract.py``) needs of a model family: :class:`Family`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import torch
from torch import Tensor, nn

#: the methods whose output on images is a pixel map [B, H, W] (every other method: patch scores [B, P])
PIXEL_MAPS = ("lrp",)


@dataclass
class Family:
    """A model factory and how to batch and split its inputs.

    ``inputs(batch)``: a batch as a user passes it (a tensor or a mapping); ``single(inputs, i)``: sample ``i``
    alone, without padding; ``positions(inputs, i)``: the output positions of sample ``i`` inside the batched
    output row (``slice(None)`` without padding); ``padding(inputs)``: a bool ``[B, N]`` mask of padded output
    positions, or ``None``; ``shape(inputs, pixels)``: the expected output shape (``pixels``: the method is one of
    :data:`PIXEL_MAPS`); ``options``: method options the tiny model needs; ``undefined``: the methods that are
    not defined on this family, each with (a literal part of) the reason the method's
    :class:`~methods.MethodUndefinedError` gives: the matrix checks that it is raised, and the README's table
    lists it. ``eager_softmax_float32``: the stock eager attention computes its softmax in float32 (transformers'
    CLIP, Llama-like decoders: ``softmax(..., dtype=torch.float32)``), so the float64 model's fused and eager
    forms themselves differ at float32 precision (checked: the model's own logits differ), and so do the maps of
    the methods that keep the user's attention setting.
    """

    name: str
    adapter: type
    build: Callable[[], nn.Module]
    inputs: Callable[[int], object]
    single: Callable[[object, int], object]
    shape: Callable[[object, bool], tuple]
    positions: Callable[[object, int], slice] = lambda inputs, i: slice(None)
    padding: Callable[[object], Optional[Tensor]] = lambda inputs: None
    options: Optional[dict] = None
    logits: Callable[[nn.Module, object], Tensor] = lambda model, inputs: model(inputs)
    undefined: Dict[str, str] = field(default_factory=dict)
    eager_softmax_float32: bool = False


#: cheap settings of the costly generic baselines on every family of the conformance matrix (a family's own
#: ``options`` win)
MATRIX_OPTIONS = {
    "integrated_gradients": {"steps": 4},
    "smoothgrad": {"samples": 2},
    "smoothgrad_squared": {"samples": 2, "method": "input_x_gradient"},
    "vargrad": {"samples": 2, "method": "saliency"},
    "kernel_shap": {"samples": 8},
    "lime": {"samples": 8},
}


#: value_zeroing (issue 37) where the family gives no edit of its value vectors (Swin: windowed attention)
NO_VALUE_EDIT = {"value_zeroing": ("gives no edit of its value vectors (adapter.recording.value_edit): its attention "
                                   "computes the values where no hook reaches them, or in windows")}


def method_options(family: "Family", name: str) -> dict:
    """The options of method ``name`` on ``family`` in the conformance matrix."""
    return {**MATRIX_OPTIONS.get(name, {}), **(family.options or {}).get(name, {})}


#: the reason AtMan (issue 37) gives on a family without the ``score_edit`` capability
NO_SCORE_EDIT = {"atman": "has no pre-softmax attention-score edit (adapter.recording.score_edit)"}


#: real lengths of the samples of a text batch (the last one is padded)
TEXT_LENGTHS = (9, 9, 6)


def _token_batch(batch: int, with_types: bool, with_special: bool = None) -> dict:
    gen = torch.Generator().manual_seed(100 + batch)
    lengths = TEXT_LENGTHS[:batch] if batch <= len(TEXT_LENGTHS) else (9,) * batch
    n = max(lengths)
    ids = torch.randint(3, 40, (batch, n), generator=gen)
    mask = torch.zeros(batch, n, dtype=torch.long)
    special = torch.zeros(batch, n, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
        ids[i, 0], ids[i, length - 1] = 1, 2          # [CLS] ... [SEP]
        ids[i, length:] = 0                            # [PAD]
        special[i, 0] = special[i, length - 1] = 1
        special[i, length:] = 1
    inputs = {"input_ids": ids, "attention_mask": mask}
    if with_types:
        types = torch.zeros(batch, n, dtype=torch.long)
        types[:, 4:] = 1
        inputs.update(token_type_ids=types * mask)
    if with_types if with_special is None else with_special:
        inputs.update(special_tokens_mask=special)
    return inputs


def set_fused_attention(model: nn.Module, fused: bool) -> nn.Module:
    """``model`` built with fused attention (timm's ``fused_attn``, transformers' ``sdpa``) or eager attention,
    as a user may hand it over; every sub-model follows."""
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = fused
        if hasattr(module, "set_attn_implementation") and hasattr(getattr(module, "config", None),
                                                                   "_attn_implementation"):
            module.set_attn_implementation("sdpa" if fused else "eager")
    return model
