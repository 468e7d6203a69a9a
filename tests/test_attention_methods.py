"""Attention- and gradient-based methods: agreement with the authors' outputs and the properties of the call.

Goldens (``../shared/golden``, see its README): ``te_vit`` (TE/MM code: raw attention, rollout, GradCAM, Generic
Attribution), ``bi_vit_cls`` (Beyond Intuition code: head-/token-wise, perception only, its Generic Attribution
variant, GradCAM, rollout, last attention), ``cdam_vit`` (CDAM notebook: CDAM for a class and a concept, TAM, its
copy of Generic Attribution, raw attention). Every class-specific golden is checked for the predicted and the other
class, with both targets of every image in ONE batched call (per-sample targets), on raw values (relative to the
largest golden value) and on per-sample min-max-normalised maps (within 1e-4).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn

timm = pytest.importorskip("timm")
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

from methods import available_methods, build_method, minmax_normalize, tokens_to_map  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "golden")
RAW_RTOL = 1e-5  # raw values: max |ours - golden| / max |golden|  (measured <= 9e-6, float32)
MAP_ATOL = 1e-4  # per-sample min-max-normalised maps (the tolerance)


def _load(name, **config):
    path = os.path.join(GOLDEN, f"{name}.npz")
    if not os.path.exists(path):
        pytest.fail(f"golden file {path} is missing (CI and every developer have ../shared)")
    z = np.load(path)
    sd = {k[2:]: torch.from_numpy(z[k]) for k in z.files if k.startswith("w/")}
    model = VisionTransformer(img_size=224, embed_dim=192, depth=4, num_heads=3, mlp_ratio=4, qkv_bias=True, **config)
    model.load_state_dict(sd, strict=True)
    return model.eval(), z


def _assert_matches(ours, golden, what, raw=True, raw_rtol=RAW_RTOL):
    ours = np.asarray(ours, dtype=np.float64)
    golden = np.asarray(golden, dtype=np.float64)
    assert ours.shape == golden.shape, (what, ours.shape, golden.shape)
    if raw:
        rel = np.abs(ours - golden).max() / np.abs(golden).max()
        assert rel <= raw_rtol, f"{what}: raw values differ by {rel:.2e} of the largest golden value"
    # The reference min-max normalises the whole map and returns NaN for a constant one; ours gives zeros there.
    ours_n = minmax_normalize(torch.from_numpy(ours)).numpy()
    golden_n = minmax_normalize(torch.from_numpy(np.nan_to_num(golden, nan=0.0))).numpy()
    err = np.abs(ours_n - golden_n).max()
    assert err <= MAP_ATOL, f"{what}: min-max-normalised maps differ by {err:.2e}"


@pytest.fixture(scope="module", autouse=True)
def _threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(min(2, previous))
    yield
    torch.set_num_threads(previous)


# ---------------------------------------------------------------------------------------------- te_vit (TE, MM)
@pytest.fixture(scope="module")
def te():
    model, z = _load("te_vit", patch_size=16, num_classes=1000)
    images = torch.from_numpy(z["images"])
    targets = torch.from_numpy(np.stack([z["pred_class"], z["other_class"]], 1)).long()  # [3, 2]
    return model, z, images, targets


def test_te_model_reproduces_reference_logits(te):
    model, z, images, _ = te
    with torch.no_grad():
        logits = model(images).numpy()
    assert np.abs(logits - z["logits_vit_new"]).max() < 1e-4


@pytest.mark.parametrize("name, options, key", [
    ("raw_attention", {}, "raw_attn"),
    ("rollout", {}, "rollout_s0"),
    ("rollout", {"start_layer": 1}, "rollout_s1"),
])
def test_te_class_agnostic_goldens(te, name, options, key):
    model, z, images, _ = te
    _assert_matches(build_method(name, **options)(model, images), z[f"{key}__tok"], key)


@pytest.mark.parametrize("name, options, key, raw", [
    ("gradcam", {}, "gradcam_attn", False),  # the reference min-max normalises inside (NaN for a zero map)
    ("generic_attribution", {}, "ga", True),
])
def test_te_class_specific_goldens(te, name, options, key, raw):
    model, z, images, targets = te
    batch = images.repeat_interleave(2, dim=0)  # image 0 pred, image 0 other, image 1 pred, ...
    ours = build_method(name, **options)(model, batch, target=targets.flatten())
    golden = z[f"{key}__tok"].reshape(6, -1)
    _assert_matches(ours, golden, key, raw=raw)
    if key == "gradcam_attn":
        nan_rows = np.isnan(golden).any(axis=1)
        assert nan_rows.any(), "the golden file has an all-zero GradCAM map (NaN after their min-max)"
        assert (ours[torch.from_numpy(nan_rows)] == 0).all()


# ---------------------------------------------------------------------------------------------- bi_vit_cls (BI)
@pytest.fixture(scope="module")
def bi():
    model, z = _load("bi_vit_cls", patch_size=16, num_classes=10)
    images = torch.from_numpy(z["inputs"])
    targets = torch.from_numpy(np.stack([z["target_top"], z["target_other"]])).long()  # [2 (top, other), 2 images]
    return model, z, torch.cat([images, images]), targets.flatten()


def _bi_golden(z, key):
    return np.concatenate([z[f"{key}_top"], z[f"{key}_other"]])


BI_CASES = []
for _s in (1, 2, 4):  # the authors' 1-based start layer; ours is s - 1
    BI_CASES += [
        ("beyond_intuition_head", {"start_layer": _s - 1}, f"ours_h_sl{_s}"),
        ("beyond_intuition_token", {"start_layer": _s - 1}, f"ours_t_sl{_s}"),
        ("beyond_intuition_head", {"start_layer": _s - 1, "reasoning_feedback": False}, f"ours_h_P_sl{_s}"),
        ("beyond_intuition_token", {"start_layer": _s - 1, "reasoning_feedback": False}, f"ours_t_P_sl{_s}"),
    ]
BI_CASES += [
    ("generic_attribution", {"start_layer": 0, "head_reduction": "mean_then_clamp"}, "genattr_sl1"),
    ("generic_attribution", {"start_layer": 1, "head_reduction": "mean_then_clamp"}, "genattr_sl2"),
    ("beyond_intuition_head", {"start_layer": 0, "ig_batch_size": 3}, "ours_h_sl1"),  # chunked IG steps
]


@pytest.mark.parametrize("name, options, key", BI_CASES, ids=[c[2] + ("_chunked" if "ig_batch_size" in c[1] else "")
                                                               for c in BI_CASES])
def test_bi_goldens(bi, name, options, key):
    model, z, images, targets = bi
    _assert_matches(build_method(name, **options)(model, images, target=targets), _bi_golden(z, key), key)


def test_bi_gradcam_golden(bi):
    model, z, images, targets = bi
    _assert_matches(build_method("gradcam")(model, images, target=targets), _bi_golden(z, "attn_gradcam"),
                    "attn_gradcam", raw=False)


@pytest.mark.parametrize("start", [0, 1])
def test_bi_rollout_golden(bi, start):
    model, z, images, _ = bi
    _assert_matches(build_method("rollout", start_layer=start)(model, images[:2]), z[f"rollout_sl{start}"],
                    f"rollout_sl{start}")


def test_bi_last_attention_golden(bi):
    """Their ``attn_last`` is the [CLS]-row head-mean attention of the last block, min-max normalised."""
    model, z, images, _ = bi
    _assert_matches(build_method("raw_attention")(model, images[:2]), z["attn_last"], "attn_last", raw=False)


def test_bi_start_layer_indexing_differs_from_golden_when_off_by_one(bi):
    """The 1-based -> 0-based conversion matters: the unconverted index gives a different map."""
    model, z, images, targets = bi
    ours = build_method("beyond_intuition_head", start_layer=1)(model, images, target=targets).numpy()
    golden = _bi_golden(z, "ours_h_sl1")
    assert np.abs(ours - golden).max() / np.abs(golden).max() > 1e-3


# ---------------------------------------------------------------------------------------------- cdam_vit (CDAM)
@pytest.fixture(scope="module")
def cd():
    model, z = _load("cdam_vit", patch_size=8, num_classes=10)
    image = torch.from_numpy(z["inputs"])
    targets = torch.tensor([int(z["target_top"]), int(z["target_other"])])
    return model, z, torch.cat([image, image]), targets


def test_cdam_class_golden(cd):
    model, z, images, targets = cd
    ours = build_method("cdam")(model, images, target=targets)
    _assert_matches(ours, np.stack([z["cdam_class_top"], z["cdam_class_other"]]), "cdam_class")


def _ablate_tokens_by_hand(model, images, targets, patches):
    """``logit(x) - logit(x without patch token i)``, one sequence at a time with the model's own modules."""
    with torch.no_grad():
        tokens = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(images))))
        clean = model(images).gather(1, targets[:, None])[:, 0]
        out = torch.empty(len(images), len(patches), dtype=images.dtype)
        for b in range(len(images)):
            for j, i in enumerate(patches):
                kept = torch.cat([tokens[b:b + 1, :1 + i], tokens[b:b + 1, 2 + i:]], dim=1)
                out[b, j] = clean[b] - model.forward_head(model.norm(model.blocks(kept)))[0, targets[b]]
    return out


