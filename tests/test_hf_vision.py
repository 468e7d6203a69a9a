"""timm's distilled DeiT and the Hugging Face ViT-like classifiers beyond the conformance matrix: the read-out
rows they define, DINOv2's layer scales under LRP, the timm -> transformers conversion (the same maps from every
method) and loading ``hf:<folder>`` image classifiers."""
from __future__ import annotations

import copy
import json

import pytest
import torch

from methods import MethodUndefinedError, available_methods, build_method
from methods.adapters import adapter_for
from tests.families import _images
from tests.families.hf_vision import _perturbed, _tiny_hf, _tiny_timm_deit

transformers = pytest.importorskip("transformers")


def _last_attention(model, x):
    with torch.no_grad():
        return model(x, output_attentions=True).attentions[-1].mean(dim=1)    # [B, N, N], head mean


@pytest.mark.parametrize("kind", ["deit_teacher", "dinov2", "dinov2_registers", "deit"])
def test_readout_row_is_the_mean_of_the_rows_the_classifier_reads(kind):
    """raw_attention's read-out row: DeiT with teacher, the mean of the [CLS] and distillation rows; DINOv2, half
    the [CLS] row and half the mean patch row (registers neither read nor scored); DeiT without teacher, [CLS]."""
    model = _tiny_hf(kind)
    model.set_attn_implementation("eager")
    x = _images(2)
    attn = _last_attention(model, x)
    prefix = adapter_for(model).num_prefix_tokens
    if kind == "deit_teacher":
        row = attn[:, :2].mean(dim=1)
    elif kind == "deit":
        row = attn[:, 0]
    else:
        row = 0.5 * attn[:, 0] + 0.5 * attn[:, prefix:].mean(dim=1)
    ours = build_method("raw_attention")(model, x)
    torch.testing.assert_close(ours, row[:, prefix:], rtol=1e-6, atol=1e-9)
    cls_only = build_method("raw_attention", readout="class_token")(model, x)
    torch.testing.assert_close(cls_only, attn[:, 0, prefix:], rtol=1e-6, atol=1e-9)


def test_timm_deit_readout_averages_both_prefix_rows():
    model = _tiny_timm_deit()
    x = _images(2)
    rows = {}
    for readout in ("auto", "class_token"):
        rows[readout] = build_method("rollout", readout=readout)(model, x)
    assert not torch.allclose(rows["auto"], rows["class_token"])
    with pytest.raises(ValueError, match="readout='weighted' needs a model read out as a weighted mean"):
        build_method("rollout", readout="weighted")(_tiny_hf("vit"), x)


def _fold_layer_scales(model):
    """The same function with every layer scale folded into the Linear layer before it (scales set to 1)."""
    folded = copy.deepcopy(model)
    with torch.no_grad():
        for layer in folded.dinov2.encoder.layer:
            for scale, linear in ((layer.layer_scale1, layer.attention.o_proj), (layer.layer_scale2, layer.mlp.fc2)):
                linear.weight.mul_(scale.lambda1[:, None])
                linear.bias.mul_(scale.lambda1)
                scale.lambda1.fill_(1.0)
    return folded


@pytest.mark.parametrize("name", ["lrp", "transformer_attribution"])
def test_dinov2_layer_scales_are_folded_into_the_linear_before_them(name):
    model = _tiny_hf("dinov2")
    with torch.no_grad():
        for layer in model.dinov2.encoder.layer:     # mixed signs: a scale < 0 flips the alpha-beta rule's split
            layer.layer_scale1.lambda1.copy_(torch.linspace(-1.5, 2.0, 24, dtype=torch.float64))
            layer.layer_scale2.lambda1.copy_(torch.linspace(2.0, -0.5, 24, dtype=torch.float64))
    folded = _fold_layer_scales(model)
    x = _images(2)
    torch.testing.assert_close(model(x).logits, folded(x).logits, rtol=1e-9, atol=1e-12)
    method = build_method(name)
    ours, reference = method(model, x, target=1), method(folded, x, target=1)
    torch.testing.assert_close(ours, reference, rtol=1e-7, atol=1e-9 * float(reference.abs().max()))


def test_dinov2_swiglu_has_no_lrp_but_attnlrp():
    model = _tiny_hf("dinov2_swiglu")
    x = _images(2)
    with pytest.raises(MethodUndefinedError, match=r"gated MLP Dinov2SwiGLUFFN \(SwiGLU\)"):
        build_method("transformer_attribution")(model, x)
    scores = build_method("attnlrp")(model, x, target=1)
    assert scores.shape == (2, 16) and torch.isfinite(scores).all()


# ------------------------------------------------------------------------------------------ conversion
def _tiny_timm_vit():
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return _perturbed(VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=3, num_heads=2,
                                        num_classes=5))


