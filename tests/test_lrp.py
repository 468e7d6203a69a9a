"""LRP engine and the relevance methods (lrp, partial_lrp, transformer_attribution, lrp_rollout).

Goldens: ``../shared/golden/te_vit{,_f64}.npz`` (the authors' code on a seeded random ViT). float64 must agree
to 1e-6 of the largest golden value (measured ~1e-10); float32 is limited by float32 noise (the reference's own
float32 run differs from its float64 run by 2e-4 on min-max-normalised partial LRP and 1.5e-2 on TA start 0),
so float32 is checked on per-sample min-max maps against the exact values, sample by sample, within the issue's
tolerance or the reference's own float32 noise on that sample.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn

timm = pytest.importorskip("timm")
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

from methods import build_method, minmax_normalize  # noqa: E402
from methods.families.timm_vit import TimmViTAdapter  # noqa: E402
from methods.lrp import LRPEngine  # noqa: E402
from methods.lrp import rules as R  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "golden")

CASES = [  # method, options, golden key
    ("transformer_attribution", {}, "ta_s0"),
    ("transformer_attribution", {"start_layer": 1}, "ta_s1"),
    ("partial_lrp", {}, "partial_lrp"),
    ("lrp_rollout", {}, "lrp_rollout"),
    ("lrp", {}, "full_lrp"),
    ("lrp", {"rules": "ours"}, "full_lrp_ours_rules"),
]


def _golden_key(z, key):
    return z[key + "__tok"] if key + "__tok" in z.files else z[key + "__map"]


def _golden_model(dtype):
    z = np.load(os.path.join(GOLDEN, "te_vit.npz"))
    sd = {k[2:]: torch.from_numpy(z[k]) for k in z.files if k.startswith("w/")}
    model = VisionTransformer(img_size=224, patch_size=16, embed_dim=192, depth=4, num_heads=3, mlp_ratio=4,
                              qkv_bias=True, num_classes=1000)
    model.load_state_dict(sd, strict=True)
    model.eval()
    model.norm.eps = 1e-5  # the reference LRP models' final LayerNorm
    return model.to(dtype)


@pytest.fixture(scope="module", params=["float64", "float32"])
def golden_run(request):
    """All methods, each in ONE batched call: 3 images x [predicted, other] targets, per-sample targets."""
    if not os.path.exists(os.path.join(GOLDEN, "te_vit.npz")):
        pytest.skip("golden files not available")
    dtype = getattr(torch, request.param)
    z = np.load(os.path.join(GOLDEN, "te_vit_f64.npz" if dtype == torch.float64 else "te_vit.npz"))
    torch.set_num_threads(min(2, torch.get_num_threads()))
    model = _golden_model(dtype)
    images = torch.from_numpy(z["images"]).to(dtype).repeat_interleave(2, dim=0)
    targets = torch.from_numpy(np.stack([z["pred_class"], z["other_class"]], 1).reshape(-1))
    outs = {key: build_method(name, **opts)(model, images, targets) for name, opts, key in CASES}
    return request.param, z, model, images, targets, outs


@pytest.mark.parametrize("key", [c[2] for c in CASES])
def test_goldens(golden_run, key):
    """float64 against the reference's float64 run: 1e-6 of the largest golden value (measured 6e-14 .. 3e-10)."""
    dtype, z, _, _, _, outs = golden_run
    if dtype != "float64":
        pytest.skip("float64 check (float32: test_float32_maps_within_the_float32_noise_of_the_reference)")
    out = outs[key].double()
    gold = torch.from_numpy(_golden_key(z, key)).double().reshape(out.shape)
    assert out.shape[0] == 6
    rel = ((out - gold).abs().max() / gold.abs().max()).item()
    assert rel < 1e-6, (key, rel)


