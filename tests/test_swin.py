"""Swin Transformer V1 (``methods/families/swin``): the windowed maps against an eager recomputation, their
gradients, timm == transformers on converted weights, CP-LRP conservation, refused models and sizes."""
from __future__ import annotations

import pytest
import torch

from methods import MethodUndefinedError, available_methods, build_method
from methods.adapters import ActivationRecorder, adapter_for
from methods.attention_gradients import attention_and_gradients
from tests.families import FAMILIES
from tests.families.swin import OPTIONS, swin_images, tiny_hf_swin, tiny_timm_swin

pytest.importorskip("transformers")


def _expanded_by_loops(windows: torch.Tensor, rows: int, cols: int, side: int, shift: int) -> torch.Tensor:
    """``[B * nW, H, a, a]`` -> ``[B, H, N, N]`` by explicit loops over the windows and their entries: entry ``i``
    of window ``(wr, wc)`` is the shifted grid's ``(wr * side + i // side, wc * side + i % side)``, i.e. the
    original grid's position that far on by ``shift`` (cyclically)."""
    per_row, count = cols // side, (rows // side) * (cols // side)
    batch, heads = windows.shape[0] // count, windows.shape[1]
    full = windows.new_zeros(batch, heads, rows * cols, rows * cols)

    def position(window: int, entry: int) -> int:
        r = ((window // per_row) * side + entry // side + shift) % rows
        c = ((window % per_row) * side + entry % side + shift) % cols
        return r * cols + c

    for b in range(batch):
        for w in range(count):
            for i in range(side * side):
                for j in range(side * side):
                    full[b, :, position(w, i), position(w, j)] = windows[b * count + w, :, i, j]
    return full


def test_windowed_maps_equal_an_eager_recomputation():
    """The recorded map of the last (shifted) block equals ``softmax(q k^T * scale + bias + mask)`` recomputed
    from the block's own ``qkv``, relative position bias and shift mask on its rolled, partitioned input, placed
    by loops; rows sum to 1, 0 between windows."""
    model = tiny_timm_swin()
    x = swin_images(2)
    adapter = adapter_for(model)
    last = len(adapter.blocks) - 1
    block = model.layers[-1].blocks[-1]
    assert block.shift_size[0] > 0, "the last block of the tiny model is a shifted one"
    with ActivationRecorder() as rec, adapter.recording.eager_attention():
        adapter.recording.attention(rec, last, "attn")
        adapter.recording.attention_input(rec, last, "normed")
        logits = adapter.forward(adapter.inputs.prepare(x), grad_from_block=len(adapter.blocks))
    assert torch.equal(logits, model(x))
    rows, cols = adapter.grids[last]
    side, shift = int(block.window_size[0]), int(block.shift_size[0])
    normed = rec["normed"].detach().reshape(2, rows, cols, -1)
    rolled = torch.roll(normed, shifts=(-shift, -shift), dims=(1, 2))
    windows = rolled.reshape(2, rows // side, side, cols // side, side, -1).permute(0, 1, 3, 2, 4, 5)
    windows = windows.reshape(-1, side * side, normed.shape[-1])
    attn = block.attn
    q, k, _ = attn.qkv(windows).reshape(windows.shape[0], side * side, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    scores = (q * attn.scale) @ k.transpose(-2, -1) + attn._get_rel_pos_bias()
    mask = block.attn_mask.repeat(2, 1, 1)[:, None]
    probabilities = (scores + mask).softmax(dim=-1)
    expected = _expanded_by_loops(probabilities.detach(), rows, cols, side, shift)
    torch.testing.assert_close(rec["attn"], expected, rtol=0, atol=1e-14)
    torch.testing.assert_close(rec["attn"].sum(dim=-1), torch.ones(2, attn.num_heads, rows * cols, dtype=x.dtype))
    outside = _expanded_by_loops(torch.ones_like(probabilities), rows, cols, side, shift) == 0
    assert outside.any() and (rec["attn"][outside] == 0).all()


@pytest.mark.parametrize("build", [tiny_timm_swin, tiny_hf_swin], ids=["timm", "transformers"])
def test_gradient_at_the_full_map_is_the_models_gradient_at_its_windows(build):
    """``d logit / d full`` (what Grad-CAM reads) equals the gradient at the model's own windowed probabilities
    (taken by a plain hook, no expansion), placed by loops; 0 between windows; the logits are unchanged."""
    model = build()
    x = swin_images(2)
    adapter = adapter_for(model)
    last = len(adapter.blocks) - 1
    inputs = adapter.inputs.prepare(x)
    with adapter.recording.eager_attention():
        maps, grads, logits, target = attention_and_gradients(adapter, inputs, None, [last])
        windowed = {}
        hf = hasattr(model, "swin")
        module = adapter.blocks[last].attention if hf else adapter.blocks[last].attn.attn_drop

        def hook(_module, _args, out):
            if hf:
                windowed["a"] = out[1]
                return None
            windowed["a"] = out.detach().requires_grad_(True)
            return windowed["a"]

        handle = module.register_forward_hook(hook)
        try:
            own = adapter.forward(inputs, grad_from_block=last)
        finally:
            handle.remove()
    assert torch.equal(logits, own.detach())
    (own_grad,) = torch.autograd.grad(own.gather(1, target[:, None]).sum(), windowed["a"])
    rows, cols = adapter.grids[last]
    geometry = adapter.geometry(last)
    expected = _expanded_by_loops(own_grad, rows, cols, geometry.window, geometry.shift)
    torch.testing.assert_close(grads[0], expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(maps[0], _expanded_by_loops(windowed["a"].detach(), rows, cols, geometry.window,
                                                           geometry.shift), rtol=0, atol=0)


def test_timm_and_transformers_agree_on_converted_weights():
    """A tiny timm Swin converted to ``SwinForImageClassification``: the same logits, and for every method that
    runs on Swin the same maps within 1e-5 of the largest score (transformers' eager softmax runs in float32)."""
    from models.swin_conversion import hf_swin_from_timm

    timm_model = tiny_timm_swin(seed=3)
    hf_model = hf_swin_from_timm(timm_model)
    x = swin_images(3)
    torch.testing.assert_close(hf_model(x).logits, timm_model(x), rtol=0, atol=1e-12)
    refused = next(f for f in FAMILIES if f.name == "timm_swin").undefined   # UNDEFINED and the later methods'
    running = [name for name in available_methods() if name not in refused]
    assert {"gradcam", "raw_attention", "cdam", "attnlrp", "cp_lrp", "random"} <= set(running)
    for name in running:
        ours = build_method(name, **OPTIONS.get(name, {}))(timm_model, x)
        theirs = build_method(name, **OPTIONS.get(name, {}))(hf_model, x)
        scale = ours.abs().max()
        assert scale > 0, name
        torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5 * scale, msg=name)


def test_conversion_refuses_what_transformers_cannot_hold():
    from timm.models.swin_transformer import SwinTransformer

    from models.swin_conversion import hf_swin_from_timm

    model = SwinTransformer(img_size=32, patch_size=2, window_size=4, embed_dim=16, depths=(2, 2), num_heads=(2, 4),
                            num_classes=0)
    with pytest.raises(ValueError, match="head that is not nn.Linear"):
        hf_swin_from_timm(model)


@pytest.mark.parametrize("build", [tiny_timm_swin, tiny_hf_swin], ids=["timm", "transformers"])
def test_cp_lrp_conserves_on_bias_free_swin(build):
    """CP-LRP on a bias-free Swin (every bias and relative position table zero; the shift masks kept: they only
    shape the probabilities, held constant): the relevance entering every block, through the patch merges, and
    the input scores' sum (summed over each last-stage cell) equal the explained logit (float64)."""
    model = build(bias_free=True)
    target = torch.tensor([1, 4])
    report = build_method("cp_lrp").relevance_by_layer(model, swin_images(2), target=target)
    logit = report["logit"]
    scale = logit.abs().max()
    for layer, sums in enumerate(report["blocks"]):
        torch.testing.assert_close(sums, logit, rtol=0, atol=1e-9 * scale, msg=f"block {layer}")
    torch.testing.assert_close(report["input"], logit, rtol=0, atol=1e-9 * scale)


def test_padded_grids_wrong_sizes_and_earlier_stages_are_refused():
    from timm.models.swin_transformer import SwinTransformer

    padded = SwinTransformer(img_size=40, patch_size=2, window_size=4, embed_dim=16, depths=(2, 2), num_heads=(2, 4),
                             num_classes=5)
    with pytest.raises(TypeError, match="Swin pads it"):
        adapter_for(padded)
    model = tiny_timm_swin()
    with pytest.raises(ValueError, match="reads images of 32x32 pixels"):
        build_method("raw_attention")(model, torch.randn(1, 3, 64, 64, dtype=torch.float64))
    for name, options in (("raw_attention", {"layer": 1}), ("gradcam", {"layer": 0}),
                          ("beyond_intuition_head", {"start_layer": 0})):
        with pytest.raises(MethodUndefinedError, match=r"in another token space than the read-out's \(the tokens "
                                                       r"change entering block\(s\) \[2\]\)"):
            build_method(name, **options)(model, swin_images(1))


@pytest.mark.parametrize("build", [tiny_timm_swin, tiny_hf_swin], ids=["timm", "transformers"])
def test_rollout_composes_through_the_patch_merge(build):
    """Rollout from block 0 equals the dense product computed here: the mean read-out row of ``M'_3``, times
    ``M'_2``, the merge ``T`` (``[64, 256]``, 1/4 at each of a merged token's four sources, built by loops), ``M'_1``,
    ``M'_0`` (``M' = mean_h A + I``, row-normalised), then each last-stage token the sum of its four sources."""
    model = build()
    x = swin_images(2)
    adapter = adapter_for(model)
    with ActivationRecorder() as rec, torch.no_grad(), adapter.recording.eager_attention():
        for layer in range(len(adapter.blocks)):
            adapter.recording.attention(rec, layer, layer, transform=lambda a: a.mean(dim=1))
        adapter.forward(adapter.inputs.prepare(x), grad_from_block=len(adapter.blocks))
    merge = torch.zeros(64, 256, dtype=torch.float64)
    for i in range(8):
        for j in range(8):
            for di in (0, 1):
                for dj in (0, 1):
                    merge[i * 8 + j, (2 * i + di) * 16 + 2 * j + dj] = 0.25
    factors = []
    for layer in range(len(adapter.blocks)):
        m = rec[layer] + torch.eye(rec[layer].shape[-1], dtype=torch.float64)
        factors.append(m / m.sum(dim=-1, keepdim=True))
    row = factors[3].mean(dim=1)                                       # the mean over the 64 content rows
    row = torch.einsum("bi,bij->bj", row, factors[2]) @ merge
    row = torch.einsum("bi,bij->bj", torch.einsum("bi,bij->bj", row, factors[1]), factors[0])
    expected = row @ (merge > 0).double().t()
    ours = build_method("rollout")(model, x)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(ours.sum(dim=1), torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-12)


def test_token_spaces_and_transitions():
    """Swin: each stage's grid, width and heads, the merge into block 2 as a 4:1 map whose rows sum to 1; every
    other family of the matrix: one token space (the layout's) and the identity between all blocks."""
    from tests.families import FAMILIES

    model = tiny_timm_swin()
    adapter = adapter_for(model)
    layout = adapter.inputs.layout(swin_images(1))
    spaces = [adapter.token_flow.token_space(layer, layout) for layer in range(len(adapter.blocks))]
    expected = [(256, (16, 16), 16, 2)] * 2 + [(64, (8, 8), 32, 4)] * 2
    assert [(s.count, s.grid, s.width, s.heads) for s in spaces] == expected
    like = torch.empty(0, dtype=torch.float64)
    flow = adapter.token_flow
    assert [flow.transition(layer, like) is None for layer in range(len(adapter.blocks))] == [True, True, False, True]
    merge = adapter.token_flow.transition(2, like).to_dense()
    assert merge.shape == (64, 256) and torch.equal(merge.sum(dim=1), torch.ones(64, dtype=torch.float64))
    assert torch.equal((merge > 0).sum(dim=0), torch.ones(256, dtype=torch.long))   # each source in one merge
    assert merge[8 + 1, 2 * 16 + 2] == 0.25 and merge[8 + 1, 3 * 16 + 3] == 0.25     # token (1, 1): rows 2-3, cols 2-3
    for family in FAMILIES:
        if family.adapter in (type(adapter), type(adapter_for(tiny_hf_swin()))):
            continue
        other = adapter_for(family.build())
        inputs = other.inputs.prepare(family.inputs(2))
        other_layout = other.inputs.layout(inputs)
        for layer in range(len(other.blocks)):
            assert other.token_flow.transition(layer, like) is None, family.name
            space = other.token_flow.token_space(layer, other_layout)
            assert (space.count, space.width, space.heads) == (other_layout.num_positions, other.token_flow.width,
                                                               other.token_flow.heads), family.name
