"""The generic baselines (saliency, input x gradient, integrated gradients, SmoothGrad / VarGrad, occlusion,
KernelSHAP, LIME) and the explanation targets: Captum 0.9.0 goldens, batched == alone, axioms.

Captum is driven through :func:`methods.captum_bridge.captum_forward` (the model's own forward from the input
point on); its element-wise maps are reduced per token / patch as the methods reduce theirs. Float64 throughout.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from methods import build_method
from methods.adapters import adapter_for
from methods.captum_bridge import captum_forward
from methods.input_points import logits_at, point_values, resolve_point, select_rows
from methods.integrated_gradients import QUADRATURES, default_baseline, quadrature
from tests.families import FAMILIES
from tests.generic_baselines_support import (
    GOLDEN_FAMILIES,
    assert_batched_equals_alone,
    captum_surrogate,
    family,
    reduced,
    sample_seed,
    samples,
)

captum_attr = pytest.importorskip("captum.attr")
TARGETS = torch.tensor([1, 4, 0])


def _golden_inputs(name):
    fam = family(name)
    return fam, fam.build().eval(), fam.inputs(3)


def _close(ours, theirs, tol=1e-6):
    scale = max(1.0, float(theirs.detach().abs().max()))
    diff = float((ours - theirs.detach()).abs().max())
    assert diff <= tol * scale, f"max abs diff {diff:.2e} (scale {scale:.2e})"
    return diff


# ------------------------------------------------------------------------------------------ Captum goldens
@pytest.mark.parametrize("name", GOLDEN_FAMILIES)
def test_saliency_and_input_x_gradient_equal_captum(name):
    fam, model, inputs = _golden_inputs(name)
    forward, x, extra = captum_forward(model, inputs)
    with torch.enable_grad():
        grads = captum_attr.Saliency(forward).attribute(x, target=TARGETS, abs=False, additional_forward_args=extra)
        ixg = captum_attr.InputXGradient(forward).attribute(x, target=TARGETS, additional_forward_args=extra)
    assert grads.dtype == torch.float64 and grads.abs().sum() > 0
    for reduction, values, inner in (("abs", grads.abs(), "sum"), ("signed", grads, "sum"), ("l2", grads, "l2")):
        ours = build_method("saliency", reduction=reduction)(model, inputs, target=TARGETS)
        _close(ours, reduced(model, inputs, values, inner))
    _close(build_method("input_x_gradient")(model, inputs, target=TARGETS), reduced(model, inputs, ixg))


@pytest.mark.parametrize("name", GOLDEN_FAMILIES)
@pytest.mark.parametrize("method", ["gausslegendre", "riemann_trapezoid"])
def test_integrated_gradients_equal_captum(name, method):
    """Captum's Riemann nodes are float32 (``torch.linspace(...).tolist()``), ours float64: on the families' sharp
    tiny models that 1e-8 shift moves the maps by up to 2e-5, so the Riemann goldens run on the smoothed model."""
    fam, model, inputs = _golden_inputs(name)
    if method != "gausslegendre":
        model = _smooth(model)
    forward, x, extra = captum_forward(model, inputs)
    ours = build_method("integrated_gradients", steps=12, method=method, internal_batch_size=7)
    adapter, batch = adapter_for(model), adapter_for(model).inputs.prepare(inputs)
    point = resolve_point(adapter, "auto", "test")
    baseline = ours.baseline_at(adapter, batch, point, x)
    with torch.enable_grad():
        theirs = captum_attr.IntegratedGradients(forward).attribute(
            x, baselines=baseline, target=TARGETS, additional_forward_args=extra, n_steps=12, method=method)
    _close(ours(model, inputs, target=TARGETS), reduced(model, inputs, theirs))


def test_integrated_gradients_pad_baseline_equals_captums_tutorial_ids():
    """Captum's BERT tutorial: ``[CLS] [PAD] ... [SEP]`` baseline ids through ``LayerIntegratedGradients`` on the
    word embeddings."""
    fam, model, inputs = _golden_inputs("hf_bert_types_special")
    ids = inputs["input_ids"]
    reference = torch.where(inputs["special_tokens_mask"].bool(), ids, torch.zeros_like(ids))
    rest = {k: v for k, v in inputs.items() if k not in ("input_ids", "special_tokens_mask")}

    def forward(input_ids):
        n = input_ids.shape[0] // ids.shape[0]
        return model(input_ids=input_ids, **{k: v.repeat(n, 1) for k, v in rest.items()}).logits
    layer = captum_attr.LayerIntegratedGradients(forward, model.bert.embeddings.word_embeddings)
    with torch.enable_grad():
        theirs = layer.attribute(ids, baselines=reference, target=TARGETS, n_steps=16)
    ours = build_method("integrated_gradients", steps=16, baseline="pad")(model, inputs, target=TARGETS)
    _close(ours, reduced(model, inputs, theirs))


def test_quadratures_equal_captums():
    from captum.attr._utils.approximation_methods import approximation_parameters
    for method in QUADRATURES:
        step_sizes, alphas = approximation_parameters(method)
        ours_alphas, ours_weights = quadrature(method, 9)
        np.testing.assert_allclose(ours_alphas.numpy(), alphas(9), rtol=0, atol=1e-7)
        np.testing.assert_allclose(ours_weights.numpy(), step_sizes(9), rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------ explanation targets
@pytest.mark.parametrize("name", ["hf_gpt2_left", "timm_vit_cls"])
def test_explanation_targets_equal_captum_on_the_transformed_output(name):
    fam, model, inputs = _golden_inputs(name)
    forward, x, extra = captum_forward(model, inputs)
    foil = torch.tensor([2, 2, 3])

    def transformed(explain):
        def output(values, *args):
            z = forward(values, *args)
            if explain in ("probability", "probability_difference"):
                z = z.softmax(-1)
            elif explain == "log_probability":
                z = z.log_softmax(-1)
            if explain.endswith("difference"):
                z = z - z[torch.arange(z.shape[0]), foil.repeat(z.shape[0] // 3)][:, None]
            return z
        return output
    for explain in ("probability", "log_probability", "logit_difference", "probability_difference"):
        with torch.enable_grad():
            theirs = captum_attr.InputXGradient(transformed(explain)).attribute(
                x, target=TARGETS, additional_forward_args=extra)
        call = {"foil": foil} if explain.endswith("difference") else {}
        _close(build_method("input_x_gradient", explain=explain)(model, inputs, target=TARGETS, **call),
               reduced(model, inputs, theirs))
    ig = build_method("integrated_gradients", steps=8, explain="logit_difference", foil=2)
    by_call = ig(model, inputs, target=TARGETS, foil=2)
    torch.testing.assert_close(ig(model, inputs, target=TARGETS), by_call, rtol=0, atol=0)
    plain = build_method("integrated_gradients", steps=8)
    torch.testing.assert_close(by_call, plain(model, inputs, target=TARGETS) - plain(model, inputs, target=2),
                               rtol=0, atol=1e-10)


def test_foil_errors_are_named():
    fam, model, inputs = _golden_inputs("hf_bert")
    with pytest.raises(ValueError, match="foil= is read only"):
        build_method("saliency")(model, inputs, foil=1)
    with pytest.raises(ValueError, match="give foil="):
        build_method("saliency", explain="logit_difference")(model, inputs)
    with pytest.raises(ValueError, match="explain must be one of"):
        build_method("saliency", explain="prob")
    with pytest.raises(ValueError, match="foil=3 is read only"):
        build_method("integrated_gradients", foil=3)
    with pytest.raises(ValueError, match="needs an image model"):
        build_method("saliency", point="pixels")(model, inputs)
    with pytest.raises(ValueError, match="config does not name"):
        build_method("integrated_gradients", baseline="mask", steps=4)(model, inputs)


# ------------------------------------------------------------------------------------------ batched == alone
GRADIENT_METHODS = {"saliency": {}, "input_x_gradient": {}, "integrated_gradients": {"steps": 4},
                    "saliency_l2_pixels": {"reduction": "l2"}}


@pytest.mark.parametrize("name", ["timm_vit_cls", "hf_bert_types_special", "hf_gpt2_left", "hf_qwen3_right",
                                  "hf_clip_text"])
def test_batched_equals_alone_at_1_3_16(name):
    fam = family(name)
    model = fam.build().eval()
    pool = samples(fam)
    for method_name, options in GRADIENT_METHODS.items():
        method = build_method(method_name.split("_l2")[0], **options)
        assert_batched_equals_alone(fam, model, method, pool, method_name)


# ------------------------------------------------------------------------------------------ completeness
def _smooth(model):
    """The family's tiny model with every parameter times 1/4: the families sharpen their query / key weights
    (near-hard attention), so the logit along the straight path jumps within ~1e-3 of it and no 64-point
    quadrature can integrate it (measured: gaps of 0.1-100x at 64 steps, converging at 1024); a quarter of the
    weights makes the attention logits ~16x flatter and the path smooth."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.25)
    return model