def _per_sample_minmax_error(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (minmax_normalize(a.double()) - minmax_normalize(b.double())).abs().reshape(a.shape[0], -1).amax(dim=1)


# the float32 tolerances on per-sample min-max maps (lrp_rollout: TA's)
F32_TOL = {"partial_lrp": 1e-4, "ta_s0": 1e-2, "ta_s1": 1e-2, "lrp_rollout": 1e-2, "full_lrp": 5e-2,
           "full_lrp_ours_rules": 5e-2}
# where a sample is ill-conditioned, float32 rounding (which differs between CPUs and BLAS kernels) is amplified:
# the bound there is this multiple of the reference's own float32-vs-float64 error on that sample
NOISE_FACTOR = 10.0


@pytest.mark.parametrize("key", [c[2] for c in CASES])
def test_float32_maps_within_the_float32_noise_of_the_reference(golden_run, key):
    """float32 per-sample min-max maps against the reference's exact (float64) run.

    LRP relevance is ill-conditioned (the stabiliser divides nearly cancelling sums): on image 0 the
    reference's own float32 run misses its float64 run by 1.5e-2 (TA, start 0), more than the issue's 1e-2, and
    a float32 run of the same rules on another CPU lands elsewhere (ours, TA start 0, image 0: 4.9e-3 on one
    machine, 9.0e-2 on an AMD EPYC with torch 2.14.1 / MKL). So each sample must be within the issue's tolerance
    *or* within ``NOISE_FACTOR`` times the reference's own float32 error on that sample; every well-conditioned
    sample (4 of 6 for TA start 0) is held to the issue's tolerance. float64 (``test_goldens``) is the exact check.
    """
    dtype, z32, _, _, _, outs = golden_run
    if dtype != "float32":
        pytest.skip("float32 check")
    exact = np.load(os.path.join(GOLDEN, "te_vit_f64.npz"))
    out = outs[key].double()
    gold = torch.from_numpy(_golden_key(exact, key)).double().reshape(out.shape)
    theirs = torch.from_numpy(_golden_key(z32, key)).double().reshape(out.shape)
    ours_err = _per_sample_minmax_error(out, gold)
    their_noise = _per_sample_minmax_error(theirs, gold)
    bound = torch.clamp(NOISE_FACTOR * their_noise, min=F32_TOL[key])
    assert (ours_err <= bound).all(), (key, ours_err.tolist(), bound.tolist())
    well_conditioned = their_noise < F32_TOL[key] / NOISE_FACTOR
    assert well_conditioned.sum() >= 4, (key, their_noise.tolist())  # the check is not vacuous


def test_shapes_and_kinds(golden_run):
    _, _, _, _, _, outs = golden_run
    assert outs["ta_s0"].shape == (6, 196) and outs["partial_lrp"].shape == (6, 196)
    assert outs["full_lrp"].shape == (6, 224, 224)
    assert build_method("lrp").rules == "orig" and build_method("partial_lrp").rules == "orig"
    assert build_method("transformer_attribution").rules == "ours"


def test_recorded_forward_reproduces_logits(golden_run):
    dtype, z, model, images, targets, _ = golden_run
    adapter = TimmViTAdapter(model)
    with adapter.recording.eager_attention():
        res = LRPEngine("ours").run(adapter, adapter.inputs.prepare(images), targets, cam_layers=[3], grad_layers=[3])
        with torch.no_grad():
            ref = model(images)
    assert torch.equal(res.logits, ref)
    gold = torch.from_numpy(z["logits_vit_lrp"]).to(ref.dtype).repeat_interleave(2, dim=0)
    assert (ref - gold).abs().max() < (1e-10 if dtype == "float64" else 1e-4)
    assert torch.equal(res.target, targets)
    if dtype == "float64":  # debug intermediates of image 0, predicted class (ours rules)
        g = torch.from_numpy(z["dbg_img0_pred__lrp_attn_cam"][3])
        assert (res.attn_cam[3][0] - g).abs().max() < 1e-6 * g.abs().max()
        g = torch.from_numpy(z["dbg_img0_pred__lrp_attn_grad"][3])
        assert (res.attn_grad[3][0] - g).abs().max() < 1e-6 * g.abs().max()


# ----------------------------------------------------------------------------------------- small random models
def _small(global_pool="token", class_token=True, **kw):
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=3, num_heads=2, num_classes=7,
                              global_pool=global_pool, class_token=class_token, **kw)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval().double()


@pytest.mark.parametrize("name,opts", [("transformer_attribution", {}), ("lrp", {}), ("partial_lrp", {}),
                                       ("lrp", {"rules": "ours"}), ("lrp_rollout", {"start_layer": 1}),
                                       ("transformer_attribution", {"row_normalize": True, "start_layer": -2})])
def test_batched_equals_per_sample(name, opts):
    model = _small()
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    t = torch.tensor([1, 4, 6])
    method = build_method(name, **opts)
    batched = method(model, x, t)
    single = torch.cat([method(model, x[i:i + 1], t[i:i + 1]) for i in range(3)])
    assert torch.allclose(batched, single, rtol=1e-9, atol=1e-12 * single.abs().max())
    assert torch.isfinite(batched).all()


def test_avg_pool_model_runs():
    model = _small(global_pool="avg", class_token=False)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    for name in ("transformer_attribution", "partial_lrp", "lrp"):
        out = build_method(name)(model, x, None)
        assert out.shape == ((2, 32, 32) if name == "lrp" else (2, 16)) and torch.isfinite(out).all()


