"""timm ``Eva`` (EVA, EVA-02) and ``Beit``: what the conformance matrix does not check on its own rows.

Token ablation's removed positions (padding instead of a cut) equal a cut where a cut is possible; the adapter's
placement of AttnLRP's attention rules equals the projection-output placement of :mod:`methods.attnlrp`;
CP-LRP and Chefer's "ours" LRP conserve relevance exactly on these graphs (rotary embedding, SwiGLU, layer
scale, sub-LN, relative position bias); refusals name their reason; ``timm:eva02_*`` / ``timm:beit_*`` load from
a local weights file.
"""
from __future__ import annotations

import pytest
import torch

from methods import MethodUndefinedError, build_method
from methods.adapters import ActivationRecorder, InputFormat, adapter_for
from methods.families.timm_eva_beit import TimmBeitAdapter, TimmEvaAdapter
from methods.lrp import LRPEngine, topology_for
from tests.families import _images
from tests.families.timm_eva_beit import BEIT_RELPOS, EVA02_CLIP, EVA02_GLU, EVA_PLAIN, _tiny

timm = pytest.importorskip("timm")

ROWS = {"eva02_glu": ("eva", EVA02_GLU), "eva02_clip": ("eva", EVA02_CLIP), "eva_plain": ("eva", EVA_PLAIN),
        "beit_relpos": ("beit", BEIT_RELPOS),
        "beit_shared": ("beit", dict(use_rel_pos_bias=False, use_shared_rel_pos_bias=True, swiglu_mlp=True,
                                     scale_mlp=True, global_pool="token"))}


def _model(row: str, **extra):
    kind, config = ROWS[row]
    return _tiny(kind, **{**config, **extra}).eval()


def test_adapters_resolve_and_refuse_with_reasons():
    assert isinstance(adapter_for(_model("eva02_glu")), TimmEvaAdapter)
    assert isinstance(adapter_for(_model("beit_shared")), TimmBeitAdapter)
    with pytest.raises(TypeError, match="EvaBlockPostNorm"):
        adapter_for(_tiny("eva", use_post_norm=True))
    with pytest.raises(TypeError, match="global_pool='map'"):
        adapter_for(_tiny("eva", global_pool="map"))
    with pytest.raises(ValueError, match=r"image size \(48, 48\) differs from the model's img_size \(32, 32\)"):
        build_method("rollout")(_model("beit_relpos"), torch.randn(1, 3, 48, 48, dtype=torch.float64))


def test_removed_positions_equal_cut_out_positions():
    """Token ablation masks a removed patch (keys and average pooling) instead of cutting it out; on a model
    whose positions allow a cut (absolute position embedding only) both give the same logits."""
    for pool in ("avg", "token"):
        model = _model("eva_plain", global_pool=pool)
        adapter = adapter_for(model)
        inputs = adapter.inputs.prepare(_images(2))
        context = adapter.inputs.context(inputs)
        removed = torch.tensor([1, 6, 16])
        with torch.no_grad():
            hidden = adapter.embed(inputs)
            masked, masked_context = adapter.inputs.drop_positions(hidden, context, removed)
            cut, cut_context = InputFormat.drop_positions(adapter.inputs, hidden, context, removed)
            ours = adapter.head(adapter.run_blocks(masked, masked_context), masked_context)
            theirs = adapter.head(adapter.run_blocks(cut, cut_context), cut_context)
        assert masked.shape[:2] == (6, 17) and cut.shape[:2] == (6, 16)
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("variant, options", [("attnlrp", {}), ("cp_lrp", {}), ("attnlrp", {"gamma": 0.25})])
def test_attention_rules_at_the_products_equal_the_projection_placement(variant, options):
    """With separate q/k/v projections both placements are possible: the adapter's (gradient factors at ``A @ v``
    and at ``A``, eager attention) and :mod:`methods.attnlrp`'s own (factors at the q/k/v projections' outputs,
    the attention as built): the same maps, with the gamma rule on the linear layers too."""
    model = _model("eva_plain", qkv_fused=False)
    images, target = _images(3), torch.tensor([1, 4, 0])
    ours = build_method(variant, **options)(model, images, target=target)
    adapter = adapter_for(model)
    adapter.rule_map.product_rules = lambda *args: None     # this adapter object only: attnlrp's own placement
    try:
        theirs = build_method(variant, **options)(model, images, target=target)
    finally:
        del adapter.rule_map.product_rules
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12 * float(theirs.abs().max()))