def _completeness_gap(model, inputs, method):
    attr = method(model, inputs, target=TARGETS)
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare(inputs)
    point = resolve_point(adapter, method.point, "test")
    x = point_values(adapter, batch, point)
    start = method.baseline_at(adapter, batch, point, x)
    with torch.no_grad():
        change = (logits_at(adapter, batch, point, x) - logits_at(adapter, batch, point, start))[torch.arange(3),
                                                                                                TARGETS]
    return ((attr.flatten(1).sum(dim=1) - change).abs() / change.abs()), change


#: DistilBERT (word + position embeddings, then a LayerNorm): from the zero word embedding its tiny model's path
#: holds a jump that 64 steps miss (measured: relative gaps 1e-2 to 0.65); its completeness is checked with the
#: [PAD] baseline, which avoids it
COMPLETENESS_BASELINE = {"hf_distilbert_special": "pad"}


#: the families whose completeness runs in the default suite (every family: ``-m slow``, about a minute)
FAST_COMPLETENESS = ("timm_vit_cls", "hf_bert", "hf_gpt2_left", "hf_qwen3_right", "hf_clip_text", "hf_siglip_vision")


@pytest.mark.parametrize("fam", [pytest.param(f, marks=() if f.name in FAST_COMPLETENESS else pytest.mark.slow)
                                 for f in FAMILIES], ids=lambda f: f.name)
