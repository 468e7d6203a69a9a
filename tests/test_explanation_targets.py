"""``explain=`` / ``foil=`` on the attention-gradient and relevance methods that existed before the generic baselines
(Grad-CAM, Generic Attribution, CDAM, AttnLRP, CP-LRP, Transformer Attribution): the logit difference is the logit
of a head whose target row is the target's minus the foil's, the maps linear in the output gradient follow the
chain rule, and Transformer Attribution's gradients and relevance both start from the explained output."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from methods import build_method
from methods.adapters import adapter_for
from methods.attention_gradients import attention_and_gradients
from methods.lrp import LRPEngine
from tests.generic_baselines_support import family

FAMILIES = ("timm_vit_cls", "hf_bert")
TARGET, FOIL = 1, 3
#: the methods whose map is linear in the gradient of the explained output (x * dy/dx at some tensor)
LINEAR = ("cdam", "attnlrp", "cp_lrp")
#: every method given the option here whose scores come from gradients only (no LRP relevance seed)
GRADIENT_ONLY = ("gradcam", "generic_attribution") + LINEAR


def _head(model: nn.Module) -> nn.Linear:
    head = model.head if hasattr(model, "head") else model.classifier
    assert isinstance(head, nn.Linear)
    return head


def _difference_head(model: nn.Module, target: int, foil: int) -> nn.Module:
    """A copy of ``model`` whose logit ``target`` is the original's ``z_target - z_foil``."""
    other = copy.deepcopy(model)
    head = _head(other)
    with torch.no_grad():
        head.weight[target] = head.weight[target] - head.weight[foil]
        head.bias[target] = head.bias[target] - head.bias[foil]
    return other


def _two_classes(model: nn.Module) -> nn.Module:
    """A copy of ``model`` reading only its first two classes (a 2-class head)."""
    other = copy.deepcopy(model)
    head = _head(other)
    small = nn.Linear(head.in_features, 2).to(head.weight.dtype)
    with torch.no_grad():
        small.weight.copy_(head.weight[:2])
        small.bias.copy_(head.bias[:2])
    if hasattr(other, "head"):
        other.head = small
    else:
        other.classifier = small
    return other


def _setup(name: str):
    fam = family(name)
    model = fam.build().eval()
    inputs = fam.inputs(3)
    with torch.no_grad():
        probs = fam.logits(model, inputs).softmax(dim=-1)
    return model, inputs, probs


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("method", GRADIENT_ONLY)
def test_logit_difference_is_the_logit_of_a_difference_head(name, method):
    model, inputs, _ = _setup(name)
    ours = build_method(method, explain="logit_difference")(model, inputs, target=TARGET, foil=FOIL)
    theirs = build_method(method)(_difference_head(model, TARGET, FOIL), inputs, target=TARGET)
    assert ours.abs().max() > 0
    torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-12)
    # the foil given when the method is built, per row as a tensor, is the same foil
    built = build_method(method, explain="logit_difference", foil=FOIL)(model, inputs, target=TARGET)
    torch.testing.assert_close(built, ours, rtol=0, atol=0)
    rows = build_method(method, explain="logit_difference")(model, inputs, target=TARGET,
                                                           foil=torch.full((3,), FOIL))
    torch.testing.assert_close(rows, ours, rtol=0, atol=0)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("method", LINEAR)
def test_maps_linear_in_the_output_gradient_follow_the_chain_rule(name, method):
    model, inputs, p = _setup(name)
    classes = p.shape[-1]
    per_class = torch.stack([build_method(method)(model, inputs, target=c) for c in range(classes)])  # [C, B, N]
    expected_log = per_class[TARGET] - torch.einsum("bc,cbn->bn", p, per_class)     # d log p_t = dz_t - sum p dz
    expected = {
        "logit_difference": per_class[TARGET] - per_class[FOIL],
        "log_probability": expected_log,
        "probability": p[:, TARGET, None] * expected_log,
        "probability_difference": p[:, TARGET, None] * expected_log
        - p[:, FOIL, None] * (per_class[FOIL] - torch.einsum("bc,cbn->bn", p, per_class)),
    }
    for explain, want in expected.items():
        call = {"foil": FOIL} if explain.endswith("difference") else {}
        got = build_method(method, explain=explain)(model, inputs, target=TARGET, **call)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12, msg=f"{method} explain={explain}")
    assert not torch.allclose(expected["probability"], per_class[TARGET])


