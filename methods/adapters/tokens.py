"""Token-sequence helpers that every floor may use: the checks of a tokenizer's batch, the positions of the special
and last real tokens, and position ids counted over the real tokens of a padded batch.

They read plain tensors only (no model), so the classifier wrappers, the perturbers and the LightningModules use
them without importing a model family.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .base import RawInputs


def check_ids_like(name: str, tensor: Any, shape: Optional[Sequence[int]]) -> Tensor:
    """``tensor`` detached, checked to be an integer (or bool) tensor ``[B, N]`` (of ``shape`` when given);
    ``ValueError`` naming ``name`` and the problem otherwise."""
    if not isinstance(tensor, Tensor):
        raise ValueError(f"{name} must be a tensor [B, N], got {type(tensor).__name__}")
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        raise ValueError(f"{name} must hold integers (or bools for masks), got dtype {tensor.dtype}")
    if shape is None and tensor.dim() != 2:
        raise ValueError(f"{name} must be [B, N] (a batch of token ids as a tokenizer returns it with "
                         f"return_tensors='pt'), got shape {tuple(tensor.shape)}")
    if shape is not None and tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(tensor.shape)} but input_ids has {tuple(shape)}")
    return tensor.detach()


def check_token_inputs(inputs: RawInputs, family: str, vocab: int, max_len: int, batch: str = "B",
                       missing_note: str = "", positions_of: str = "the model's"
                       ) -> Tuple[Mapping[str, Any], Tensor, Tensor]:
    """A tokenizer's batch ``[batch, N]`` (or the ids alone) as a mapping, its checked ``input_ids`` (dtype as
    given) and ``attention_mask`` (long, 0/1; all ones when absent), for ``vocab`` token ids and ``max_len``
    positions."""
    if isinstance(inputs, Tensor):
        inputs = {"input_ids": inputs}
    if not isinstance(inputs, Mapping):
        raise ValueError(f"expected token ids [{batch}, N] or a mapping as a tokenizer returns it "
                         f"({{'input_ids', 'attention_mask', ...}}), got {type(inputs).__name__}")
    if inputs.get("input_ids") is None:
        given = ", ".join(map(repr, inputs.keys())) or "nothing"
        raise ValueError(f"{family} needs 'input_ids' [{batch}, N] (got {given}){missing_note}")
    ids = check_ids_like("input_ids", inputs["input_ids"], None)
    if ids.dtype == torch.bool:
        raise ValueError("input_ids must hold integers, got dtype torch.bool")
    shape = ids.shape
    if shape[0] == 0 or shape[1] == 0:
        raise ValueError(f"input_ids must hold at least one sample and one token, got shape {tuple(shape)}")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(f"input_ids must lie in [0, {vocab}) (the model's vocabulary), got values in "
                         f"[{int(ids.min())}, {int(ids.max())}]")
    if shape[1] > max_len:
        raise ValueError(f"sequences of {shape[1]} tokens exceed {positions_of} {max_len} positions")
    mask = inputs.get("attention_mask")
    mask = check_ids_like("attention_mask", torch.ones_like(ids) if mask is None else mask, shape)
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("attention_mask must hold 0 (padding) and 1 (real token) only")
    return inputs, ids, mask.long()


def last_real_positions(attention_mask: Tensor) -> Tensor:
    """Each row's last position with ``attention_mask == 1`` (``[B]``)."""
    n = attention_mask.shape[-1]
    return (attention_mask.long() * torch.arange(1, n + 1, device=attention_mask.device)).argmax(dim=-1)


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """``(attention_mask.cumsum(-1) - 1).clamp(min=0)``: each real token's index among its row's real tokens."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def special_positions(attention_mask: Tensor) -> Tensor:
    """Without a ``special_tokens_mask``: [CLS] at position 0 and each sample's last real token ([SEP])."""
    special = torch.zeros_like(attention_mask, dtype=torch.bool)
    special[:, 0] = True
    lengths = attention_mask.long().sum(dim=1)
    last = last_real_positions(attention_mask)
    special[torch.arange(attention_mask.shape[0], device=attention_mask.device)[lengths > 0], last[lengths > 0]] = True
    return special


def config_token_id(model: Any, key: str) -> Optional[int]:
    """``key`` (e.g. ``"pad_token_id"``) of the model's config, or of its text config for a two-tower model, when it
    names an ``int``; ``None`` otherwise."""
    config = getattr(model, "config", None)
    for candidate in (config, getattr(config, "text_config", None)):
        value = getattr(candidate, key, None)
        if isinstance(value, int):
            return value
    return None
