"""The LRP engine: one recorded forward, at most one ``autograd.grad``, one closed-form relevance pass.

``LRPEngine(rules).run(adapter, inputs, target, ...)`` works on the stock model through its adapter and the
family's topology (:mod:`methods.lrp.topology`): forward
hooks record the inputs of every rule-bearing layer during the model's own forward pass (so the logits are the
model's), the attention gradients ``d logit_target / d A_l`` come from a single ``torch.autograd.grad`` with
respect to the recorded attention maps (never ``.backward()``: parameters never get ``.grad``), and the
relevance pass applies the closed-form rules of :mod:`methods.lrp.rules` under ``torch.no_grad()``, batched,
from the one-hot target (value 1, not the logit; ``ViT_explanation_generator.py:40``) down only as far as the
caller needs. When gradients are asked for, the relevance pass runs inside that backward pass (gradient hooks
on the recorded maps; both go from the last block down), so that a caller reducing each block's ``R_A`` with its
gradient (``cam_reduce``) never holds every block's gradient at once; the values are the same. Where the
adapter recomputes its attention in the backward (the decoder LMs), no block's map is recorded: each arrives
recomputed with its gradient, and is dropped once the relevance pass has gone through its block.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch import Tensor

from ..adapters import ActivationRecorder, ModelAdapter, ModelInputs
from ..targets import class_score, resolve_target
from .rules import RuleSet, get_rules
from .sublayers import release_block
from .topology import topology_for


@dataclass
class LRPResult:
    logits: Tensor
    target: Tensor
    attn_cam: Dict[int, Tensor] = field(default_factory=dict)    # R_A (after the /2), [B, H, N, N]
    attn_grad: Dict[int, Tensor] = field(default_factory=dict)   # d logit_target / d A, [B, H, N, N]
    input_relevance: Optional[Tensor] = None                     # [B, 3, H, W] at the patch-embedding input


class LRPEngine:
    """Relevance propagation with a named rule set (``"ours"`` or ``"orig"``, see :mod:`methods.lrp.rules`)."""

    def __init__(self, rules="ours", mask_value: str = "dtype_min", input_point: str = "encoder_input"):
        self.rules: RuleSet = get_rules(rules)
        self.mask_value = mask_value
        self.input_point = input_point

    def topology(self, adapter: ModelAdapter):
        """The family's topology, with this engine's options."""
        topology = topology_for(adapter)
        topology.mask_value = self.mask_value
        topology.input_point = self.input_point
        return topology

    def run(self, adapter: ModelAdapter, inputs: ModelInputs, target=None, cam_layers: Sequence[int] = (),
            grad_layers: Sequence[int] = (), to_input: bool = False,
            cam_reduce: Optional[Callable[[int, Tensor, Optional[Tensor]], Optional[Tensor]]] = None,
            recompute: bool = True) -> LRPResult:
        """Relevance of the attention maps of ``cam_layers``, gradients of ``grad_layers`` and, with
        ``to_input``, the relevance at the input (the pixels for images).

        Only the blocks from ``min(cam_layers)`` up are recorded and propagated through (the lowest one only
        down to its attention map) unless ``to_input`` asks for everything. A block's recorded activations are
        released as soon as the pass has gone through it.

        ``cam_reduce(layer, R_A, grad)``: called for each layer of ``cam_layers`` as soon as its ``R_A``
        (``[B, H, N, N]``) is known, **from the last layer down**, with that layer's attention gradient (``None``
        when the layer is not in ``grad_layers``); its return value is kept in ``attn_cam[layer]`` instead of
        ``R_A`` (nothing is kept when it returns ``None``: a method that folds each layer into a read-out row as
        it comes) and the gradient is not kept in ``attn_grad``. ``R_A`` belongs to the engine (the function may
        overwrite it); the gradient must not be modified (autograd may still pass it on).

        Streaming: with ``grad_layers`` the relevance pass runs inside the backward pass (gradient hooks on the
        recorded maps): the blocks above a layer are propagated through as soon as that layer's gradient arrives
        (their own backward is complete by then), so with ``cam_reduce`` each gradient is consumed within about
        one block of its arrival: at most two layers' gradients are held, never all of them.

        Recomputed attention: where the adapter ``recomputes_attention`` and the topology ``streams_attention``
        (the decoder LMs), with ``grad_layers`` no map of a block from ``min(grad_layers)`` up is recorded nor
        saved by the forward (:meth:`~methods.adapters.ModelAdapter.recomputed_attention`): each block's map is
        recomputed in the backward and arrives with its gradient; the relevance pass goes through the block as
        soon as the block's backward is done (the gradient at its q/k/v projections' input, before which the
        pass must not overwrite the recorded projection outputs that backward may read), and the map is dropped
        there: one block's map and gradient are held at a time. The values are the same bit for bit. Without
        ``grad_layers``, where the pass goes through more than one block (LRP rollout, full LRP), the same path
        runs with a backward pass whose gradients are dropped: it brings each block's map in turn, so one is
        held at a time, for the cost of that backward. ``recompute=False`` keeps the saved-attention path on those
        models too (the forward records every map: no extra attention, no backward).
        """
        topology = self.topology(adapter)
        depth = adapter.depth
        cam_layers = sorted({int(l) for l in cam_layers})
        grad_layers = sorted({int(l) for l in grad_layers})
        lowest = 0 if to_input else min(cam_layers + grad_layers + [depth])
        blocks = list(range(lowest, depth))
        capable = recompute and adapter.recomputes_attention and topology.streams_attention
        # the blocks whose maps arrive during a backward pass: the gradients' blocks; without gradients, on a model
        # that recomputes, every block when more than one would be held (a backward whose gradients are dropped
        # brings each block's map in turn, instead of the forward recording them all)
        stream = grad_layers or (blocks if capable and len(blocks) > 1 else [])
        recompute = capable and bool(stream)
        topology.streamed_attention_from = stream[0] if recompute else None
        received: List[int] = []

        def receive(layer: int, attn: Tensor, grad: Tensor) -> None:
            """A block's recomputed map and its gradient, during the backward: kept until the relevance pass
            goes through the block (as soon as the block's own backward is done, :func:`arrived`)."""
            received.append(layer)
            acts[("attn", layer)] = attn
            if layer in grad_layers:
                result.attn_grad[layer] = grad

        recomputed = (adapter.recomputed_attention(receive, stream[0]) if recompute
                      else contextlib.nullcontext(None))
        with ActivationRecorder() as rec, recomputed as anchor:
            topology.record(rec, blocks, to_input, grad_blocks=grad_layers,
                            layer_outputs=self.rules.linear_uses_output)
            if stream:
                logits = adapter.forward(inputs, grad_from_block=stream[0])
            else:
                with torch.no_grad():
                    logits = adapter.forward(inputs, grad_from_block=depth)
            acts = dict(rec.outputs)
            rec.outputs.clear()
        target = resolve_target(logits, target)
        result = LRPResult(logits=logits.detach(), target=target)
        if recompute:   # the input of a block's q/k/v projections: its gradient completes the block's backward
            points = {l: acts[("qkv_in", l)] for l in blocks if l > stream[0]}
        else:           # the maps in the graph, for the gradient hooks
            points = {l: acts[("attn", l)] for l in grad_layers}
        acts = {k: v.detach() for k, v in acts.items()}
        context = adapter.context(inputs)
        if context.attention_mask is not None:
            acts["attention_mask"] = context.attention_mask
        if context.readout_positions is not None:
            acts["readout_positions"] = context.readout_positions
        pending = list(reversed(blocks))                        # the blocks still to propagate through
        state = {}

        @torch.no_grad()
        def propagate(stop: int) -> None:
            """The relevance pass through every pending block ``>= stop`` (the head first)."""
            if "r" not in state:
                relevance = torch.zeros_like(result.logits)
                relevance.scatter_(1, target[:, None], 1.0)
                state["r"] = topology.head_relprop(self.rules, acts, relevance)
            while pending and pending[0] >= stop:
                l = pending.pop(0)
                need_below = to_input or l > lowest
                state["r"], cam = topology.block_relprop(self.rules, acts, l, state["r"], need_below)
                release_block(acts, l)
                if l in cam_layers:
                    if cam_reduce is not None:
                        cam = cam_reduce(l, cam, result.attn_grad.pop(l, None))
                    if cam is not None:
                        result.attn_cam[l] = cam
                del cam

        if stream:
            def arrived(layer: int, grad: Tensor) -> None:
                if recompute:                   # block ``layer``'s backward is done, its map was received
                    propagate(layer)
                    return
                propagate(layer + 1)            # the blocks above: their backward is done, their gradients here
                result.attn_grad[layer] = grad.detach()

            handles = [point.register_hook(lambda grad, l=l: arrived(l, grad)) for l, point in points.items()]
            try:
                score = class_score(logits, target)
                del logits
                if anchor is not None:
                    wrt = [anchor]
                else:
                    # a map that is a leaf of the graph (open_clip's joined copy of the probabilities) lies on no
                    # path to the bottom one: differentiated to explicitly (methods.attention_gradients does the
                    # same)
                    wrt = [points[grad_layers[0]]] + [points[l] for l in grad_layers[1:] if points[l].grad_fn is None]
                points.clear()
                grads = torch.autograd.grad(score, wrt)
                if not recompute and grad_layers[0] not in result.attn_grad and grad_layers[0] in pending:
                    result.attn_grad[grad_layers[0]] = grads[0].detach()
                del grads, wrt, score
            finally:
                for handle in handles:
                    handle.remove()
            if recompute and sorted(received) != list(range(stream[0], depth)):
                raise RuntimeError(f"the recomputed attention reached blocks {sorted(received)}, expected "
                                   f"{stream[0]} to {depth - 1}")
        else:
            del logits
        propagate(lowest)
        if to_input:
            with torch.no_grad():
                result.input_relevance = topology.input_relprop(self.rules, acts, state["r"])
        return result
