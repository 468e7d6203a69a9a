"""Decoder LMs recompute each block's attention probabilities in the backward pass
(``methods.families.hf_decoder.recompute``; Generic Attribution through ``stream_attention_gradients``, Transformer
Attribution, LRP rollout and full LRP through the LRP engine's streaming path): on tiny random float64 decoders,
left and right padding,

* the outputs, maps, gradients and relevances are bit-identical to the path that saves the eager attention;
* the forward saves no ``[B, H, N, N]`` tensor for the backward (``saved_tensors_hooks``), where the saved path
  saves at least one per block;
* the model is left as it was (attention implementation, hooks, no parameter ``.grad``), also when the
  consumer raises.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from methods import build_method
from methods.adapters import adapter_for
from methods.attention_gradients import attention_and_gradients, stream_attention_gradients
from methods.families.hf_decoder.recompute import _ACTIVE, RECOMPUTED_ATTENTION
from methods.lrp import LRPEngine
from tests.families import _decoder_batch, _tiny_decoder, _tiny_text

KINDS = ["gpt2", "llama", "qwen2", "gemma3"]
TARGETS = torch.tensor([5, 9, 30])
METHODS = [("generic_attribution", {}), ("generic_attribution", {"start_layer": 1}),
           ("transformer_attribution", {}), ("transformer_attribution", {"start_layer": -2}),
           ("lrp_rollout", {}), ("lrp", {}), ("lrp", {"text_input": "word_embeddings"}), ("partial_lrp", {})]


@contextlib.contextmanager
def saved_attention_path(adapter):
    """The adapter as if it had no recomputation: each block's eager map recorded and saved by the graph."""
    adapter.recording.attention_recompute = None
    try:
        yield
    finally:
        del adapter.recording.attention_recompute


def _hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_methods_equal_the_saved_attention_path(kind, side):
    model = _tiny_decoder(kind).eval()
    adapter = adapter_for(model)
    assert adapter.recording.attention_recompute is not None
    inputs = _decoder_batch(3, side)
    before = model.config._attn_implementation
    for name, options in METHODS:
        method = build_method(name, **options)
        recomputed = method(model, inputs, target=TARGETS)
        with saved_attention_path(adapter):
            saved = method(model, inputs, target=TARGETS)
        assert torch.equal(recomputed, saved), (kind, side, name, options)
        assert recomputed.abs().sum() > 0
    assert model.config._attn_implementation == before and _hooks(model) == 0 and not _ACTIVE
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_maps_gradients_and_relevances_are_bit_identical(kind):
    model = _tiny_decoder(kind).eval()
    adapter = adapter_for(model)
    with adapter.recording.eager_attention():
        batch = adapter.inputs.prepare(_decoder_batch(3, "left"))
        attns, grads, logits, _ = attention_and_gradients(adapter, batch, TARGETS, [0, 1, 2])
        seen = []

        def consume(layer, attn, grad):
            seen.append(layer)
            assert torch.equal(attn, attns[layer]) and torch.equal(grad, grads[layer])

        streamed_logits, _ = stream_attention_gradients(adapter, batch, TARGETS, [1, 2, 0], consume)
        assert seen == [2, 1, 0] and torch.equal(streamed_logits, logits)
        engine = LRPEngine("ours")
        recomputed = engine.run(adapter, batch, TARGETS, cam_layers=[0, 1, 2], grad_layers=[0, 1, 2])
        with saved_attention_path(adapter):
            saved = engine.run(adapter, batch, TARGETS, cam_layers=[0, 1, 2], grad_layers=[0, 1, 2])
    for layer in range(3):
        assert torch.equal(recomputed.attn_cam[layer], saved.attn_cam[layer])
        assert torch.equal(recomputed.attn_grad[layer], grads[layer])
    assert torch.equal(recomputed.logits, saved.logits)


def _attention_saves(model, call):
    """Shapes of the ``[B, H, N, N]`` tensors that autograd saves during the forward of ``call()`` (until the head
    runs) and during the rest of the call."""
    adapter = adapter_for(model)
    phase = {"now": "forward"}
    saved = {"forward": 0, "backward": 0}

    def pack(tensor):
        if tensor.dim() == 4 and tensor.shape[-1] == tensor.shape[-2] and tensor.shape[1] == adapter.token_flow.heads:
            saved[phase["now"]] += 1
        return tensor

    def head_ran(*_args):
        phase["now"] = "backward"

    handle = adapter.classifier().register_forward_hook(head_ran)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            call()
    finally:
        handle.remove()
    return saved