def test_integrated_gradients_completeness_at_64_steps(fam):
    model = _smooth(fam.build().eval())
    method = build_method("integrated_gradients", steps=64, baseline=COMPLETENESS_BASELINE.get(fam.name, "auto"))
    gap, change = _completeness_gap(model, fam.inputs(3), method)
    assert (change.abs() > 1e-6).all()
    assert (gap <= 1e-3).all(), gap


@pytest.mark.parametrize("name", ["hf_llama_gqa_left", "hf_gemma3_left", "hf_modernbert_mean_local_global",
                                  "hf_deberta_v3"])
def test_models_that_normalise_the_word_embeddings_alone_default_to_the_pad_baseline(name):
    """From the zero embedding the normalised input of an RMSNorm decoder, ModernBERT or DeBERTa-v3 (a norm of the
    word embeddings with nothing added) jumps to its full value at the start of the path: completeness fails at 64
    steps (asserted: > 1e-2), which the pad-id default avoids; BERT (positions added) and GPT-2 keep zero."""
    assert default_baseline(adapter_for(family("hf_bert").build())) == "zero"
    assert default_baseline(adapter_for(family("hf_gpt2_left").build())) == "zero"
    fam = family(name)
    assert default_baseline(adapter_for(fam.build())) == "pad"
    model = _smooth(fam.build().eval())
    zero_gap, _ = _completeness_gap(model, fam.inputs(3), build_method("integrated_gradients", steps=64,
                                                                       baseline="zero"))
    assert zero_gap.max() > 1e-2
    method = build_method("integrated_gradients", steps=64)
    assert method.baseline == "auto"
    gap, _ = _completeness_gap(model, fam.inputs(3), method)
    assert (gap <= 1e-3).all()


def test_image_baselines():
    from methods.input_baselines import baseline_images, gaussian_blur
    images = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    black = baseline_images(images, "black", "t")
    torch.testing.assert_close(black[0, :, 0, 0] * torch.tensor([0.229, 0.224, 0.225], dtype=torch.float64),
                               -torch.tensor([0.485, 0.456, 0.406], dtype=torch.float64))
    flat = torch.ones(1, 3, 16, 16, dtype=torch.float64)
    torch.testing.assert_close(gaussian_blur(flat, 2.0), flat)
    blurred = baseline_images(images, "blur", "t", blur_sigma=1.0)
    assert blurred.std() < images.std()
    with pytest.raises(ValueError, match="shape"):
        baseline_images(images, torch.zeros(3, 8, 8), "t")


