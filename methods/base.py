"""The call shape every attribution method shares: ``method(model, inputs, target=None)``."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from .adapters import adapter_for
from .model_state import preserved_model_state
from .targets import TargetType, resolve_target


class AttributionMethod:
    """Base class. Subclasses implement :meth:`attribute` and declare their kind.

    * ``class_specific``: whether the result depends on ``target``;
    * ``pixel_level``: ``True`` when the method returns ``[B, H, W]`` pixel maps instead of ``[B, P]`` patch
      scores in row-major grid order.

    ``__call__`` validates the input, runs :meth:`attribute` with the model in eval mode inside
    :func:`preserved_model_state` (so the model comes back exactly as it was) and returns the raw scores in the
    input's dtype and on its device.
    """

    name: str = "?"
    class_specific: bool = True
    pixel_level: bool = False
    families = None  # None: every adapter in methods.adapters.ADAPTERS

    def __call__(self, model: nn.Module, inputs: Tensor, target: TargetType = None) -> Tensor:
        if not isinstance(inputs, Tensor) or inputs.dim() != 4 or inputs.shape[1] != 3:
            shape = tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
            raise ValueError(f"{self.name}: expected a normalised image batch [B, 3, H, W], got {shape}")
        adapter = adapter_for(model, self.families)
        with preserved_model_state(model), adapter.eager_attention():
            relevance = self.attribute(adapter, inputs.detach(), target)
        return relevance.detach().to(dtype=inputs.dtype, device=inputs.device)

    # Captum-style alias: method.attribute_model(model, inputs, target=...)
    def attribute(self, adapter, inputs: Tensor, target: TargetType) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in sorted(vars(self).items()) if not k.startswith("_"))
        return f"{type(self).__name__}({opts})"


def check_start_layer(start_layer: int, depth: int, name: str) -> int:
    """Validate a 0-based ``start_layer`` (negative values count from the end, -1 = last block only)."""
    if not -depth <= start_layer < depth:
        raise ValueError(f"{name}: start_layer={start_layer} is outside a model with {depth} blocks")
    return start_layer % depth


def patch_tokens(x: Tensor, adapter) -> Tensor:
    """Drop the prefix ([CLS], register) tokens along the last dimension."""
    return x[..., adapter.num_prefix_tokens:]
