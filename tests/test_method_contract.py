"""The contract every registered method keeps on every registered model family.

For each (family, method): the output shape and layout, exact zeros at padding positions, a batched call equal
to per-sample calls (each sample alone, without padding), the model restored exactly (weights, train/eval
flags, requires_grad, attention implementation, no hooks left) and no parameter ``.grad`` written.

A new family adds one :class:`~tests.families.Family` to ``tests/families``: a tiny random model (float64, so that
batched and per-sample calls can be compared tightly), a batch builder and the per-sample split.
"""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from methods import MethodUndefinedError, available_methods, build_method, method_class
from methods.adapters import ADAPTERS, adapter_for
from methods.registry import OPT_IN
from tests.families import FAMILIES, PIXEL_MAPS, _images, _tiny_vit, method_options, set_fused_attention
from tests.families.matrix import README, markdown, readme_table


def test_every_registered_adapter_has_a_family_here():
    assert {a for a in ADAPTERS} <= {f.adapter for f in FAMILIES}


def _snapshot(model: nn.Module):
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "training": {n: m.training for n, m in model.named_modules()},
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "fused": {n: m.fused_attn for n, m in model.named_modules() if hasattr(m, "fused_attn")},
        "attn_implementation": {n: m.config._attn_implementation for n, m in model.named_modules()
                                if hasattr(getattr(m, "config", None), "_attn_implementation")},
        "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                     for m in model.modules()),
    }


def _prepare(model: nn.Module) -> nn.Module:
    """A model as a user may hand it over: training mode, fused attention on, part of it frozen."""
    model.train()
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = True
    first = next(model.parameters())
    first.requires_grad_(False)
    return model


#: every registered method; the opt-in generic baselines (about 1000 more cases: their sampling and steps) run in the
#: slow tier (``-m slow``); ``tests/test_generic_baselines.py`` checks them on five families in the default one
MATRIX_METHODS = [pytest.param(name, marks=pytest.mark.slow) if OPT_IN in method_class(name).tags else name
                  for name in available_methods()]


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda f: f.name)
def family(request):
    return request.param


def test_undefined_methods_are_registered_methods(family):
    assert set(family.undefined) <= set(available_methods()), family.name


def test_adapter_logits_equal_the_models_own_forward(family):
    """The adapter's forward (embedding, blocks, head, in the model's order) gives the model's own logits."""
    model = family.build().eval()
    inputs = family.inputs(3)
    adapter = adapter_for(model)
    with torch.no_grad():
        ours = adapter.forward(adapter.inputs.prepare(inputs))
        theirs = family.logits(model, inputs)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6 * float(theirs.abs().max()))


@pytest.mark.parametrize("name", MATRIX_METHODS)
def test_method_contract(family, name):
    model = _prepare(family.build())
    before = _snapshot(model)
    options = method_options(family, name)
    method = build_method(name, **options)
    inputs = family.inputs(3)
    targets = torch.tensor([1, 4, 0])
    ids = torch.tensor([10, 11, 12])

    if name in family.undefined:
        with pytest.raises(MethodUndefinedError, match=re.escape(family.undefined[name])):
            method(model, inputs, target=targets, sample_ids=ids)
        assert _snapshot(model)["hooks"] == 0
        return
    out = method(model, inputs, target=targets, sample_ids=ids)

    assert out.shape == family.shape(inputs, name in PIXEL_MAPS), (name, tuple(out.shape))
    assert torch.isfinite(out).all(), name
    assert out.dtype == torch.float64
    padding = family.padding(inputs)
    if padding is not None and out.shape == padding.shape:
        assert padding.any() and (out[padding] == 0).all(), f"{name}: padding positions are not exactly 0"

    for i in range(3):
        alone = method(model, family.single(inputs, i), target=targets[i:i + 1], sample_ids=ids[i:i + 1])
        row = out[i:i + 1][..., family.positions(inputs, i)]
        torch.testing.assert_close(row, alone, rtol=1e-9, atol=1e-12 * max(1.0, float(alone.abs().max())),
                                   msg=f"{name}: sample {i} differs between the batched and the per-sample call")

    after = _snapshot(model)
    assert after["hooks"] == before["hooks"] == 0
    for key in ("training", "requires_grad", "fused", "attn_implementation"):
        assert after[key] == before[key], f"{name}: {key} not restored"
    for key, value in before["state"].items():
        assert torch.equal(after["state"][key], value), f"{name}: {key} changed"
    assert all(p.grad is None for p in model.parameters()), f"{name} wrote parameter .grad"
    assert adapter_for(model) is adapter_for(model)


