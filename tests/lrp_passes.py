"""The start of a hand-run LRP relevance pass, shared by the per-family conservation tests: record one forward
with the family's topology, then send the one-hot relevance of class ``target_index`` through the head."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

import torch
from torch import Tensor

from methods.adapters import ActivationRecorder, ModelAdapter, adapter_for
from methods.lrp import LRPEngine


@dataclass
class HeadRelevance:
    adapter: ModelAdapter
    engine: LRPEngine
    topology: Any
    acts: Dict[Any, Any]
    relevance: Tensor   # at the last block's output, [B, N, D]


def head_relevance(model, inputs, target_index: int = 1, readout_positions: bool = False) -> HeadRelevance:
    """Rules ``"ours"``, every block and the input recorded (eager attention, no autograd); ``readout_positions``:
    put the context's read-out positions into the activations, as the engine does for the families that read
    them (decoders, open_clip's text tower)."""
    adapter = adapter_for(model)
    prepared = adapter.prepare_inputs(inputs)
    engine = LRPEngine("ours")
    topology = engine.topology(adapter)
    with adapter.eager_attention(), ActivationRecorder() as rec, torch.no_grad():
        topology.record(rec, range(adapter.depth), True, layer_outputs=True)
        logits = adapter.forward(prepared, grad_from_block=adapter.depth)
    acts = dict(rec.outputs)
    if readout_positions:
        acts["readout_positions"] = adapter.context(prepared).readout_positions
    relevance = torch.zeros_like(logits)
    relevance[:, target_index] = 1
    return HeadRelevance(adapter, engine, topology, acts, topology.head_relprop(engine.rules, acts, relevance))