def test_token_ablation_convention_matches_golden_on_a_subset(cd):
    """The TAM convention (drop the token after the positional embedding, logit difference) on 12 patches.

    The full 784-token golden costs ~2 x 784 forwards of 784 tokens (minutes on 2 cores): see the slow test;
    ``test_token_ablation_equals_a_brute_force_loop`` ties the batched method to this hand-written ablation.
    """
    model, z, images, targets = cd
    patches = [0, 1, 27, 28, 100, 391, 392, 500, 650, 755, 782, 783]
    ours = _ablate_tokens_by_hand(model, images, targets, patches).numpy()
    golden = np.stack([z["tam_top"].ravel(), z["tam_other"].ravel()])[:, patches]
    scale = np.abs(np.stack([z["tam_top"], z["tam_other"]])).max()
    assert np.abs(ours - golden).max() <= 1e-4 * scale


@pytest.mark.slow
def test_token_ablation_golden(cd):
    model, z, images, targets = cd
    ours = build_method("token_ablation", batch_size=400)(model, images, target=targets)
    # TAM is a difference of two logits of size ~1: float32 rounding of the logits (~1e-6) is ~1e-4 of the
    # largest difference (0.035), so raw values are checked at 1e-4 relative; the maps at the usual 1e-4.
    _assert_matches(ours, np.stack([z["tam_top"].ravel(), z["tam_other"].ravel()]), "tam", raw_rtol=1e-4)


