"""Guarantee that an attribution call leaves the model exactly as it found it."""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn

_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
)


def _hook_counts(model: nn.Module) -> List[Tuple[str, str, int]]:
    return [(name, attr, len(getattr(module, attr))) for name, module in model.named_modules()
            for attr in _HOOK_DICTS if getattr(module, attr, None) is not None]


@contextlib.contextmanager
def preserved_model_state(model: nn.Module) -> Iterator[nn.Module]:
    """Run a block with the model in eval mode and restore, on exit and on error:
    every module's train/eval flag, every parameter's ``requires_grad`` and ``.grad``, every attention
    module's ``fused_attn`` flag and Hugging Face ``_attn_implementation``.

    Methods take gradients with ``torch.autograd.grad`` with respect to activations, never ``.backward()``,
    so parameter ``.grad`` is never touched; the restore of ``.grad`` is a safety net. A hook left behind
    by a method is a bug and raises ``RuntimeError`` after the hooks are removed.
    """
    training = {name: m.training for name, m in model.named_modules()}
    requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
    grads: Dict[str, Optional[torch.Tensor]] = {name: p.grad for name, p in model.named_parameters()}
    fused = {name: m.fused_attn for name, m in model.named_modules() if hasattr(m, "fused_attn")}
    hf_impl = {
        name: m.config._attn_implementation
        for name, m in model.named_modules()
        if hasattr(m, "config") and hasattr(m.config, "_attn_implementation")
    }
    hooks_before = _hook_counts(model)
    model.eval()
    try:
        yield model
    finally:
        modules = dict(model.named_modules())
        for name, flag in training.items():
            modules[name].training = flag
        params = dict(model.named_parameters())
        for name, flag in requires_grad.items():
            params[name].requires_grad_(flag)
            params[name].grad = grads[name]
        for name, flag in fused.items():
            modules[name].fused_attn = flag
        for name, impl in hf_impl.items():
            modules[name].config._attn_implementation = impl
        if _hook_counts(model) != hooks_before:
            raise RuntimeError("an attribution method left hooks registered on the model")