# ------------------------------------------------------------------------------------------ sampling methods
@pytest.mark.parametrize("name", ["timm_vit_cls", "hf_bert_types_special", "hf_qwen3_right"])
@pytest.mark.parametrize("nt_type,inner,noise", [("smoothgrad", "saliency", "absolute"),
                                                 ("smoothgrad_sq", "input_x_gradient", "relative"),
                                                 ("vargrad", "integrated_gradients", "absolute")])
def test_noise_tunnel_equals_captum_fed_the_same_noise(name, nt_type, inner, noise):
    fam = family(name)
    model = fam.build().eval()
    sample = fam.single(fam.inputs(3), 0)
    options = {"steps": 4} if inner == "integrated_gradients" else {}
    ours = build_method({"smoothgrad_sq": "smoothgrad_squared"}.get(nt_type, nt_type), method=inner, samples=4,
                        stdevs=0.3, noise=noise, seed=5, options=options)
    got = ours(model, sample, target=1, sample_ids=[7])
    forward, x, extra = captum_forward(model, sample)
    sigma = 0.3 * float(x.max() - x.min()) if noise == "relative" else 0.3
    kwargs = {"n_steps": 4, "baselines": ours._inner.baseline_at(
        adapter_for(model), adapter_for(model).inputs.prepare(sample), resolve_point(adapter_for(model), "auto", "t"),
        x)} if inner == "integrated_gradients" else {}
    captum_inner = {"saliency": captum_attr.Saliency, "input_x_gradient": captum_attr.InputXGradient,
                    "integrated_gradients": captum_attr.IntegratedGradients}[inner](forward)
    torch.manual_seed(sample_seed(model, sample, 5, "noise"))
    with torch.enable_grad():
        theirs = captum_attr.NoiseTunnel(captum_inner).attribute(
            x, nt_type=nt_type, nt_samples=4, stdevs=sigma, target=1, additional_forward_args=extra, **kwargs)
    _close(got, reduced(model, sample, theirs))