def test_cdam_concept_golden(cd):
    model, z, images, _ = cd
    with torch.no_grad():
        latents = model.forward_head(model.forward_features(torch.from_numpy(z["concept_inputs"])), pre_logits=True)
    concept = latents.mean(0)  # their concept vector: the mean [CLS] latent of the concept images
    np.testing.assert_allclose(concept.numpy(), z["concept_vector"], atol=1e-5)
    ours = build_method("cdam", concept=torch.from_numpy(z["concept_vector"]))(model, images[:1], target=None)
    _assert_matches(ours, z["cdam_concept"][None], "cdam_concept")


def test_cdam_notebook_baselines_golden(cd):
    model, z, images, targets = cd
    rp = build_method("generic_attribution")(model, images, target=targets)  # their copy: MM's clamp-then-mean
    _assert_matches(rp, np.stack([z["rp_top"], z["rp_other"]]), "rp")
    _assert_matches(build_method("raw_attention")(model, images[:1]), z["am_raw"][None], "am_raw")


# ---------------------------------------------------------------------------------------------- properties
def _tiny_vit(global_pool="token", seed=0, **kw):
    torch.manual_seed(seed)
    config = dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=5, global_pool=global_pool)
    config.update(kw)
    model = VisionTransformer(**config).eval()
    with torch.no_grad():  # peaked attention, as in the goldens, so that maps are not near-uniform
        for block in model.blocks:
            block.attn.qkv.weight.mul_(4.0)
    return model


