"""One recorded forward and one ``autograd.grad``: attention maps and their gradients, shared by the methods.

Gradients are taken of the *sum over the batch* of each sample's target score with ``torch.autograd.grad``
with respect to activations, which gives each sample its own gradient (samples never interact in an eval-mode
Transformer) and never touches parameter ``.grad``.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
from torch import Tensor

from .adapters import ActivationRecorder, ModelAdapter, ModelInputs
from .targets import TargetType, class_score, resolve_target

GRADIENT_OF = ("logit", "probability")


def check_gradient_of(gradient_of: str) -> str:
    if gradient_of not in GRADIENT_OF:
        raise ValueError(f"gradient_of must be 'logit' or 'probability', got {gradient_of!r}")
    return gradient_of


def target_score(logits: Tensor, target: Tensor, gradient_of: str = "logit") -> Tensor:
    """Sum over the batch of each sample's target logit (or softmax probability)."""
    scores = logits.softmax(dim=-1) if check_gradient_of(gradient_of) == "probability" else logits
    return class_score(scores, target)


def attention_and_gradients(adapter: ModelAdapter, inputs: ModelInputs, target: TargetType, layers: Sequence[int],
                            gradient_of: str = "logit") -> Tuple[List[Tensor], List[Tensor], Tensor, Tensor]:
    """The post-softmax attention maps ``A_l`` ``[B, H, N, N]`` of ``layers``, their gradients ``dy/dA_l`` with
    ``y`` the target logit (or probability), the logits and the resolved targets; autograd is recorded only
    from the first of ``layers`` on."""
    layers = list(layers)
    check_gradient_of(gradient_of)
    with ActivationRecorder() as rec:
        for layer in layers:
            adapter.record_attention(rec, layer, layer, require_grad=True)
        logits = adapter.forward(inputs, grad_from_block=min(layers))
        attentions = [rec[layer] for layer in layers]
    target = resolve_target(logits, target)
    grads = torch.autograd.grad(target_score(logits, target, gradient_of), attentions)
    return [a.detach() for a in attentions], list(grads), logits.detach(), target
