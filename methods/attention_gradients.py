"""One recorded forward and one ``autograd.grad``: attention maps and their gradients, shared by the methods.

:func:`attention_and_gradients` returns every layer's map and gradient at once (``2 L`` maps of ``[B, H, N, N]``);
:func:`stream_attention_gradients` hands each layer's map and gradient to a function during the backward pass
itself, from the last layer down, and keeps neither; on a model whose adapter recomputes its attention in the
backward (``attention_recompute``: the decoder LMs) the forward keeps no map either, so one layer's map is held
at a time.

Gradients are taken of the *sum over the batch* of each sample's explained output with ``torch.autograd.grad``
with respect to activations, which gives each sample its own gradient (samples never interact in an eval-mode
Transformer) and never touches parameter ``.grad``. The explained output (``gradient_of``, with ``foil`` for the
contrastive ones): :mod:`methods.explanation_targets`; ``"logit"`` (default) is each row's target logit, whose
gradient is the same to the bit as before the option existed.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

import torch
from torch import Tensor

from .adapters import ActivationRecorder, ModelAdapter, ModelInputs
from .explanation_targets import check_explain, explained_score, resolve_foil
from .targets import TargetType, resolve_target


def target_score(logits: Tensor, target: Tensor, gradient_of: str = "logit", foil: TargetType = None) -> Tensor:
    """Sum over the batch of each sample's explained output (:mod:`methods.explanation_targets`): its target logit
    (default), softmax probability, log-probability, or (with ``foil``, an int or one class per row) its
    difference with the foil's logit or probability."""
    check_explain(gradient_of, "gradient_of")
    return explained_score(logits, target, gradient_of, resolve_foil(logits, foil, gradient_of))


def attention_and_gradients(adapter: ModelAdapter, inputs: ModelInputs, target: TargetType, layers: Sequence[int],
                            gradient_of: str = "logit",
                            foil: TargetType = None) -> Tuple[List[Tensor], List[Tensor], Tensor, Tensor]:
    """The post-softmax attention maps ``A_l`` ``[B, H, N, N]`` of ``layers``, their gradients ``dy/dA_l`` with
    ``y`` the explained output (``gradient_of``: the target logit by default; ``foil`` for a contrastive one),
    the logits and the resolved targets; autograd is recorded only from the first of ``layers`` on."""
    layers = list(layers)
    check_explain(gradient_of, "gradient_of")
    with ActivationRecorder() as rec:
        for layer in layers:
            adapter.recording.attention(rec, layer, layer, require_grad=True)
        logits = adapter.forward(inputs, grad_from_block=min(layers))
        attentions = [rec[layer] for layer in layers]
    target = resolve_target(logits, target)
    grads = torch.autograd.grad(target_score(logits, target, gradient_of, foil), attentions)
    return [a.detach() for a in attentions], list(grads), logits.detach(), target


def stream_attention_gradients(adapter: ModelAdapter, inputs: ModelInputs, target: TargetType, layers: Sequence[int],
                               consume: Callable[[int, Tensor, Tensor], None],
                               gradient_of: str = "logit", recompute: bool = True,
                               foil: TargetType = None) -> Tuple[Tensor, Tensor]:
    """``consume(layer, A_l, dy/dA_l)`` for each of ``layers``, **from the last layer down**, during the one
    backward pass: each call comes as soon as that layer's gradient is complete (gradient hooks on the recorded
    maps), and neither tensor is kept afterwards. Same maps and gradients as :func:`attention_and_gradients`
    (bit-identical), but a method that reduces them as they come holds one layer's ``[B, H, N, N]`` map and
    gradient at a time beyond what the autograd graph saves for its own backward (with eager attention, each
    layer's post-softmax map, until the backward passes below that layer). ``consume`` must not modify the
    gradient in place (autograd passes it on to the layers below) nor the map (saved by the graph); both are
    detached. Returns the logits (detached) and the resolved targets.

    Where the adapter has an ``attention_recompute`` (:class:`~methods.adapters.AttentionRecompute`) the
    forward saves no map: each layer's map is recomputed in the backward from its saved ``q``, ``k``, ``v`` (one
    more eager attention per layer) and handed over at once, then dropped; the maps and gradients are the same
    bit for bit, and one layer's map is held at a time. ``recompute=False`` keeps the saved maps instead (no
    extra attention, ~1 map per layer held until the backward passes it)."""
    layers = sorted({int(layer) for layer in layers})
    if not layers:
        raise ValueError("stream_attention_gradients needs at least one layer")
    check_explain(gradient_of, "gradient_of")
    if recompute and adapter.recording.attention_recompute is not None:
        return _stream_recomputed(adapter, inputs, target, layers, consume, gradient_of, foil)
    with ActivationRecorder() as rec:
        for layer in layers:
            adapter.recording.attention(rec, layer, layer, require_grad=True)
        logits = adapter.forward(inputs, grad_from_block=layers[0])
        attentions: Dict[int, Tensor] = {layer: rec[layer] for layer in layers}
        rec.outputs.clear()
    target = resolve_target(logits, target)
    order = list(reversed(layers))    # the order of the calls; a gradient that came early waits for its turn
    waiting: Dict[int, Tensor] = {}

    def deliver(layer: int, grad: Tensor) -> None:
        waiting[layer] = grad
        while order and order[0] in waiting:
            done = order.pop(0)
            consume(done, attentions.pop(done).detach(), waiting.pop(done))

    handles = [attentions[layer].register_hook(lambda grad, layer=layer: deliver(layer, grad)) for layer in layers]
    try:
        score = target_score(logits, target, gradient_of, foil)
        # The lowest map's gradient needs the backward through every map above it, so differentiating to it
        # alone streams them all, unless a map is a leaf of the graph (an adapter that joins a detached copy of
        # the probabilities to the output, as open_clip's nn.MultiheadAttention needs): nothing below depends on
        # a leaf, so it is differentiated to explicitly (its gradient kept until the end of the call).
        leaves = [attentions[layer] for layer in layers[1:] if attentions[layer].grad_fn is None]
        lowest = attentions[layers[0]]
        grads = torch.autograd.grad(score, [lowest] + leaves)
        if layers[0] in order:   # the gradient of the tensor differentiated to, if its hook did not deliver it
            deliver(layers[0], grads[0])
        del grads, lowest, leaves
    finally:
        for handle in handles:
            handle.remove()
    if order:
        raise RuntimeError(f"the backward pass never reached the attention of layers {order}")
    return logits.detach(), target


def _stream_recomputed(adapter: ModelAdapter, inputs: ModelInputs, target: TargetType, layers: List[int],
                       consume: Callable[[int, Tensor, Tensor], None], gradient_of: str,
                       foil: TargetType = None) -> Tuple[Tensor, Tensor]:
    """:func:`stream_attention_gradients` through the adapter's recomputed attention (``layers`` sorted)."""
    wanted = set(layers)
    delivered: List[int] = []

    def receive(layer: int, attn: Tensor, grad: Tensor) -> None:
        if layer in wanted:
            delivered.append(layer)
            consume(layer, attn, grad)

    assert adapter.recording.attention_recompute is not None, "only reached where the adapter recomputes its attention"
    with adapter.recording.attention_recompute(receive, layers[0]) as anchor:
        logits = adapter.forward(inputs, grad_from_block=layers[0])
        resolved = resolve_target(logits, target)
        torch.autograd.grad(target_score(logits, resolved, gradient_of, foil), [anchor])
    if delivered != list(reversed(layers)):
        raise RuntimeError(f"the recomputed attention reached layers {delivered}, expected {list(reversed(layers))}")
    return logits.detach(), resolved