def _images(n, seed=1, size=32):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


FAST_OPTIONS = {
    "beyond_intuition_head": {"steps": 4, "start_layer": 0},
    "beyond_intuition_token": {"steps": 4, "start_layer": 0},
    "token_ablation": {"batch_size": 7},
}


def _method(name, **extra):
    return build_method(name, **{**FAST_OPTIONS.get(name, {}), **extra})


#: the generic baselines (tagged opt_in) run on this ViT in the conformance matrix and tests/test_generic_baselines.py
ALL = available_methods(opt_in=False)


@pytest.mark.parametrize("pool", ["token", "avg"])
@pytest.mark.parametrize("name", ALL)
def test_batched_equals_per_sample_with_mixed_targets(name, pool):
    model = _tiny_vit(pool)
    images = _images(4)
    targets = torch.tensor([0, 3, 3, 1])
    method = _method(name)
    batched = method(model, images, target=targets)
    single = torch.cat([method(model, images[i:i + 1], target=int(targets[i])) for i in range(4)])
    assert batched.shape == single.shape
    torch.testing.assert_close(batched, single, rtol=1e-4, atol=1e-6 * float(single.abs().max()))


@pytest.mark.parametrize("name", ALL)
def test_output_shape_dtype_and_float64(name):
    model = _tiny_vit().double()
    images = _images(2).double()
    out = _method(name)(model, images)
    expected = (2, 32, 32) if name == "lrp" else (2, 16)   # full LRP: pixels; the others: patches
    assert out.shape == expected and out.dtype == torch.float64 and torch.isfinite(out).all()


@pytest.mark.parametrize("name", ALL)
def test_model_state_is_restored(name):
    model = _tiny_vit()
    model.train()
    model.blocks[0].attn.qkv.weight.requires_grad_(False)
    handle = model.blocks[1].register_forward_hook(lambda *a: None)
    fused = [block.attn.fused_attn for block in model.blocks]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    requires = {n: p.requires_grad for n, p in model.named_parameters()}

    _method(name)(model, _images(2), target=torch.tensor([1, 2]))

    assert model.training and all(m.training for m in model.modules())
    assert [block.attn.fused_attn for block in model.blocks] == fused
    assert {n: p.requires_grad for n, p in model.named_parameters()} == requires
    assert all(p.grad is None for p in model.parameters())
    assert len(model.blocks[1]._forward_hooks) == 1 and all(
        not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks
        for m in model.modules() if m is not model.blocks[1])
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    handle.remove()


def test_methods_run_in_eval_mode_whatever_the_model_mode():
    model = _tiny_vit(drop_rate=0.5, attn_drop_rate=0.5, proj_drop_rate=0.5)
    images = _images(2)
    expected = build_method("generic_attribution")(model, images)
    model.train()
    torch.testing.assert_close(build_method("generic_attribution")(model, images), expected)


def test_rollout_rows_sum_to_one():
    model = _tiny_vit()
    method = build_method("rollout", start_layer=0)
    from methods.adapters import adapter_for

    adapter = adapter_for(model)
    with adapter.recording.eager_attention():
        joint = method.rollout_matrix(adapter, adapter.inputs.prepare(_images(3)))
    torch.testing.assert_close(joint.sum(-1), torch.ones(joint.shape[:2]))
    assert (joint >= 0).all()


