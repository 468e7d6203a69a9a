"""The start of a hand-run LRP relevance pass, shared by the per-family conservation tests: record one forward
with the family's topology, then send the one-hot relevance of class ``target_index`` through the head."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

import torch
from torch import Tensor

from methods import build_method
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
    prepared = adapter.inputs.prepare(inputs)
    engine = LRPEngine("ours")
    topology = engine.topology(adapter)
    with adapter.recording.eager_attention(), ActivationRecorder() as rec, torch.no_grad():
        topology.record(rec, range(len(adapter.blocks)), True, layer_outputs=True)
        logits = adapter.forward(prepared, grad_from_block=len(adapter.blocks))
    acts = dict(rec.outputs)
    if readout_positions:
        acts["readout_positions"] = adapter.inputs.context(prepared).readout_positions
    relevance = torch.zeros_like(logits)
    relevance[:, target_index] = 1
    return HeadRelevance(adapter, engine, topology, acts, topology.head_relprop(engine.rules, acts, relevance))


def assert_cp_lrp_conserves_and_attnlrp_does_not(model, inputs, target: Tensor, relative: float) -> None:
    """CP-LRP's relevance sums at every block's input and at the input equal the explained logit (within
    ``relative`` of its largest value); AttnLRP explains the same logit and does not conserve at block 0 (its
    softmax rule by the gradient)."""
    report = build_method("cp_lrp").relevance_by_layer(model, inputs, target=target)
    logit = report["logit"]
    scale = float(logit.abs().max())
    for layer, sums in enumerate(report["blocks"]):
        torch.testing.assert_close(sums, logit, rtol=0, atol=relative * scale, msg=f"block {layer}")
    torch.testing.assert_close(report["input"], logit, rtol=0, atol=relative * scale)
    attn = build_method("attnlrp").relevance_by_layer(model, inputs, target=target)
    assert torch.equal(attn["logit"], logit)
    assert not torch.allclose(attn["blocks"][0], logit, rtol=1e-3)
