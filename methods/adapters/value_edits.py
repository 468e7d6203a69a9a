"""Editing the value vectors of every block at the projection that makes them (``Recording.value_edit``).

A family whose attention computes its values with a projection module that a forward hook can reach (a separate
``v`` projection, or a fused ``[q | k | v]`` projection whose last third is the values) gives the capability
with :func:`projection_value_edit`: a forward hook on each block's projection replaces the value part of its
output by ``edit(layer, values)``, heads split (``[B, N, H, Dh]``); queries and keys are untouched. The hooks are
removed on exit, so the model is left as it was. A family whose values are computed where no hook reaches them
(a functional linear layer: timm's EVA and BEiT; the packed ``in_proj`` of ``nn.MultiheadAttention``: open_clip)
adds :func:`product_change`, ``A (edit(v) - v)``, to its attention product instead (``A v`` is linear in ``v``).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, List

import torch
from torch import Tensor, nn

from .base import AttentionEdit, ModelAdapter, out_features

ValueEdit = Callable[[int, Tensor], Tensor]


def _value_hook(layer: int, start: int, heads: int, edit: ValueEdit) -> Callable[..., Tensor]:
    def hook(_module: nn.Module, _inputs: Any, out: Tensor) -> Tensor:
        if out.dim() != 3:
            raise RuntimeError(f"block {layer}: the value projection's output has shape {tuple(out.shape)}, "
                               "not [B, N, width] (an unpadded attention path cannot be edited)")
        values = out[..., start:]
        edited = edit(layer, values.unflatten(-1, (heads, values.shape[-1] // heads)))
        if edited.shape[:2] != values.shape[:2] or edited.shape[2:].numel() != values.shape[-1]:
            raise ValueError(f"block {layer}: the value edit returned shape {tuple(edited.shape)} for values of "
                             f"shape {tuple(values.shape[:2]) + (heads, values.shape[-1] // heads)}")
        edited = edited.flatten(2).to(out.dtype)
        return edited if start == 0 else torch.cat([out[..., :start], edited], dim=-1)

    return hook


@contextlib.contextmanager
def projection_value_edit(adapter: ModelAdapter, edit: ValueEdit) -> Iterator[None]:
    """``adapter.recording.value_edit(edit)`` for a family whose :meth:`~ModelAdapter.linears` name a value
    projection ``v`` (its output the values, ``out_features(v) / head_dim`` heads, ``head_dim`` read from ``q``:
    grouped-query attention keeps its key-value heads) or a fused ``qkv`` projection (the last third, ``H``
    heads)."""
    handles: List[Any] = []
    try:
        for layer in range(len(adapter.blocks)):
            linears = adapter.linears(layer).attention
            if linears.v is not None and linears.q is not None:
                head_dim = out_features(linears.q) // adapter.token_flow.heads
                module, start, heads = linears.v, 0, out_features(linears.v) // head_dim
            elif linears.qkv is not None:
                width = out_features(linears.qkv)
                module, start, heads = linears.qkv, 2 * width // 3, adapter.token_flow.heads
            else:
                raise NotImplementedError(f"{adapter.family}: block {layer} has no value projection module to edit")
            handles.append(module.register_forward_hook(_value_hook(layer, start, heads, edit)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def edited_values_change(layer: int, edit: ValueEdit, values: Tensor, heads: int) -> Tensor:
    """``edit(layer, v) - v`` ``[B, N, H, Dh]`` for the merged values ``values`` ``[B, N, H * Dh]``."""
    split = values.unflatten(-1, (heads, values.shape[-1] // heads))
    edited = edit(layer, split)
    if edited.shape != split.shape:
        raise ValueError(f"block {layer}: the value edit returned shape {tuple(edited.shape)} for values of shape "
                         f"{tuple(split.shape)}")
    return edited.to(split.dtype) - split


def product_change(probabilities: Tensor, change: Tensor) -> Tensor:
    """``A (v' - v)`` with heads merged, ``[B, N, H * Dh]``: what an edit of the values adds to the attention product
    ``A v`` (``probabilities`` ``[B, H, N, N]``, ``change`` ``[B, N, H, Dh]``). For a family whose values are
    computed where no hook reaches them, the product with the edited values is the recorded product plus this
    (``A v`` is linear in ``v``); an unedited block gets exactly its own product (the change is 0)."""
    return (probabilities @ change.transpose(1, 2).to(probabilities.dtype)).transpose(1, 2).flatten(2)


class ProjectionValueEdit(AttentionEdit):
    """Values edited at the block's value projection (a fused ``qkv``: its last third)."""

    def __call__(self, edit: ValueEdit) -> contextlib.AbstractContextManager[None]:
        return projection_value_edit(self.adapter, edit)