def test_ours_relevance_conserved_through_network():
    """Under "ours", the relevance entering block 0 sums to 1 (the one-hot) per sample."""
    model = _small()
    adapter = TimmViTAdapter(model)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    engine = LRPEngine("ours")
    from methods.adapters import ActivationRecorder
    from methods.lrp import topology_for
    walk = topology_for(adapter)
    with adapter.recording.eager_attention(), ActivationRecorder() as rec, torch.no_grad():
        walk.record(rec, range(3), to_input=True)
        logits = model(x)
    acts = rec.outputs
    r = walk.head_relprop(engine.rules, acts, torch.eye(7, dtype=x.dtype)[[2, 5]])
    assert torch.allclose(r.sum(dim=(1, 2)), torch.ones(2, dtype=x.dtype), atol=1e-6)
    for l in reversed(range(3)):
        r, _ = walk.block_relprop(engine.rules, acts, l, r, True)
        assert torch.allclose(r.sum(dim=(1, 2)), torch.ones(2, dtype=x.dtype), atol=1e-6)
    assert logits.shape == (2, 7)


def test_model_state_restored():
    model = _small().train()
    model.blocks[1].attn.fused_attn = True
    model.head.weight.requires_grad_(False)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    for name in ("transformer_attribution", "lrp", "partial_lrp"):
        build_method(name)(model, x, 3)
    assert all(m.training for m in model.modules())
    assert model.blocks[1].attn.fused_attn is True
    assert not model.head.weight.requires_grad and model.blocks[0].attn.qkv.weight.requires_grad
    assert all(p.grad is None for p in model.parameters())
    assert all(len(m._forward_hooks) == 0 and len(m._forward_pre_hooks) == 0 for m in model.modules())


