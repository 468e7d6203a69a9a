"""transformers ModernBERT (``methods.families.hf_modernbert``): the adapter's logits are the model's, padded ==
alone, token ablation keeps the kept tokens' rotary positions and windows, CP-LRP conserves exactly on a
bias-free model (float64), LRP with the conservative rules conserves block by block, and the inputs the
model cannot read are named."""
from __future__ import annotations

import pytest
import torch

from methods import build_method
from methods.adapters import adapter_for
from tests.families.base import _token_batch
from tests.families.modernbert import _tiny_modernbert
from tests.lrp_passes import assert_cp_lrp_conserves_and_attnlrp_does_not, head_relevance

POOLINGS = ("cls", "mean")


def _bias_free(pooling: str):
    model = _tiny_modernbert(pooling, bias=False).eval()
    with torch.no_grad():
        model.classifier.bias.zero_()
    return model


def _logits(model, inputs):
    return model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits


@pytest.mark.parametrize("pooling", POOLINGS)
def test_adapter_logits_are_the_models_and_padded_equals_alone(pooling):
    """sdpa (the model as built) with padding; eager without padding (the stock eager path in float64 gives NaN
    at a padding query with no real key in its window: its softmax runs in float32, where the float64 mask minimum
    is -inf; the adapter lets such a query attend to itself)."""
    model = _tiny_modernbert(pooling).eval()
    adapter = adapter_for(model)
    inputs = _token_batch(3, with_types=False)
    logits = adapter.forward(adapter.inputs.prepare(inputs))
    torch.testing.assert_close(logits, _logits(model, inputs), rtol=0, atol=1e-12)
    alone = adapter.forward(adapter.inputs.prepare({k: v[2:3, :6] for k, v in inputs.items()}))
    torch.testing.assert_close(logits[2:3], alone, rtol=0, atol=1e-12)
    full = {k: v[:2] for k, v in inputs.items()}
    model.set_attn_implementation("eager")
    with adapter.recording.eager_attention():
        eager = adapter.forward(adapter.inputs.prepare(full))
    torch.testing.assert_close(eager, _logits(model, full), rtol=0, atol=1e-12)
    assert torch.isfinite(adapter.forward(adapter.inputs.prepare(inputs))).all()


@pytest.mark.parametrize("pooling", POOLINGS)
def test_ablation_keeps_positions_and_windows(pooling):
    """A token removed by ``drop_positions`` is the model with that token's key masked out: the kept tokens keep
    their rotary positions (ids ``arange(N)`` without the removed one) and their sliding windows, read on the
    position ids; a mean read-out leaves the removed token out."""
    model = _tiny_modernbert(pooling).eval()
    adapter = adapter_for(model)
    inputs = {k: v[:2] for k, v in _token_batch(2, with_types=False).items()}
    prepared = adapter.inputs.prepare(inputs)
    removed = torch.tensor([3, 5])
    hidden, context = adapter.inputs.drop_positions(adapter.embed(prepared), adapter.inputs.context(prepared), removed)
    with torch.no_grad():
        dropped = adapter.head(adapter.run_blocks(hidden, context), context).reshape(2, 2, -1)
    for j, position in enumerate(removed.tolist()):
        holed = dict(inputs, attention_mask=inputs["attention_mask"].clone())
        holed["attention_mask"][:, position] = 0
        torch.testing.assert_close(dropped[:, j], _logits(model, holed), rtol=0, atol=1e-10)
        shifted = adapter.forward(adapter.inputs.prepare({k: torch.cat([v[:, :position], v[:, position + 1:]], 1)
                                                           for k, v in inputs.items()}))
        assert (shifted - dropped[:, j]).abs().max() > 1e-6      # re-indexed positions are another model input


@pytest.mark.parametrize("pooling", POOLINGS)
def test_cp_lrp_conserves_exactly_on_bias_free_modernbert(pooling):
    """CP-LRP on a bias-free ModernBERT (its default: no attention, MLP, norm or head biases; the classifier's
    zeroed) is linear in the token embeddings: the relevance entering every block and the input scores' sum equal
    the explained logit. AttnLRP (softmax by its gradient, the GeGLU product by 1/2) does not."""
    model = _bias_free(pooling)
    inputs = _token_batch(3, with_types=False)
    target = torch.tensor([1, 4, 0])
    assert_cp_lrp_conserves_and_attnlrp_does_not(model, inputs, target, 1e-9)


def test_gated_product_rules_change_the_map():
    """The 1/2 on the GeGLU product (AttnLRP) and the activated half held constant (CP-LRP) are in force: with
    the attention rules of both variants equal the maps still differ; the model is left without hooks."""
    model = _tiny_modernbert("cls").eval()
    inputs = _token_batch(3, with_types=False)
    attn = build_method("attnlrp")(model, inputs, target=torch.tensor([1, 4, 0]))
    cp = build_method("cp_lrp")(model, inputs, target=torch.tensor([1, 4, 0]))
    assert (attn - cp).abs().max() > 1e-3 * attn.abs().max()
    assert (attn[inputs["attention_mask"] == 0] == 0).all()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("pooling", POOLINGS)
def test_lrp_conserves_relevance_on_modernbert(pooling):
    """With the conservative ``"ours"`` rules the relevance entering every block sums to the one-hot target per
    sample (float64, right padding), exactly 0 at padding; full LRP to the encoder input sums to 1 as well."""
    model = _bias_free(pooling)
    inputs = _token_batch(3, with_types=False)
    start = head_relevance(model, inputs)
    adapter, engine, topology, acts, r = start.adapter, start.engine, start.topology, start.acts, start.relevance
    acts["attention_mask"] = inputs["attention_mask"]
    if pooling == "mean":      # the engine adds the mask; the hand-run pass above read it before
        r = topology.head_relprop(engine.rules, acts, torch.eye(5, dtype=torch.float64)[[1, 1, 1]])
    ones = torch.ones(3, dtype=torch.float64)
    torch.testing.assert_close(r.sum(dim=(1, 2)), ones, rtol=0, atol=1e-6)
    for layer in reversed(range(len(adapter.blocks))):
        r, cam = topology.block_relprop(engine.rules, acts, layer, r, True)
        torch.testing.assert_close(r.sum(dim=(1, 2)), ones, rtol=0, atol=1e-6, msg=f"block {layer}")
        assert cam.shape == (3, adapter.token_flow.heads, 9, 9)
        assert (r[inputs["attention_mask"] == 0] == 0).all()
    full = build_method("lrp", rules="ours", class_token_score="keep")(model, inputs, target=1)
    torch.testing.assert_close(full.sum(dim=1), ones, rtol=0, atol=1e-6)


def test_inputs_the_model_cannot_read_are_named():
    adapter = adapter_for(_tiny_modernbert("cls"))
    inputs = _token_batch(3, with_types=False)
    left = {k: torch.flip(v, dims=[1]) for k, v in inputs.items()}
    with pytest.raises(ValueError, match="left padding is not supported"):
        adapter.inputs.prepare(left)
    holed = dict(inputs, attention_mask=inputs["attention_mask"].clone())
    holed["attention_mask"][0, 4] = 0
    with pytest.raises(ValueError, match="padded on the right only"):
        adapter.inputs.prepare(holed)
    with pytest.raises(ValueError, match="no token-type embeddings"):
        adapter.inputs.prepare(dict(inputs, token_type_ids=torch.ones_like(inputs["input_ids"])))
    assert adapter.readout.kind == "class_token" and adapter_for(_tiny_modernbert("mean")).readout.kind == "weighted"