@pytest.mark.parametrize("name", FAMILIES)
def test_attention_gradients_of_a_probability_follow_the_chain_rule(name):
    """Grad-CAM's and Generic Attribution's gradients (nonlinear maps of them: checked at the gradients)."""
    model, inputs, p = _setup(name)
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare(inputs)
    layers = list(range(len(adapter.blocks)))
    with adapter.recording.eager_attention():
        per_class = [attention_and_gradients(adapter, batch, c, layers)[1] for c in range(p.shape[-1])]
        for explain in ("probability", "logit_difference"):
            foil = FOIL if explain == "logit_difference" else None
            grads = attention_and_gradients(adapter, batch, TARGET, layers, explain, foil)[1]
            for layer in layers:
                stacked = torch.stack([g[layer] for g in per_class])          # [C, B, H, N, N]
                if explain == "probability":
                    mean = torch.einsum("bc,cbhij->bhij", p, stacked)
                    want = p[:, TARGET, None, None, None] * (stacked[TARGET] - mean)
                else:
                    want = stacked[TARGET] - stacked[FOIL]
                torch.testing.assert_close(grads[layer], want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", FAMILIES)
def test_transformer_attribution_starts_its_relevance_and_gradients_from_the_explained_output(name):
    """On a 2-class head ``dp_0/dz = p_0 p_1 (e_0 - e_1)``: the relevance pass starts from it and the gradients of
    ``p_0`` are ``p_0 p_1`` times those of the logit difference, block by block. (The relevance of the attention
    maps themselves is ~1e-12 on these tiny models, where the rules' 1e-9 stabilisers break its homogeneity.)"""
    model, inputs, _ = _setup(name)
    model = _two_classes(model)
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare(inputs)
    layers = list(range(len(adapter.blocks)))
    engine = LRPEngine("ours")
    with adapter.recording.eager_attention():
        diff = engine.run(adapter, batch, 0, cam_layers=layers, grad_layers=layers,
                          explained=build_method("transformer_attribution", explain="logit_difference",
                                                 foil=1).explained())
        prob = engine.run(adapter, batch, 0, cam_layers=layers, grad_layers=layers,
                          explained=build_method("transformer_attribution", explain="probability").explained())
        logit = engine.run(adapter, batch, 0, cam_layers=layers, grad_layers=layers,
                           explained=lambda z, t: z.gather(1, t[:, None])[:, 0])
        plain = engine.run(adapter, batch, 0, cam_layers=layers, grad_layers=layers)
    p = diff.logits.softmax(dim=-1)
    scale = p[:, 0] * p[:, 1]
    # the relevance pass starts from dy/dz: e_0 - e_1 for the logit difference, p_0 p_1 (e_0 - e_1) for p_0
    assert diff.seed is not None and prob.seed is not None and plain.seed is None
    torch.testing.assert_close(diff.seed, torch.tensor([[1.0, -1.0]], dtype=p.dtype).expand(3, 2), rtol=0, atol=0)
    torch.testing.assert_close(prob.seed, scale[:, None] * diff.seed, rtol=1e-12, atol=0)
    for layer in layers:
        torch.testing.assert_close(prob.attn_grad[layer], scale[:, None, None, None] * diff.attn_grad[layer],
                                   rtol=1e-9, atol=1e-12)
        # the logit as an explained output is the engine's own one-hot start, to the bit
        torch.testing.assert_close(logit.attn_cam[layer], plain.attn_cam[layer], rtol=0, atol=0)
        torch.testing.assert_close(logit.attn_grad[layer], plain.attn_grad[layer], rtol=0, atol=0)
    assert not torch.allclose(diff.attn_cam[layers[-1]], plain.attn_cam[layers[-1]])
    ours = build_method("transformer_attribution", explain="logit_difference")(model, inputs, target=0, foil=1)
    assert not torch.allclose(ours, build_method("transformer_attribution")(model, inputs, target=0))


def test_explain_options_are_checked():
    model, inputs, _ = _setup("hf_bert")
    with pytest.raises(ValueError, match="explain must be one of"):
        build_method("gradcam", explain="prob")
    with pytest.raises(ValueError, match="foil"):
        build_method("generic_attribution", explain="logit_difference")(model, inputs, target=TARGET)
    with pytest.raises(ValueError, match="foil= is read only"):
        build_method("cdam")(model, inputs, target=TARGET, foil=FOIL)
    with pytest.raises(ValueError, match="concept"):
        build_method("cdam", concept=[1.0] * 16, explain="probability")


@pytest.mark.parametrize("method", ["beyond_intuition_head", "beyond_intuition_token"])
def test_beyond_intuitions_gradient_of_is_the_explain_option(method):
    """``gradient_of="logit_difference"`` equals the logit of the difference head at every integration point (the
    reasoning feedback's gradients and the head-wise weights), with the foil as an int or one per row."""
    model, inputs, _ = _setup("hf_bert")
    options = {"steps": 4}
    ours = build_method(method, gradient_of="logit_difference", **options)(model, inputs, target=TARGET, foil=FOIL)
    theirs = build_method(method, **options)(_difference_head(model, TARGET, FOIL), inputs, target=TARGET)
    assert ours.abs().max() > 0
    torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-12)
    per_row = build_method(method, gradient_of="logit_difference", ig_batch_size=2, **options)(
        model, inputs, target=TARGET, foil=torch.full((3,), FOIL))
    torch.testing.assert_close(per_row, ours, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="gradient_of must be one of"):
        build_method(method, gradient_of="prob")