@pytest.mark.parametrize("name", ["raw_attention", "rollout"])
def test_class_agnostic_methods_ignore_the_target(name):
    model, images = _tiny_vit(), _images(3)
    method = build_method(name)
    assert not method.class_specific
    torch.testing.assert_close(method(model, images, target=0), method(model, images, target=torch.tensor([4, 2, 1])))


@pytest.mark.parametrize("name", ["gradcam", "generic_attribution", "cdam", "beyond_intuition_head",
                                  "beyond_intuition_token", "token_ablation"])
@pytest.mark.parametrize("pool", ["token", "avg"])
def test_class_specific_methods_change_with_the_target(name, pool):
    model, images = _tiny_vit(pool), _images(3)
    method = _method(name)
    a, b = method(model, images, target=0), method(model, images, target=3)
    assert a.abs().max() > 0 and b.abs().max() > 0, "an all-zero map cannot discriminate anything"
    assert not torch.allclose(a, b, rtol=1e-3, atol=1e-6)


def test_default_target_is_the_predicted_class():
    model, images = _tiny_vit(), _images(3)
    with torch.no_grad():
        predicted = model(images).argmax(-1)
    for name in ["gradcam", "cdam", "generic_attribution"]:
        method = build_method(name)
        torch.testing.assert_close(method(model, images), method(model, images, target=predicted))


def test_token_ablation_equals_a_brute_force_loop():
    model, images = _tiny_vit(), _images(2)
    targets = torch.tensor([2, 4])
    ours = build_method("token_ablation", batch_size=5)(model, images, target=targets)
    expected = _ablate_tokens_by_hand(model, images, targets, list(range(16)))
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)


def test_cdam_concept_is_linear_in_the_concept_vector():
    model, images = _tiny_vit(), _images(2)
    v = torch.randn(32, generator=torch.Generator().manual_seed(3))
    one = build_method("cdam", concept=v)(model, images)
    torch.testing.assert_close(build_method("cdam", concept=-2.5 * v)(model, images), -2.5 * one)
    assert not build_method("cdam", concept=v).class_specific


@pytest.mark.parametrize("tokens, pool", [("norm1", "token"), ("block_input", "avg"), ("block_input", "token")])
def test_cdam_class_scores_sum_to_the_first_order_logit_change(tokens, pool):
    """Gradient x activation: sum_i S_i is the linearised change of the target logit when every patch token of
    ``T`` (norm1's output, or the last block's input) is scaled by (1 + eps)."""
    model, images = _tiny_vit(pool).double(), _images(2).double()
    targets = torch.tensor([1, 3])
    s = build_method("cdam", tokens=tokens)(model, images, target=targets)
    module = model.blocks[-1].norm1 if tokens == "norm1" else model.blocks[-1]
    eps = 1e-6

    def logits(scale):
        def scale_patches(t):
            t = t.clone()
            t[:, model.num_prefix_tokens:] *= scale
            return t

        if tokens == "norm1":
            handle = module.register_forward_hook(lambda m, i, out: scale_patches(out))
        else:
            handle = module.register_forward_pre_hook(lambda m, i: (scale_patches(i[0]),))
        try:
            with torch.no_grad():
                return model(images).gather(1, targets[:, None])[:, 0]
        finally:
            handle.remove()

    change = (logits(1 + eps) - logits(1 - eps)) / (2 * eps)
    torch.testing.assert_close(s.sum(dim=1), change, rtol=1e-6, atol=1e-8)


def test_cdam_tokens_option_matters_for_average_pooling():
    """On an average-pooled model the residual path of each patch token reaches the output: the block-input
    reading differs from the reference's norm1 reading and is what 'auto' picks there; a wrong name is refused."""
    model, images = _tiny_vit("avg"), _images(2)
    a = build_method("cdam", tokens="norm1")(model, images, target=1)
    b = build_method("cdam", tokens="block_input")(model, images, target=1)
    assert not torch.allclose(a, b, rtol=1e-2)
    torch.testing.assert_close(build_method("cdam")(model, images, target=1), b)   # auto: block_input
    cls_model = _tiny_vit("token")
    torch.testing.assert_close(build_method("cdam")(cls_model, images, target=1),  # auto: norm1 (reference)
                               build_method("cdam", tokens="norm1")(cls_model, images, target=1))
    with pytest.raises(ValueError, match="block_input"):
        build_method("cdam", tokens="input")


