"""Attention probabilities recomputed in the backward pass instead of saved by the forward (Hugging Face models).

The eager attention of a stock ``transformers`` model saves each block's post-softmax probabilities ``[B, H, N, N]``
for its own backward, so a forward whose gradients are taken keeps one ``N x N`` map per block until the backward
reaches it. Within :func:`recomputed_attention`, a model's attention modules call instead
:func:`recomputing_attention_forward` (registered through ``transformers.AttentionInterface`` under
:data:`RECOMPUTED_ATTENTION`; the config of the model switched to it for the duration, and the same additive
masks as the eager attention's, ``AttentionMaskInterface``): the module's **own** ``eager_attention_forward`` (found
in the module's python module: each family's softmax dtype, GQA repetition, soft-capping, scaling and options stay
its own) run inside a ``torch.autograd.Function`` that

Design notes: ``NOTES.md`` beside this file (recompute.py).
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import torch
from torch import Tensor, nn

from ..hf_implementation import attention_implementation
from ..hf_score_edit import family_eager_attention

#: the attention implementation a config is switched to while the probabilities are recomputed
RECOMPUTED_ATTENTION = "token_attributions_recomputed_eager"

#: ``consume(layer, A, dA)``: a block's probabilities ``[B, H, N, N]`` and the gradient at them
Consumer = Callable[[int, Tensor, Tensor], None]


@dataclass
class _Session:
    consume: Consumer
    lowest: int
    anchor: Tensor


#: the attention modules of the models being recomputed: module -> (its block index, the call's session)
_ACTIVE: "weakref.WeakKeyDictionary[nn.Module, Tuple[int, _Session]]" = weakref.WeakKeyDictionary()


class _RecomputedAttention(torch.autograd.Function):
    """``out = eager(q, k, v)``, saving ``q``, ``k``, ``v`` only; the backward recomputes (module docstring)."""

    @staticmethod
    def forward(ctx: Any, run: Callable[[Tensor, Tensor, Tensor], Tuple[Tensor, Tensor]],
                deliver: Callable[[Tensor, Tensor], None], query: Tensor, key: Tensor, value: Tensor,
                anchor: Optional[Tensor]) -> Tensor:
        with torch.no_grad():
            out, _ = run(query, key, value)
        ctx.run, ctx.deliver = run, deliver
        ctx.save_for_backward(query, key, value)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> Tuple[Optional[Tensor], ...]:
        saved = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:5]
        with torch.enable_grad():
            # every input requires grad, so that A does; autograd.grad runs only the part of the backward that
            # the requested tensors need (the lowest block: A @ v's backward to A alone)
            inputs = [t.detach().requires_grad_(True) for t in saved]
            out, probs = ctx.run(*inputs)
            wanted = [probs] + [t for t, need in zip(inputs, needs) if need]
            grads = list(torch.autograd.grad(out, wanted, grad_out))
        del out, inputs, saved
        ctx.deliver(probs.detach(), grads.pop(0))
        del probs
        qkv = [grads.pop(0) if need else None for need in needs]
        anchor = ctx.needs_input_grad[5]
        return (None, None, *qkv, torch.zeros((), dtype=grad_out.dtype, device=grad_out.device) if anchor else None)


def recomputing_attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                                  attention_mask: Optional[Tensor], **kwargs: Any) -> Tuple[Tensor, Optional[Tensor]]:
    """The attention function registered as :data:`RECOMPUTED_ATTENTION`: ``(out, None)`` through
    :class:`_RecomputedAttention` for a module of an active :func:`recomputed_attention` whose block is at or above
    the session's lowest while autograd records; otherwise the module's own eager attention, ``(out, A)``."""
    eager = family_eager_attention(module)
    entry = _ACTIVE.get(module)
    if entry is None or not torch.is_grad_enabled() or entry[0] < entry[1].lowest:
        return eager(module, query, key, value, attention_mask, **kwargs)
    layer, session = entry
    if module.training and float(kwargs.get("dropout", 0.0) or 0.0) > 0:
        raise RuntimeError(f"block {layer}: the attention dropout of a module in training mode cannot be recomputed")

    def run(q: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
        return eager(module, q, k, v, attention_mask, **kwargs)

    def deliver(probs: Tensor, grad: Tensor) -> None:
        session.consume(layer, probs, grad)

    if layer == session.lowest:
        out = _RecomputedAttention.apply(run, deliver, query.detach(), key.detach(), value.detach(), session.anchor)
    else:
        out = _RecomputedAttention.apply(run, deliver, query, key, value, None)
    return out, None


@contextlib.contextmanager
def recomputed_attention(config: Any, modules: Dict[nn.Module, int], consume: Consumer, lowest: int,
                         dtype: torch.dtype, device: torch.device) -> Iterator[Tensor]:
    """Within it, the attention modules ``modules`` (module -> block index; their layers read
    ``config._attn_implementation``) recompute their probabilities in the backward and hand each block's
    ``(layer, A, dA)`` to ``consume`` (module docstring). Yields the ``anchor`` to differentiate to (a scalar leaf of
    ``dtype`` on ``device``). On exit the config's implementation is restored and the modules are released."""
    busy = [module for module in modules if module in _ACTIVE]
    if busy:
        raise RuntimeError("recomputed_attention: these attention modules are already being recomputed (nested call)")
    session = _Session(consume, int(lowest), torch.zeros((), dtype=dtype, device=device, requires_grad=True))
    for module, layer in modules.items():
        _ACTIVE[module] = (int(layer), session)
    try:
        with attention_implementation(config, RECOMPUTED_ATTENTION, recomputing_attention_forward, True):
            yield session.anchor
    finally:
        for module in modules:
            _ACTIVE.pop(module, None)
