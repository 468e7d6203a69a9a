"""timm ``VisionTransformer`` variants (registers, no class token, ``fc_norm``, ``map`` attention pooling): the
read-out is what timm's own pooling reads, the registers never reach an average- or attention-pooled prediction
through their own rows, and the relevance rules cover the attention pool. The conformance matrix
(``tests/families/timm_variants.py``) runs every method on these models; this file checks the conventions."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from methods import build_method
from methods.adapters import adapter_for
from methods.attnlrp import relevance_rules
from methods.lrp import LRPEngine
from methods.readout import read_out
from tests.families import _images
from tests.families.timm_variants import _tiny_variant

POOLED = {
    "reg4_avg_no_fc_norm": dict(class_token=False, reg_tokens=4, global_pool="avg", fc_norm=False),
    "reg4_avg_fc_norm": dict(class_token=False, reg_tokens=4, global_pool="avg"),
    "cls_reg4_avg": dict(class_token=True, reg_tokens=4, global_pool="avg"),
    "reg2_map": dict(class_token=False, reg_tokens=2, global_pool="map"),
    "cls_map": dict(class_token=True, global_pool="map"),
}


@pytest.mark.parametrize("variant", ["reg4_avg_no_fc_norm", "reg4_avg_fc_norm", "cls_reg4_avg"])
def test_mean_read_out_is_timms_pool(variant):
    """The ``mean_content`` read-out of a ``[B, N, N]`` matrix is timm's own ``pool`` of it (its rows as tokens):
    the same ``num_prefix_tokens`` (class token and registers) are left out."""
    model = _tiny_variant(**POOLED[variant]).eval()
    adapter = adapter_for(model)
    inputs = adapter.inputs.prepare(_images(2))
    n = adapter.inputs.layout(inputs).num_positions
    assert adapter.readout.kind == "mean_content" and n == 16 + model.num_prefix_tokens
    matrix = torch.randn(2, n, n, dtype=torch.float64)
    torch.testing.assert_close(read_out(matrix, adapter, inputs), model.pool(matrix), rtol=0, atol=0)


@pytest.mark.parametrize("variant", ["reg2_map", "cls_map"])
def test_attention_pool_read_out_is_the_pools_attention(variant):
    """Per head, the read-out weights at the patches times the pool's values are the pool's own ``A @ v`` (the
    input of its output projection, recorded in the model's eager forward); 0 at the prefix tokens, rows summing
    to 1; the read-out of a matrix is the head mean of those weights times the matrix."""
    model = _tiny_variant(**POOLED[variant]).eval()
    pool = model.attn_pool
    pool.fused_attn = False
    adapter = adapter_for(model)
    images = _images(3)
    inputs = adapter.inputs.prepare(images)
    seen = {}
    hooks = [pool.kv.register_forward_hook(lambda m, i, o: seen.update(kv=o)),
             pool.proj.register_forward_pre_hook(lambda m, i: seen.update(ctx=i[0]))]
    with torch.no_grad():
        model(images)
    for hook in hooks:
        hook.remove()
    weights = adapter.pool_attention(inputs)                       # [B, H, N]
    prefix, heads = model.num_prefix_tokens, pool.num_heads
    assert adapter.readout.kind == "attention_pool" and weights.shape == (3, heads, 16 + prefix)
    assert (weights[..., :prefix] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, heads, dtype=torch.float64), rtol=0, atol=1e-12)
    values = seen["kv"][..., model.embed_dim:].unflatten(-1, (heads, -1)).transpose(1, 2)   # [B, H, P, d]
    ours = (weights[..., prefix:, None] * values).sum(dim=2)                                 # [B, H, d]
    torch.testing.assert_close(ours, seen["ctx"][:, 0].unflatten(-1, (heads, -1)), rtol=1e-12, atol=1e-12)
    matrix = torch.randn(3, 16 + prefix, 16 + prefix, dtype=torch.float64)
    torch.testing.assert_close(read_out(matrix, adapter, inputs),
                               torch.einsum("bn,bnm->bm", weights.mean(dim=1), matrix), rtol=1e-12, atol=1e-12)


def test_attention_pool_read_out_needs_an_attention_pool():
    with pytest.raises(ValueError, match="readout='attention_pool' needs a model read out by an attention pooling"):
        build_method("rollout", readout="attention_pool")(_tiny_variant(global_pool="avg"), _images(1))
    model = _tiny_variant(**POOLED["cls_map"])          # the other read-outs stay available on an attention pool
    assert build_method("rollout", readout="class_token")(model, _images(1)).shape == (1, 16)
    assert build_method("rollout", readout="mean_content")(model, _images(1)).shape == (1, 16)


def test_unsupported_pools_are_named():
    from timm.layers import AttentionPoolLatent

    with pytest.raises(TypeError, match="pool_include_prefix=True"):
        build_method("rollout")(_tiny_variant(global_pool="avg", pool_include_prefix=True), _images(1))
    with pytest.raises(TypeError, match="global_pool='avgmax' is not supported"):
        build_method("rollout")(_tiny_variant(global_pool="avgmax"), _images(1))
    model = _tiny_variant(global_pool="map")
    model.attn_pool = AttentionPoolLatent(24, num_heads=2, latent_len=2, norm_layer=nn.LayerNorm).double()
    with pytest.raises(TypeError, match="latent_len=2"):
        build_method("rollout")(model, _images(1))


@pytest.mark.parametrize("variant", ["reg4_avg_fc_norm", "reg2_map"])
def test_lrp_gives_the_prefix_rows_of_the_last_attention_nothing(variant):
    """Average and attention pooling read the patches only: the LRP relevance of the last block's attention is 0
    in the query rows of the registers and the class token, and not elsewhere."""
    model = _tiny_variant(**POOLED[variant]).eval()
    adapter = adapter_for(model)
    inputs = adapter.inputs.prepare(_images(2))
    last = len(adapter.blocks) - 1
    with adapter.recording.eager_attention():
        cam = LRPEngine("ours").run(adapter, inputs, torch.tensor([1, 3]), cam_layers=[last]).attn_cam[last]
    prefix = model.num_prefix_tokens
    assert (cam[:, :, :prefix] == 0).all()
    assert (cam[:, :, prefix:].abs().sum(dim=-1) > 0).all()


def _bias_free(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name in ("pos_embed", "cls_token", "reg_token"):
                p.zero_()
    return model.eval()


def test_cp_lrp_conserves_through_the_attention_pool():
    """CP-LRP on a bias-free attention-pooled model is exactly linear in the patch embeddings only if the pool's
    keys are detached too (its attention a constant): every block's relevance and the scores' sum equal the
    logit. AttnLRP puts its factors on the pool's projections as on the blocks'."""
    model = _bias_free(_tiny_variant(**POOLED["reg2_map"]))
    target = torch.tensor([1, 4, 0])
    report = build_method("cp_lrp").relevance_by_layer(model, _images(3), target=target)
    logit = report["logit"]
    scale = logit.abs().max()
    for layer, sums in enumerate(report["blocks"]):
        torch.testing.assert_close(sums, logit, rtol=0, atol=1e-9 * scale, msg=f"block {layer}")
    torch.testing.assert_close(report["input"], logit, rtol=0, atol=1e-9 * scale)
    adapter = adapter_for(model)
    with relevance_rules(adapter, "attnlrp"):
        assert len(model.attn_pool.kv._forward_hooks) == 1 and len(model.attn_pool.q._forward_hooks) == 1
    assert not model.attn_pool.kv._forward_hooks


@pytest.mark.parametrize("name", ["lrp", "partial_lrp", "lrp_rollout", "transformer_attribution"])
def test_layer_scale_passes_relevance_unchanged(name):
    """A ViT with layer scale (DINOv2's ``init_values``) gives the maps of the same function written without it
    (``gamma`` multiplied into ``proj`` and ``fc2``): the z-rule through ``gamma * a`` is the identity."""
    scaled = _tiny_variant(class_token=True, reg_tokens=4, no_embed_class=True, init_values=0.5).eval()
    with torch.no_grad():
        for block in scaled.blocks:
            block.ls1.gamma.mul_(torch.linspace(0.2, 2.0, block.ls1.gamma.numel(), dtype=torch.float64))
            block.ls2.gamma.mul_(torch.linspace(1.5, 0.3, block.ls2.gamma.numel(), dtype=torch.float64))
    folded = _tiny_variant(class_token=True, reg_tokens=4, no_embed_class=True).eval()
    folded.load_state_dict({k: v for k, v in scaled.state_dict().items() if ".ls" not in k})
    with torch.no_grad():
        for plain, block in zip(folded.blocks, scaled.blocks):
            for linear, gamma in ((plain.attn.proj, block.ls1.gamma), (plain.mlp.fc2, block.ls2.gamma)):
                linear.weight.mul_(gamma[:, None])
                linear.bias.mul_(gamma)
    x = _images(2)
    torch.testing.assert_close(folded(x), scaled(x), rtol=1e-12, atol=1e-12)
    method = build_method(name)
    target = torch.tensor([1, 3])
    ours, reference = method(scaled, x, target=target), method(folded, x, target=target)
    torch.testing.assert_close(ours, reference, rtol=1e-9, atol=1e-12 * float(reference.abs().max()))