@pytest.mark.parametrize("name", MATRIX_METHODS)
def test_fused_and_eager_attention_give_the_same_maps(family, name):
    """The user's attention setting (fused / sdpa or eager) changes no map and is left as it was.

    Exactly so (float64, 1e-12 of the largest score) where the model's two forms compute the same function.
    Where the stock eager attention takes its softmax in float32 (``Family.eager_softmax_float32``), the model's
    own logits differ between the two forms (asserted) and the methods that keep the user's setting (AttnLRP,
    CP-LRP) inherit that float32 difference: they are held to 1e-4 of the largest score; the methods that read the
    attention switch to eager themselves and must still agree exactly."""
    if name in family.undefined:
        return
    method = build_method(name, **method_options(family, name))
    inputs = family.inputs(2)
    maps, logits = {}, {}
    for fused in (True, False):
        model = set_fused_attention(family.build().eval(), fused)
        before = _snapshot(model)
        maps[fused] = method(model, inputs, target=torch.tensor([1, 4]), sample_ids=torch.tensor([0, 1]))
        after = _snapshot(model)
        assert after["fused"] == before["fused"] and after["attn_implementation"] == before["attn_implementation"]
        with torch.no_grad():
            logits[fused] = family.logits(model, inputs)
    scale = float(logits[False].abs().max())
    float32_softmax = not torch.allclose(logits[True], logits[False], rtol=0, atol=1e-12 * scale)
    assert float32_softmax == family.eager_softmax_float32, "the family's eager_softmax_float32 flag is wrong"
    exact = method_class(name).reads_attention or not float32_softmax
    scale = float(maps[False].abs().max())
    torch.testing.assert_close(maps[True], maps[False], rtol=1e-9 if exact else 0,
                               atol=(1e-12 if exact else 1e-4) * scale)


@pytest.mark.parametrize("name", MATRIX_METHODS)
def test_default_target_is_the_prediction(family, name):
    model = family.build().eval()
    options = method_options(family, name)
    method = build_method(name, **options)
    inputs = family.inputs(2)
    if not method_class(name).class_specific or name in family.undefined:
        return
    logits = family.logits(model, inputs)
    predicted = method(model, inputs, sample_ids=torch.tensor([0, 1]))
    explicit = method(model, inputs, target=logits.argmax(-1), sample_ids=torch.tensor([0, 1]))
    torch.testing.assert_close(predicted, explicit, rtol=0, atol=0)


def test_mapping_inputs_equal_tensor_inputs():
    model = _tiny_vit("token").eval()
    x = _images(2)
    for name in ("rollout", "gradcam", "transformer_attribution", "cdam"):
        method = build_method(name)
        torch.testing.assert_close(method(model, {"pixel_values": x}, target=1), method(model, x, target=1),
                                   rtol=0, atol=0)


def test_bad_inputs_and_ids_are_named():
    model = _tiny_vit("token").eval()
    method = build_method("gradcam")
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        method(model, torch.randn(2, 32, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="multiple of the patch size"):
        method(model, torch.randn(1, 3, 30, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="sample_ids has 1 entries but the batch has 2"):
        build_method("random")(model, _images(2), sample_ids=[4])
    with pytest.raises(TypeError, match="Sequential.*supported families"):
        method(nn.Sequential(nn.Linear(2, 2)), _images(1))


def test_random_scores_follow_the_ids_not_the_batch():
    model = _tiny_vit("token").eval()
    method = build_method("random", seed=3)
    x = _images(3)
    batched = method(model, x, sample_ids=[7, 8, 9])
    reordered = method(model, x.flip(0), sample_ids=[9, 8, 7])
    torch.testing.assert_close(batched, reordered.flip(0), rtol=0, atol=0)
    assert not torch.equal(batched[0], method(model, x[:1], sample_ids=[8])[0])


def test_readme_holds_the_current_conformance_matrix():
    """``python -m tests.families.matrix --write`` after adding a family or a method."""
    assert readme_table(README.read_text()) == markdown()