PAIRS = {"vit": _tiny_timm_vit, "deit": _tiny_timm_deit}
_CONVERTED: dict = {}


def _pair(kind):
    from models.vit_conversion import hf_vit_from_timm

    if kind not in _CONVERTED:
        timm_model = PAIRS[kind]()
        _CONVERTED[kind] = (timm_model, hf_vit_from_timm(timm_model))
    return _CONVERTED[kind]


@pytest.mark.parametrize("kind", list(PAIRS))
def test_converted_model_gives_the_same_logits(kind):
    from models.vit_conversion import timm_to_hf_vit

    timm_model, hf_model = _pair(kind)
    expected = {"vit": "ViTForImageClassification", "deit": "DeiTForImageClassificationWithTeacher"}[kind]
    assert type(hf_model).__name__ == expected
    assert hf_model.config.layer_norm_eps == 1e-6
    x = _images(3)
    with torch.no_grad():
        theirs, ours = timm_model(x), hf_model(x).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    config, state = timm_to_hf_vit(timm_model)
    rebuilt = getattr(transformers, config.architectures[0])(config).double()
    rebuilt.load_state_dict(state, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x).logits, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", available_methods(opt_in=False))   # the opt-in generic baselines: the matrix
@pytest.mark.parametrize("kind", list(PAIRS))
def test_converted_model_gives_the_same_maps(kind, name):
    """Every registered method: the same map from the timm model and its transformers twin (1e-5 of the largest
    score, float64)."""
    timm_model, hf_model = _pair(kind)
    options = {"beyond_intuition_head": {"start_layer": 1, "steps": 4},
               "beyond_intuition_token": {"start_layer": 1, "steps": 4}}.get(name, {})
    method = build_method(name, **options)
    x = _images(2)
    target, ids = torch.tensor([1, 3]), torch.tensor([0, 1])
    theirs = method(timm_model, x, target=target, sample_ids=ids)
    ours = method(hf_model, x, target=target, sample_ids=ids)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5 * float(theirs.abs().max()))


def test_conversion_refuses_what_transformers_cannot_hold():
    from timm.models.vision_transformer import VisionTransformer

    from models.vit_conversion import hf_vit_from_timm

    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=2, num_classes=5,
                              global_pool="avg", reg_tokens=2, init_values=0.1)
    with pytest.raises(ValueError, match=r"global_pool='avg'.*register tokens.*layer scale ls1"):
        hf_vit_from_timm(model)


# ------------------------------------------------------------------------------------------ loading
def _save(folder, model, processor=True):
    model.save_pretrained(folder)
    if processor:
        transformers.ViTImageProcessor(image_mean=[0.5, 0.4, 0.3], image_std=[0.2, 0.25, 0.3],
                                       size={"height": 32, "width": 32}).save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("kind", ["vit", "deit_teacher", "dinov2_registers"])
def test_hf_folder_loads_as_its_architecture_with_its_normalisation(tmp_path, kind):
    from evaluation.classifier import Classifier
    from models.sources import load_model

    model = _tiny_hf(kind)
    folder = _save(tmp_path / kind, model)
    loaded = load_model(f"hf:{folder}")
    assert type(loaded) is type(model) and not loaded.training
    assert json.loads((tmp_path / kind / "config.json").read_text())["architectures"] == [type(model).__name__]
    x = _images(2)
    with torch.no_grad():
        torch.testing.assert_close(loaded.double()(x).logits, model(x).logits, rtol=1e-12, atol=1e-12)
    classifier = Classifier.from_model(loaded)
    assert classifier.mean == (0.5, 0.4, 0.3) and classifier.std == (0.2, 0.25, 0.3)
    assert loaded.pretrained_cfg["input_size"] == (3, 32, 32)
    assert build_method("rollout")(loaded, x.float()).shape == (2, 16)


def test_hf_image_folder_needs_a_normalisation(tmp_path):
    from models.sources import load_model

    folder = _save(tmp_path / "vit", _tiny_hf("vit"), processor=False)
    with pytest.raises(ValueError, match="has no preprocessor_config.json"):
        load_model(f"hf:{folder}")
    loaded = load_model(f"hf:{folder}", model_kwargs={"image_mean": [0.1, 0.2, 0.3], "image_std": 0.5})
    assert loaded.pretrained_cfg["mean"] == (0.1, 0.2, 0.3) and loaded.pretrained_cfg["std"] == (0.5,) * 3
    with pytest.raises(ValueError, match="image_std must be 3 numbers"):
        load_model(f"hf:{folder}", model_kwargs={"image_mean": 0.5, "image_std": [1.0, 2.0]})
    random = load_model(f"hf:{folder}", pretrained=False, model_kwargs={"image_mean": 0.5, "image_std": 0.5})
    assert type(random) is transformers.ViTForImageClassification