@pytest.mark.parametrize("kind", ["llama", "gemma3", "gpt2"])
@pytest.mark.parametrize("name", ["generic_attribution", "transformer_attribution"])
def test_the_forward_saves_no_attention_map(kind, name):
    model = _tiny_decoder(kind).eval()
    adapter = adapter_for(model)
    method = build_method(name)
    inputs = _decoder_batch(3, "right")

    def call():
        method(model, inputs, target=TARGETS)

    recomputed = _attention_saves(model, call)
    with saved_attention_path(adapter):
        saved = _attention_saves(model, call)
    assert recomputed["forward"] == 0, recomputed
    assert recomputed["backward"] >= len(adapter.blocks)      # each block's map, recomputed in the backward
    assert saved["forward"] >= len(adapter.blocks), saved      # the check can fail: the eager attention saves them


def test_consumer_errors_leave_the_model_unchanged():
    model = _tiny_decoder("qwen2").eval()
    adapter = adapter_for(model)
    before = model.config._attn_implementation
    batch = adapter.inputs.prepare(_decoder_batch(2, "left"))

    def consume(layer, attn, grad):
        raise KeyError("stop")

    with pytest.raises(KeyError, match="stop"):
        stream_attention_gradients(adapter, batch, TARGETS[:2], [0, 1, 2], consume)
    assert model.config._attn_implementation == before != RECOMPUTED_ATTENTION
    assert _hooks(model) == 0 and not _ACTIVE
    with pytest.raises(RuntimeError, match="nested"):
        with adapter.recording.attention_recompute(consume, 0), adapter.recording.attention_recompute(consume, 0):
            pass
    assert model.config._attn_implementation == before and not _ACTIVE


def test_attention_dropout_in_training_mode_is_refused():
    model = _tiny_decoder("llama")
    model.config.attention_dropout = 0.5
    for block in model.model.layers:
        block.self_attn.attention_dropout = 0.5
    adapter = adapter_for(model.train())
    batch = adapter.inputs.prepare(_decoder_batch(2, "left"))
    with pytest.raises(RuntimeError, match="dropout"):
        stream_attention_gradients(adapter, batch, TARGETS[:2], [0, 1, 2], lambda *args: None)


def test_families_without_the_capability_keep_the_saved_path():
    gpt2 = _tiny_decoder("gpt2")
    gpt2.config.reorder_and_upcast_attn = True        # its eager path is another function: not recomputed
    assert adapter_for(gpt2).recording.attention_recompute is None
    out = build_method("generic_attribution")(gpt2.eval(), _decoder_batch(2, "left"), target=TARGETS[:2])
    assert torch.isfinite(out).all()
    bert = adapter_for(_tiny_text("bert").eval())
    assert bert.recording.attention_recompute is None


@pytest.mark.parametrize("name", ["generic_attribution", "transformer_attribution"])
def test_recompute_attention_false_keeps_the_saved_maps(name):
    """The option ``recompute_attention=False`` (time over memory): the forward saves each block's map, and the
    scores are the same bit for bit."""
    model = _tiny_decoder("llama").eval()
    inputs = _decoder_batch(3, "left")
    kept = build_method(name, recompute_attention=False)
    recomputed = build_method(name)
    saves = _attention_saves(model, lambda: kept(model, inputs, target=TARGETS))
    assert saves["forward"] >= len(adapter_for(model).blocks), saves
    assert torch.equal(kept(model, inputs, target=TARGETS), recomputed(model, inputs, target=TARGETS))


@pytest.mark.parametrize("name", ["lrp_rollout", "lrp"])
def test_relevance_methods_without_gradients_stream_the_maps_too(name):
    """LRP rollout and full LRP take no gradients, yet on a decoder their maps arrive recomputed in a backward pass
    (no block's map recorded by the forward), and ``recompute_attention=False`` records them all: same scores."""
    model = _tiny_decoder("llama").eval()
    adapter = adapter_for(model)
    inputs = _decoder_batch(3, "right")
    recorded = []
    original = type(adapter.recording).attention

    def counting(self, rec, layer, key, *args, **kwargs):
        recorded.append(layer)
        return original(self, rec, layer, key, *args, **kwargs)

    type(adapter.recording).attention = counting
    try:
        streamed = build_method(name)(model, inputs, target=TARGETS)
        assert recorded == []
        kept = build_method(name, recompute_attention=False)(model, inputs, target=TARGETS)
        assert sorted(recorded) == list(range(len(adapter.blocks)))
    finally:
        type(adapter.recording).attention = original
    assert torch.equal(streamed, kept)
