"""The relevance pass of :class:`~methods.lrp.engine.LRPEngine` and the three ways the attention maps reach it.

:class:`RelevancePass` goes from the one-hot target (or the engine's ``seed``) through the head, then block by
block from the top down (closed-form rules under ``torch.no_grad()``), releasing each block's recorded activations
behind it. A map source says when it may go through a block:

* :class:`RecordedMaps`: the forward recorded every map; the pass runs once, after the forward.
* :class:`StreamedMaps` (gradients asked for): the pass runs inside the backward pass, from gradient hooks on
  the recorded maps; a block is gone through as soon as the gradient of the map below it arrives (its own
  backward is complete by then), so a caller folding each ``R_A`` with its gradient holds at most two gradients.
* :class:`RecomputedMaps` (an adapter with an ``attention_recompute``, a topology that ``streams_attention``): no
  map is recorded from ``stream[0]`` up; each arrives recomputed with its gradient during the backward and is
  dropped once the pass has gone through its block, which it does when the gradient at the block's q/k/v input
  arrives (before that, the backward may still read the recorded projection outputs). Without gradients asked
  for, a backward whose gradients are dropped brings the maps in turn. The values are the same bit for bit.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch import Tensor

from ..adapters import ModelAdapter
from .sublayers import release_block

CamReduce = Callable[[int, Tensor, Optional[Tensor]], Optional[Tensor]]


class RelevancePass:
    """The closed-form pass of ``topology`` with ``rules`` over ``blocks`` (down to ``lowest``; ``to_input``: on
    below it), keeping ``R_A`` of ``cam_layers`` (or what ``cam_reduce`` makes of it) in ``result.attn_cam``."""

    def __init__(self, rules, topology, acts: Dict[Any, Tensor], result, blocks: Sequence[int], lowest: int,
                 to_input: bool, cam_layers: Sequence[int], cam_reduce: Optional[CamReduce]) -> None:
        self.rules, self.topology, self.acts, self.result = rules, topology, acts, result
        self.lowest, self.to_input, self.cam_layers, self.cam_reduce = lowest, to_input, cam_layers, cam_reduce
        #: the blocks still to go through, top first
        self.pending = list(reversed(blocks))
        #: the relevance at the output of the lowest block gone through (at the head's input before the first)
        self.relevance: Optional[Tensor] = None

    @torch.no_grad()
    def through(self, stop: int) -> None:
        """Through every pending block ``>= stop`` (the head first)."""
        result = self.result
        if self.relevance is None:
            if result.seed is not None:
                relevance = result.seed
            else:
                relevance = torch.zeros_like(result.logits)
                relevance.scatter_(1, result.target[:, None], 1.0)
            self.relevance = self.topology.head_relprop(self.rules, self.acts, relevance)
        while self.pending and self.pending[0] >= stop:
            l = self.pending.pop(0)
            need_below = self.to_input or l > self.lowest
            self.relevance, cam = self.topology.block_relprop(self.rules, self.acts, l, self.relevance, need_below)
            release_block(self.acts, l)
            if l in self.cam_layers:
                if self.cam_reduce is not None:
                    cam = self.cam_reduce(l, cam, result.attn_grad.pop(l, None))
                if cam is not None:
                    result.attn_cam[l] = cam
            del cam


class RecordedMaps:
    """Every map recorded by the forward, which runs without autograd; the pass runs once after it."""

    #: the blocks whose maps arrive during a backward pass (none here)
    stream: List[int] = []

    def forward_context(self, adapter: ModelAdapter) -> contextlib.AbstractContextManager[Optional[Tensor]]:
        return contextlib.nullcontext(None)

    def forward(self, adapter: ModelAdapter, inputs) -> Tensor:
        with torch.no_grad():
            return adapter.forward(inputs, grad_from_block=len(adapter.blocks))

    def points(self, acts: Dict[Any, Tensor], blocks: Sequence[int]) -> Dict[int, Tensor]:
        return {}

    def attach(self, acts: Dict[Any, Tensor], result) -> None:
        """The (detached) recorded tensors and the result the maps and gradients go to."""
        self.acts, self.result = acts, result

    def bring(self, relevance: RelevancePass, score: Optional[Tensor], points: Dict[int, Tensor],
              anchor: Optional[Tensor]) -> None:
        """Run what brings the maps to ``relevance`` (nothing: they were recorded)."""


class StreamedMaps(RecordedMaps):
    """The maps of ``stream`` (the gradients' blocks, sorted) recorded with autograd; the pass runs inside the
    one backward, from gradient hooks on them."""

    def __init__(self, stream: List[int]) -> None:
        self.stream = stream

    def forward(self, adapter: ModelAdapter, inputs) -> Tensor:
        return adapter.forward(inputs, grad_from_block=self.stream[0])

    def points(self, acts: Dict[Any, Tensor], blocks: Sequence[int]) -> Dict[int, Tensor]:
        """The maps in the graph, for the gradient hooks."""
        return {l: acts[("attn", l)] for l in self.stream}

    def arrived(self, relevance: RelevancePass, layer: int, grad: Tensor) -> None:
        """The gradient of block ``layer``'s map: the blocks above are done, their gradients here."""
        relevance.through(layer + 1)
        self.result.attn_grad[layer] = grad.detach()

    def wrt(self, points: Dict[int, Tensor], anchor: Optional[Tensor]) -> List[Tensor]:
        """The lowest map; and a map that is a leaf of the graph (open_clip's joined copy of the probabilities),
        which lies on no path to the lowest one, differentiated to explicitly (as methods.attention_gradients)."""
        stream = self.stream
        return [points[stream[0]]] + [points[l] for l in stream[1:] if points[l].grad_fn is None]

    def after(self, relevance: RelevancePass, grads: Sequence[Tensor]) -> None:
        """The lowest map's gradient, when no hook delivered it."""
        first = self.stream[0]
        if first not in self.result.attn_grad and first in relevance.pending:
            self.result.attn_grad[first] = grads[0].detach()

    def bring(self, relevance: RelevancePass, score: Optional[Tensor], points: Dict[int, Tensor],
              anchor: Optional[Tensor]) -> None:
        """One ``autograd.grad`` of ``score``, with the hooks on ``points`` running the pass as it goes."""
        handles = [point.register_hook(lambda grad, l=l: self.arrived(relevance, l, grad))
                   for l, point in points.items()]
        try:
            wrt = self.wrt(points, anchor)
            points.clear()
            assert score is not None
            grads = torch.autograd.grad(score, wrt)
            self.after(relevance, grads)
            del grads, wrt, score
        finally:
            for handle in handles:
                handle.remove()


class RecomputedMaps(StreamedMaps):
    """No map of ``stream`` recorded nor saved by the forward: the adapter recomputes each in the backward and
    hands it over with its gradient (:class:`~methods.adapters.AttentionRecompute`); the maps of
    ``grad_layers`` keep their gradients."""

    def __init__(self, stream: List[int], grad_layers: Sequence[int]) -> None:
        super().__init__(stream)
        self.grad_layers = grad_layers
        self.received: List[int] = []

    def forward_context(self, adapter: ModelAdapter) -> contextlib.AbstractContextManager[Optional[Tensor]]:
        recompute = adapter.recording.attention_recompute
        assert recompute is not None, "only built where the adapter recomputes its attention"
        return recompute(self.receive, self.stream[0])

    def receive(self, layer: int, attn: Tensor, grad: Tensor) -> None:
        """A block's recomputed map and its gradient, during the backward: kept until the pass goes through the
        block (as soon as the block's own backward is done, :meth:`arrived`)."""
        self.received.append(layer)
        self.acts[("attn", layer)] = attn
        if layer in self.grad_layers:
            self.result.attn_grad[layer] = grad

    def points(self, acts: Dict[Any, Tensor], blocks: Sequence[int]) -> Dict[int, Tensor]:
        """The input of each block's q/k/v projections: its gradient completes the block's backward."""
        return {l: acts[("qkv_in", l)] for l in blocks if l > self.stream[0]}

    def arrived(self, relevance: RelevancePass, layer: int, grad: Tensor) -> None:
        relevance.through(layer)        # block ``layer``'s backward is done, its map was received

    def wrt(self, points: Dict[int, Tensor], anchor: Optional[Tensor]) -> List[Tensor]:
        assert anchor is not None
        return [anchor]

    def after(self, relevance: RelevancePass, grads: Sequence[Tensor]) -> None:
        """Every block from ``stream[0]`` up must have been received."""
        depth = len(relevance.topology.adapter.blocks)
        if sorted(self.received) != list(range(self.stream[0], depth)):
            raise RuntimeError(f"the recomputed attention reached blocks {sorted(self.received)}, expected "
                               f"{self.stream[0]} to {depth - 1}")