def _feature_mask(model, sample):
    """Captum's feature mask of ``sample`` (batch 1): content position / patch ``k`` -> ``k``; the special tokens
    join feature 0 (their baseline is their own value, so they change nothing)."""
    adapter, batch, point, layout = captum_view_of(model, sample)
    x = point_values(adapter, batch, point)
    if point == "pixels":
        rows, cols = layout.grid
        ids = torch.arange(rows * cols).reshape(rows, cols)
        ids = ids.repeat_interleave(x.shape[-2] // rows, 0).repeat_interleave(x.shape[-1] // cols, 1)
        return ids[None, None].expand_as(x).contiguous(), x
    content = layout.content_positions(batch["input_ids"])[0]
    ids = torch.zeros(content.shape[0], dtype=torch.long)
    ids[content] = torch.arange(int(content.sum()))
    return ids[None, :, None].expand_as(x).contiguous(), x


def captum_view_of(model, sample):
    from tests.generic_baselines_support import captum_view
    return captum_view(model, sample)


@pytest.mark.parametrize("name", ["timm_vit_cls", "hf_bert_types_special", "hf_gpt2_left", "hf_clip_text"])
@pytest.mark.parametrize("kind", ["kernel_shap", "lime"])
def test_kernel_shap_and_lime_equal_captum_fed_the_same_coalitions(name, kind):
    fam = family(name)
    model = fam.build().eval()
    sample = fam.single(fam.inputs(3), 0)
    baseline = "pad" if name in ("hf_bert_types_special", "hf_gpt2_left") else "zero"
    options = {"end_weight": 1e6} if kind == "kernel_shap" else {}
    got = build_method(kind, samples=30, seed=3, baseline=baseline, **options)(model, sample, target=1,
                                                                               sample_ids=[7])
    forward, x, extra = captum_forward(model, sample)
    mask, _ = _feature_mask(model, sample)
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare(sample)
    from methods.input_baselines import baseline_values
    point = resolve_point(adapter, "auto", "t")
    start = baseline_values(adapter, batch, point, baseline, "t", x)
    if point == "embedding":   # only features are replaced: the special tokens keep their values
        content = adapter.inputs.layout(batch).content_positions(batch["input_ids"])[0]
        start = torch.where(content[None, :, None], start, x)
    explainer = captum_surrogate(kind, forward)
    torch.manual_seed(sample_seed(model, sample, 3, kind))
    theirs = explainer.attribute(x, baselines=start, target=1, additional_forward_args=extra, feature_mask=mask,
                                 n_samples=30, return_input_shape=False)
    layout = adapter.inputs.layout(batch)
    ours = got[0] if point == "pixels" else got[0][layout.content_positions(batch["input_ids"])[0]]
    _close(ours, theirs[0].double())


@pytest.mark.parametrize("name,uneven", [("timm_vit_cls", False), ("timm_vit_cls", True),
                                         ("hf_bert_types_special", False), ("hf_gpt2_left", False),
                                         ("hf_clip_vision", False)])
def test_occlusion_equals_captum(name, uneven):
    """``uneven``: a stride that does not divide ``size - window``, so the last window is cut at the edge."""
    fam, model, inputs = _golden_inputs(name)
    forward, x, extra = captum_forward(model, inputs)
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare(inputs)
    point = resolve_point(adapter, "auto", "t")
    layout = adapter.inputs.layout(batch)
    if point == "pixels":
        rows, cols = layout.grid
        patch = x.shape[-2] // rows
        step = patch // 2 + 1 if uneven else patch // 2
        assert ((x.shape[-2] - patch) % step != 0) == uneven
        ours = build_method("occlusion", window=patch, stride=step, baseline="black")(model, inputs, target=TARGETS)
        from methods.input_baselines import baseline_images
        with torch.no_grad():
            theirs = captum_attr.Occlusion(forward).attribute(
                x, sliding_window_shapes=(3, patch, patch), strides=(3, step, step),
                baselines=baseline_images(x, "black", "t"), target=TARGETS, additional_forward_args=extra)
        theirs = theirs.mean(dim=1).reshape(3, rows, patch, cols, patch).mean(dim=(2, 4)).flatten(1)
    else:
        ours = build_method("occlusion", baseline="pad")(model, inputs, target=TARGETS)
        from methods.input_baselines import baseline_values
        start = baseline_values(adapter, batch, point, "pad", "t", x)
        mask = torch.arange(x.shape[1])[None, :, None].expand_as(x).contiguous()
        with torch.no_grad():
            theirs = captum_attr.FeatureAblation(forward).attribute(
                x, baselines=start, target=TARGETS, additional_forward_args=extra, feature_mask=mask)
        theirs = layout.output(theirs[..., 0])
    _close(ours, theirs)


SAMPLING = {"smoothgrad": {"samples": 3}, "vargrad": {"samples": 2, "method": "integrated_gradients",
                                                        "options": {"steps": 3}, "noise": "relative"},
            "smoothgrad_squared": {"samples": 2, "method": "input_x_gradient"},
            "occlusion": {}, "kernel_shap": {"samples": 12}, "lime": {"samples": 12}}


@pytest.mark.parametrize("name", [pytest.param("timm_vit_cls", marks=pytest.mark.slow), "hf_bert_types_special",
                                  pytest.param("hf_gpt2_left", marks=pytest.mark.slow),
                                  pytest.param("hf_qwen3_right", marks=pytest.mark.slow)])
def test_sampling_methods_batched_equal_alone_at_1_3_16(name):
    fam = family(name)
    model = fam.build().eval()
    pool = samples(fam)
    for method_name, options in SAMPLING.items():
        method = build_method(method_name, **options)
        alone = assert_batched_equals_alone(fam, model, method, pool, method_name, id_offset=40)
        other_seed = build_method(method_name, **options)(model, pool[0], target=0, sample_ids=[41])
        if method_name != "occlusion":
            assert not torch.equal(other_seed, alone[0]), f"{method_name}: the sample id changes no draw"


# ------------------------------------------------------------------------------------------ axioms
@pytest.mark.parametrize("name", ["timm_vit_cls", "hf_bert_types_special", "hf_llama_gqa_left", "hf_clip_text"])
def test_kernel_shap_efficiency(name):
    fam, model, inputs = _golden_inputs(name)
    method = build_method("kernel_shap", samples=40, baseline="zero")
    scores = method(model, inputs, target=TARGETS, sample_ids=[1, 2, 3])
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare(inputs)
    point = resolve_point(adapter, "auto", "t")
    x = point_values(adapter, batch, point)
    from methods.feature_replacement import feature_positions, replaced_values
    from methods.input_baselines import baseline_values
    start = baseline_values(adapter, batch, point, "zero", "t", x)
    rows = []
    for b, p in enumerate(feature_positions(adapter, batch)):
        rows.append(replaced_values(adapter, batch, b, torch.zeros(1, len(p), dtype=torch.bool), x, start))
    with torch.no_grad():
        full = logits_at(adapter, batch, point, x)[torch.arange(3), TARGETS]
        empty = logits_at(adapter, batch, point, torch.cat(rows))[torch.arange(3), TARGETS]
    gap = (scores.sum(dim=1) - (full - empty)).abs()
    assert (gap <= 1e-6 * (full - empty).abs().clamp(min=1)).all(), gap


@pytest.mark.parametrize("name", ["timm_vit_cls", "hf_bert_types_special", "hf_gpt2_left"])
def test_one_feature_occlusion_is_the_drop_when_it_is_replaced(name):
    fam, model, inputs = _golden_inputs(name)
    scores = build_method("occlusion", baseline="zero")(model, inputs, target=TARGETS)
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare(inputs)
    point = resolve_point(adapter, "auto", "t")
    x = point_values(adapter, batch, point)
    from methods.feature_replacement import feature_positions, replaced_values
    from methods.input_baselines import baseline_values
    start = baseline_values(adapter, batch, point, "zero", "t", x)
    with torch.no_grad():
        full = logits_at(adapter, batch, point, x)[torch.arange(3), TARGETS]
    for b, positions in enumerate(feature_positions(adapter, batch)):
        j = len(positions) // 2
        present = torch.ones(1, len(positions), dtype=torch.bool)
        present[0, j] = False
        values = replaced_values(adapter, batch, b, present, x, start)
        with torch.no_grad():
            dropped = logits_at(adapter, select_rows(batch, torch.tensor([b])), point, values)[0, TARGETS[b]]
        assert torch.equal(scores[b, positions[j]], full[b] - dropped) or \
            abs(float(scores[b, positions[j]] - (full[b] - dropped))) <= 1e-12


@pytest.mark.parametrize("name", ["timm_vit_cls", "hf_bert_types_special", "hf_llama_gqa_left", "hf_clip_vision"])
def test_attnlrp_without_rules_is_input_x_gradient(name):
    fam, model, inputs = _golden_inputs(name)
    lrp = build_method("attnlrp", rules=False)(model, inputs, target=TARGETS)
    torch.testing.assert_close(lrp, build_method("input_x_gradient", point="embedding")(model, inputs,
                                                                                       target=TARGETS),
                               rtol=0, atol=1e-13 * float(lrp.abs().max()))
    if fam.name.startswith("timm"):
        pixels = build_method("attnlrp", rules=False, level="patches")(model, inputs, target=TARGETS)
        torch.testing.assert_close(pixels, build_method("input_x_gradient")(model, inputs, target=TARGETS),
                                   rtol=0, atol=1e-13 * float(pixels.abs().max()))


def test_methods_null_leaves_the_opt_in_baselines_out():
    from evaluation.method_specs import parse_methods
    from methods import available_methods
    generic = set(available_methods(tag="generic_baseline"))
    assert generic == {"saliency", "input_x_gradient", "integrated_gradients", "smoothgrad", "smoothgrad_squared",
                       "vargrad", "occlusion", "kernel_shap", "lime"}
    assert not generic & set(parse_methods(None)) and generic <= set(parse_methods("all"))
    assert set(parse_methods(["rollout", "tag:generic_baseline"])) == generic | {"rollout"}
    with pytest.raises(ValueError, match="no registered method carries the tag 'nope'"):
        parse_methods(["tag:nope"])