@pytest.mark.parametrize("row", ["eva02_glu", "eva02_clip", "beit_relpos", "beit_shared"])
def test_cp_lrp_conserves_exactly_on_bias_free_models(row):
    """Bias-free (no biases, no absolute positions, zero prefix tokens; the relative position bias kept), CP-LRP is
    exactly linear in the patch embeddings through rotary embeddings, SwiGLU (gate constant), sub-LN, layer scale
    and the relative position bias: every block's input relevance and the scores' sum equal the logit."""
    model = _model(row, bias_free=True)
    report = build_method("cp_lrp").relevance_by_layer(model, _images(3), target=torch.tensor([1, 4, 0]))
    logit = report["logit"]
    scale = float(logit.abs().max())
    for layer, sums in enumerate(report["blocks"]):
        torch.testing.assert_close(sums, logit, rtol=0, atol=1e-9 * scale, msg=f"block {layer}")
    torch.testing.assert_close(report["input"], logit, rtol=0, atol=1e-9 * scale)
    attnlrp = build_method("attnlrp").relevance_by_layer(model, _images(3), target=torch.tensor([1, 4, 0]))
    assert torch.equal(attnlrp["logit"], logit)


@pytest.mark.parametrize("row", ["eva02_glu", "eva02_clip", "beit_relpos", "beit_shared"])
def test_ours_lrp_conserves_through_every_block(row):
    """Chefer's "ours" rules through the EVA / BEiT graph: the relevance entering the read-out and every block
    sums to the one-hot target per sample (the relative position bias table zero: its share of the attention
    logits would be dropped, as an attention mask's)."""
    model = _model(row)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "relative_position_bias_table" in name:
                p.zero_()
    adapter = adapter_for(model)
    walk = topology_for(adapter)
    rules = LRPEngine("ours").rules
    with adapter.recording.eager_attention(), ActivationRecorder() as rec, torch.no_grad():
        walk.record(rec, range(3), to_input=True)
        model(_images(2))
    acts = dict(rec.outputs)
    one = torch.ones(2, dtype=torch.float64)
    r = walk.head_relprop(rules, acts, torch.eye(5, dtype=torch.float64)[[2, 4]])
    torch.testing.assert_close(r.sum(dim=(1, 2)), one, rtol=0, atol=1e-6)
    for layer in reversed(range(3)):
        r, r_attn = walk.block_relprop(rules, acts, layer, r, True)
        torch.testing.assert_close(r.sum(dim=(1, 2)), one, rtol=0, atol=1e-6, msg=f"block {layer}")
        assert r_attn.shape == (2, 2, 17, 17)
    pixels = walk.input_relprop(rules, acts, r)
    assert pixels.shape == (2, 3, 32, 32) and torch.isfinite(pixels).all()


def test_undefined_parts_are_named():
    with pytest.raises(MethodUndefinedError, match="head Identity"):
        build_method("transformer_attribution")(_model("eva02_glu", num_classes=0), _images(1))
    with pytest.raises(MethodUndefinedError, match="gamma rule .* F.linear"):
        build_method("attnlrp", gamma=0.25)(_model("beit_relpos"), _images(1))
    rms = _model("eva02_glu", norm_layer=timm.layers.RmsNorm)
    with pytest.raises(MethodUndefinedError, match="RmsNorm"):
        build_method("attnlrp")(rms, _images(1))
    assert build_method("rollout")(rms, _images(1)).shape == (1, 16)


@pytest.mark.parametrize("name, kwargs", [
    ("eva02_tiny_patch14_224", dict(img_size=28, embed_dim=24, num_heads=2, depth=1)),
    ("beit_base_patch16_224", dict(img_size=32, embed_dim=24, num_heads=2, depth=1)),
])
def test_timm_names_load_from_a_local_weights_file(tmp_path, monkeypatch, name, kwargs):
    from models.sources import load_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    reference = timm.create_model(name, pretrained=False, num_classes=3, **kwargs)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.1 * torch.randn_like(p))
    path = tmp_path / "weights.pth"
    torch.save(reference.state_dict(), path)
    model = load_model(f"timm:{name}", pretrained=True,
                       model_kwargs={"num_classes": 3, **kwargs, "pretrained_cfg_overlay": {"file": str(path)}})
    for (key, ours), theirs in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(ours, theirs), key
    x = torch.randn(2, 3, kwargs["img_size"], kwargs["img_size"])
    with torch.no_grad():
        torch.testing.assert_close(adapter_for(model).forward(adapter_for(model).inputs.prepare(x)),
                                   reference.eval()(x), rtol=1e-5, atol=1e-6)