def test_ig_chunking_does_not_change_beyond_intuition():
    model, images = _tiny_vit(), _images(3)
    for name in ["beyond_intuition_head", "beyond_intuition_token"]:
        full = build_method(name, start_layer=0, steps=6)(model, images, target=torch.tensor([0, 1, 2]))
        chunked = build_method(name, start_layer=0, steps=6, ig_batch_size=4)(model, images,
                                                                              target=torch.tensor([0, 1, 2]))
        torch.testing.assert_close(full, chunked)


def test_gradcam_on_average_pooled_model_reads_patch_rows():
    model, images = _tiny_vit("avg"), _images(2)
    assert build_method("gradcam", readout="cls")(model, images).abs().max() == 0  # [CLS] row never reaches logits
    assert build_method("gradcam")(model, images).abs().max() > 0


def test_registers_and_cls_readout_on_a_model_without_class_token():
    model = _tiny_vit("avg", class_token=False, reg_tokens=2)
    images = _images(2)
    for name in ["raw_attention", "rollout", "gradcam", "generic_attribution", "cdam"]:
        assert _method(name)(model, images).shape == (2, 16)
    with pytest.raises(ValueError, match="class token"):
        build_method("rollout", readout="cls")(model, images)


# ---------------------------------------------------------------------------------------------- errors, maps
def test_unknown_method_name_lists_the_registry():
    with pytest.raises(KeyError, match="available methods: .*rollout"):
        build_method("rolout")


def test_bad_options_are_named():
    with pytest.raises(TypeError, match="rollout"):
        build_method("rollout", start_layr=1)
    with pytest.raises(ValueError, match="readout"):
        build_method("rollout", readout="max")
    with pytest.raises(ValueError, match="head_reduction"):
        build_method("generic_attribution", head_reduction="max")


def test_bad_inputs_and_targets_are_named():
    model = _tiny_vit()
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        build_method("rollout")(model, torch.randn(3, 32, 32))
    with pytest.raises(ValueError, match="start_layer"):
        build_method("rollout", start_layer=7)(model, _images(1))
    with pytest.raises(ValueError, match="2 samples"):
        build_method("cdam")(model, _images(2), target=torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        build_method("cdam")(model, _images(1), target=9)


def test_unsupported_model_names_the_class_and_families():
    class Tiny(nn.Module):
        def forward(self, x):
            return x.mean((1, 2, 3))[:, None]

    with pytest.raises(TypeError, match="Tiny.*timm VisionTransformer|timm VisionTransformer.*Tiny"):
        build_method("rollout")(Tiny(), _images(1))


def test_tokens_to_map():
    scores = torch.arange(2 * 12, dtype=torch.float32).reshape(2, 12)
    grid = tokens_to_map(scores, grid_size=(3, 4))
    assert grid.shape == (2, 3, 4) and grid[0, 1, 0] == 4  # row-major
    maps = tokens_to_map(scores, grid_size=(3, 4), patch_size=16, normalize=True)
    assert maps.shape == (2, 48, 64)
    assert torch.allclose(maps.amin((1, 2)), torch.zeros(2)) and torch.allclose(maps.amax((1, 2)), torch.ones(2))
    square = tokens_to_map(torch.rand(1, 196), patch_size=16)
    assert square.shape == (1, 224, 224)
    with pytest.raises(ValueError, match="square"):
        tokens_to_map(torch.rand(1, 10))
    assert (tokens_to_map(torch.ones(1, 4), normalize=True) == 0).all()  # constant map: zeros, not NaN