def test_unsupported_models_raise():
    with pytest.raises(TypeError, match="Sequential.*timm VisionTransformer"):
        build_method("lrp")(nn.Sequential(nn.Conv2d(3, 3, 1)), torch.randn(1, 3, 32, 32))
    qk_norm = _small(qk_norm=True)      # layer scale has a rule (tests/test_timm_variants.py); q/k norm has none
    with pytest.raises(TypeError, match="VisionTransformer.*q_norm.*supported families"):
        build_method("transformer_attribution")(qk_norm, torch.randn(1, 3, 32, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="rule set"):
        build_method("lrp", rules="nope")


# ----------------------------------------------------------------------------------------- rule unit tests
def _rel(a, b):
    return abs(float(a) - float(b)) / abs(float(b))


def test_safe_divide_semantics():
    a = torch.tensor([1.0, 1.0, 1.0, 2.0], dtype=torch.float64)
    b = torch.tensor([2.0, 0.0, -1e-9, -4.0], dtype=torch.float64)
    out = R.safe_divide(a, b)
    assert out[0] == 1.0 / (2.0 + 1e-9) and out[1] == 0 and out[2] == 1.0 / 1e-9 and out[3] == 2.0 / (-4.0 + 1e-9)


def test_in_place_division_and_folded_halving_are_exact():
    """``safe_divide_`` equals ``safe_divide`` (stabilisers included) and scaling by a power of two folded into the
    division gives bit-identical results: the matmul rule's ``scale=0.5`` is the reference's ``/ 2``."""
    a = torch.tensor([1.0, 1.0, 1.0, 2.0, -3.0], dtype=torch.float64)
    b = torch.tensor([2.0, 0.0, -1e-9, -4.0, 1e-3], dtype=torch.float64)
    assert torch.equal(R.safe_divide_(a, b.clone()), R.safe_divide(a, b))
    assert torch.equal(R.safe_divide_(a, b * 2, 2 * R.EPS), R.safe_divide(a, b) / 2)
    torch.manual_seed(5)
    for dtype in (torch.float32, torch.float64):
        x, y = torch.rand(2, 3, 6, 6, dtype=dtype), torch.randn(2, 3, 6, 4, dtype=dtype)
        r = torch.randn(2, 3, 6, 4, dtype=dtype)
        full = R.matmul_grad_x_input(x, y, r)
        for ab in (None, x @ y):
            halved = R.matmul_grad_x_input(x, y, r, ab=ab, scale=0.5)
            assert all(torch.equal(h, f / 2) for h, f in zip(halved, full))


def test_linear_rules_conservation():
    torch.manual_seed(1)
    x, w = torch.randn(4, 5, 16, dtype=torch.float64), torch.randn(8, 16, dtype=torch.float64)
    r = torch.rand(4, 5, 8, dtype=torch.float64)
    ours = R.linear_alpha1_beta0(x, w, r)
    assert _rel(ours.sum(), r.sum()) < 1e-8
    assert torch.allclose(ours.sum(dim=(1, 2)), r.sum(dim=(1, 2)), rtol=1e-8)   # per sample too
    orig = R.linear_separate_groups(x, w, r)
    assert 1.5 < orig.sum() / r.sum() < 2.5   # documented non-conservation (~2x per Linear)
    # against autograd on the reference's re-run formulation
    xp, xn = x.clamp(min=0).requires_grad_(), x.clamp(max=0).requires_grad_()
    z = xp @ w.clamp(min=0).T + xn @ w.clamp(max=0).T
    gp, gn = torch.autograd.grad(z, [xp, xn], R.safe_divide(r, z.detach()))
    assert torch.allclose(ours, xp.detach() * gp + xn.detach() * gn, rtol=1e-12)
    # from the layer's own output x W^T: one matrix product fewer, the same values (exact identity)
    b = torch.randn(8, dtype=torch.float64)
    fast = R.linear_alpha1_beta0(x, w, r, out=x @ w.T + b, bias=b)
    assert torch.allclose(fast, ours, rtol=1e-10, atol=1e-12 * ours.abs().max())
    assert not torch.allclose(R.linear_alpha1_beta0(x, w, r, out=x @ w.T + b, bias=None), ours, rtol=1e-6)


def test_token_sparse_block_pass_equals_the_dense_pass(monkeypatch):
    """The last block of a [CLS] model runs its token-wise rules on [CLS] only: same relevance as all tokens."""
    from methods.lrp import sublayers

    model = _small()
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    t = torch.tensor([1, 4, 6])
    r = torch.zeros(2, 5, 4)
    r[1, 0, 2] = 1.0
    assert sublayers.active_tokens(r).tolist() == [0] and sublayers.active_tokens(r + 1) is None
    sparse = {n: build_method(n)(model, x, t) for n in ("transformer_attribution", "partial_lrp", "lrp")}
    calls = []
    monkeypatch.setattr(sublayers, "active_tokens", lambda r: calls.append(1))
    for name, value in sparse.items():
        dense = build_method(name)(model, x, t)
        assert torch.allclose(value, dense, rtol=1e-9, atol=1e-12 * dense.abs().max()), name
    assert calls  # the dense runs went through the patched helper


def test_add_rules():
    torch.manual_seed(2)
    x0, x1 = torch.randn(3, 6, 4, dtype=torch.float64), torch.randn(3, 6, 4, dtype=torch.float64)
    r = torch.randn(3, 6, 4, dtype=torch.float64)
    a, b = R.add_renormalised(x0, x1, r)
    assert torch.allclose((a + b).sum(dim=(1, 2)), r.sum(dim=(1, 2)), rtol=1e-8)   # per sample
    # per-sample renormalisation: sample 1 alone gives the same
    a1, b1 = R.add_renormalised(x0[1:2], x1[1:2], r[1:2])
    assert torch.allclose(a[1:2], a1) and torch.allclose(b[1:2], b1)
    # share of each branch is |sum| proportional
    pa, pb = R.add_proportional(x0, x1, r)
    sa, sb = pa.sum(dim=(1, 2)).abs(), pb.sum(dim=(1, 2)).abs()
    assert torch.allclose(a.sum(dim=(1, 2)), sa / (sa + sb) * r.sum(dim=(1, 2)), rtol=1e-8)
    # proportional: sum of the two shares is R elementwise (up to the stabiliser)
    assert torch.allclose(pa + pb, r, rtol=1e-6, atol=1e-6)


def test_clone_matmul_select_conservation():
    torch.manual_seed(3)
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    r1, r2 = torch.randn_like(x), torch.randn_like(x)
    assert torch.allclose(R.clone(x, [r1, r2]), r1 + r2, rtol=1e-6, atol=1e-6)
    a, b = torch.rand(2, 3, 5, 5, dtype=torch.float64), torch.randn(2, 3, 5, 4, dtype=torch.float64)
    r = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    ra, rb = R.matmul_grad_x_input(a, b, r)
    assert _rel(ra.sum() / 2 + rb.sum() / 2, r.sum()) < 1e-6
    assert _rel(ra.sum(), r.sum()) < 1e-6 and _rel(rb.sum(), r.sum()) < 1e-6
    assert torch.allclose(R.select(x[:, 0], r1[:, 0]), r1[:, 0], rtol=1e-6, atol=1e-6)
    rm = R.mean_pool(x, r1[:, 0])
    assert torch.allclose(rm.sum(dim=1), r1[:, 0], rtol=1e-6, atol=1e-6)


def test_conv_zb_conservation():
    torch.manual_seed(4)
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    w = torch.randn(5, 3, 4, 4, dtype=torch.float64)
    r = torch.rand(2, 5, 4, 4, dtype=torch.float64)
    out = R.conv_zb(x, w, r, (4, 4), (0, 0))
    assert out.shape == x.shape
    assert torch.allclose(out.sum(dim=(1, 2, 3)), r.sum(dim=(1, 2, 3)), rtol=1e-6)
    one = R.conv_zb(x[1:], w, r[1:], (4, 4), (0, 0))   # L/H per sample
    assert torch.allclose(out[1:], one)


def test_mask_add_and_shared_linear_rules_equal_their_compositions():
    """``RuleSet.mask_add`` (the scores' share of ``scores + mask``, the mask's dropped) is the ``"add"`` rule's
    first output, bit for bit, with an explicit mask and with ``None`` for an all-zero one; ``linear_shared``
    is the sum of the ``"linear"`` rule over the layers reading one input (up to the order of additions)."""
    torch.manual_seed(6)
    scores = torch.randn(3, 2, 5, 7, dtype=torch.float64)
    r = torch.randn(3, 2, 5, 7, dtype=torch.float64)
    mask = torch.zeros(3, 1, 1, 7, dtype=torch.float64)
    mask[1, ..., 5:] = torch.finfo(torch.float64).min
    r[1, ..., 5:] = 0                                        # a padded key's attention, hence relevance, is 0
    for name in ("ours", "orig"):
        rules = R.get_rules(name)
        for m in (mask, None):
            expected = rules["add"](scores, torch.zeros_like(mask) if m is None else m, r)[0]
            assert torch.equal(rules.mask_add(scores.clone(), m, r), expected), (name, m is None)
        x = torch.randn(4, 6, 16, dtype=torch.float64)
        layers = []
        for out_dim in (8, 8, 12):
            w, b = torch.randn(out_dim, 16, dtype=torch.float64), torch.randn(out_dim, dtype=torch.float64)
            layers.append((w, torch.randn(4, 6, out_dim, dtype=torch.float64), x @ w.T + b, b))
        separate = sum(rules["linear"](x, w, rel, out.clone(), b) for w, rel, out, b in layers)
        shared = rules.linear_shared(x, [(w, rel, out.clone(), b) for w, rel, out, b in layers])
        assert torch.allclose(shared, separate, rtol=1e-12, atol=1e-12 * separate.abs().max()), name
        assert torch.allclose(R.RuleSet("plain", {"linear": rules["linear"]}).linear_shared(x, layers), separate,
                              rtol=1e-12, atol=1e-12 * separate.abs().max())


def test_rollout_readout_equals_the_read_out_rollout():
    from methods.rollout import rollout, rollout_readout

    torch.manual_seed(7)
    mats = [torch.rand(2, 6, 6, dtype=torch.float64) for _ in range(4)]
    weights = torch.rand(2, 6, dtype=torch.float64)
    for normalize in (False, True):
        for read in (lambda m: m[:, 0], lambda m: (m * weights[:, :, None]).sum(dim=1)):
            full = read(rollout(mats, normalize))
            assert torch.allclose(rollout_readout(mats, normalize, read), full, rtol=1e-12)


def test_engine_reduces_each_attention_map_as_it_goes():
    """``cam_reduce`` gets each layer's ``R_A`` and gradient once; what it returns replaces ``R_A`` and the
    gradients it consumed leave ``attn_grad``."""
    model = _small()
    adapter = TimmViTAdapter(model)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    seen = []

    def reduce(layer, cam, grad):
        seen.append(layer)
        return (grad * cam).sum(dim=1)

    with adapter.recording.eager_attention():
        inputs = adapter.inputs.prepare(x)
        dense = LRPEngine("ours").run(adapter, inputs, 3, cam_layers=[1, 2], grad_layers=[0, 1, 2])
        reduced = LRPEngine("ours").run(adapter, inputs, 3, cam_layers=[1, 2], grad_layers=[0, 1, 2],
                                        cam_reduce=reduce)
    assert seen == [2, 1] and sorted(reduced.attn_grad) == [0]
    assert torch.equal(reduced.attn_grad[0], dense.attn_grad[0])
    for l in (1, 2):
        assert torch.allclose(reduced.attn_cam[l], (dense.attn_grad[l] * dense.attn_cam[l]).sum(dim=1), rtol=1e-12)
