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

``explained`` (``run``'s option; ``None``, the default, is the target logit above): a function of the logits and the
resolved targets giving each row's explained output ``y`` (a method's ``explain=``); the gradients are then of
``y`` and the relevance pass starts from ``dy/dz`` at the logits ``z`` (the one-hot target when ``y`` is the logit,
so the same values as without it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch import Tensor

from ..adapters import ActivationRecorder, ModelAdapter, ModelInputs
from ..targets import class_score, resolve_target
from .map_sources import CamReduce, RecomputedMaps, RecordedMaps, RelevancePass, StreamedMaps
from .rules import RuleSet, get_rules
from .topology import topology_for


@dataclass
class LRPResult:
    logits: Tensor
    target: Tensor
    attn_cam: Dict[int, Tensor] = field(default_factory=dict)    # R_A (after the /2), [B, H, N, N]
    attn_grad: Dict[int, Tensor] = field(default_factory=dict)   # d logit_target / d A, [B, H, N, N]
    input_relevance: Optional[Tensor] = None                     # [B, 3, H, W] at the patch-embedding input
    seed: Optional[Tensor] = None   # the relevance at the logits, [B, C]; None: the one-hot target


#: each row's explained output ``[B]`` from the logits ``[B, C]`` and the resolved targets ``[B]``
Explained = Callable[[Tensor, Tensor], Tensor]


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
            grad_layers: Sequence[int] = (), to_input: bool = False, cam_reduce: Optional[CamReduce] = None,
            recompute: bool = True, explained: Optional[Explained] = None) -> LRPResult:
        """Relevance of the attention maps of ``cam_layers``, gradients of ``grad_layers`` and, with
        ``to_input``, the relevance at the input (the pixels for images).

        Only the blocks from ``min(cam_layers)`` up are recorded and propagated through (the lowest one only
        down to its attention map) unless ``to_input`` asks for everything; a block's recorded activations are
        released as soon as the pass has gone through it. ``cam_reduce(layer, R_A, grad)``: called for each
        layer of ``cam_layers`` as soon as its ``R_A`` (``[B, H, N, N]``, the engine's: it may be overwritten) is
        known, from the last layer down, with that layer's attention gradient (``None`` when not in
        ``grad_layers``; not to be modified); its return value is kept in ``attn_cam[layer]`` instead (nothing
        when ``None``) and the gradient is not kept in ``attn_grad``. How the maps reach the pass (recorded,
        streamed with the gradients, recomputed in the backward): :mod:`methods.lrp.map_sources`;
        ``recompute=False`` keeps the recorded maps on a family that could recompute them. ``explained``: the
        explained output (module docstring; ``None``: the target logit).
        """
        topology = self.topology(adapter)
        cam_layers = sorted({int(l) for l in cam_layers})
        grad_layers = sorted({int(l) for l in grad_layers})
        lowest = 0 if to_input else min(cam_layers + grad_layers + [len(adapter.blocks)])
        blocks = list(range(lowest, len(adapter.blocks)))
        source = self.map_source(adapter, topology, blocks, grad_layers, recompute)
        with ActivationRecorder() as rec, source.forward_context(adapter) as anchor:
            topology.record(rec, blocks, to_input, grad_blocks=grad_layers,
                            layer_outputs=self.rules.linear_uses_output)
            logits = source.forward(adapter, inputs)
            acts = dict(rec.outputs)
            rec.outputs.clear()
        target = resolve_target(logits, target)
        result = LRPResult(logits=logits.detach(), target=target)
        if explained is not None:
            with torch.enable_grad():
                z = logits.detach().requires_grad_(True)
                (result.seed,) = torch.autograd.grad(explained(z, target).sum(), z)
        points = source.points(acts, blocks)
        acts = {k: v.detach() for k, v in acts.items()}
        context = adapter.inputs.context(inputs)
        if context.attention_mask is not None:
            acts["attention_mask"] = context.attention_mask
        if context.readout_positions is not None:
            acts["readout_positions"] = context.readout_positions
        source.attach(acts, result)
        relevance = RelevancePass(self.rules, topology, acts, result, blocks, lowest, to_input, cam_layers, cam_reduce)
        score = None
        if source.stream:
            score = class_score(logits, target) if explained is None else explained(logits, target).sum()
        del logits
        source.bring(relevance, score, points, anchor)
        del score
        relevance.through(lowest)
        if to_input:
            with torch.no_grad():
                result.input_relevance = topology.input_relprop(self.rules, acts, relevance.relevance)
        return result

    @staticmethod
    def map_source(adapter: ModelAdapter, topology, blocks: List[int], grad_layers: List[int],
                   recompute: bool) -> RecordedMaps:
        """How the maps reach the pass. Streamed: the blocks of ``grad_layers``. Recomputed, where the adapter and
        the topology can: those blocks, or without gradients every block when more than one would be held (a
        backward whose gradients are dropped brings each block's map in turn, instead of the forward recording
        them all). Sets the topology's ``streamed_attention_from``."""
        capable = recompute and adapter.recording.attention_recompute is not None and topology.streams_attention
        stream = grad_layers or (blocks if capable and len(blocks) > 1 else [])
        recomputed = capable and bool(stream)
        topology.streamed_attention_from = stream[0] if recomputed else None
        if recomputed:
            return RecomputedMaps(stream, grad_layers)
        return StreamedMaps(stream) if stream else RecordedMaps()
