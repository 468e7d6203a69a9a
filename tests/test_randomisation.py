"""The Transformer-aware randomiser (:mod:`evaluation.randomisation`): coverage on every family of the
conformance matrix, seeded and on a copy, and the holes of Quantus 0.6.0's randomiser it fills."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from evaluation.randomisation import (
    coverage,
    randomisation_groups,
    randomisation_steps,
    randomised_copy,
    randomised_models,
)
from methods.adapters import adapter_for
from tests.families import FAMILIES


def _snapshot(model: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(model: nn.Module, snapshot: dict) -> bool:
    return all(torch.equal(v, snapshot[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_full_randomisation_covers_every_family(family):
    model = family.build()
    before = _snapshot(model)
    groups = [g for g, _ in randomisation_groups(model)]
    assert groups[0] == "embedding" and groups[-1] == "head"
    depth = len(adapter_for(model).blocks)
    assert [g for g in groups if g.startswith("block_")] == [f"block_{i}" for i in range(depth)]
    randomised = randomised_copy(model, groups, seed=3)
    assert _same(model, before), "the user's model was written"
    assert coverage(model, randomised) >= 0.99
    norms = [(n, p) for n, p in randomised.named_parameters() if "norm" in n.lower() and p.dim() == 1]
    for name, p in norms:   # random affine parameters, not the identity reset_parameters() restores
        assert float(p.std()) > 0.05, name


def test_randomisation_is_seeded_and_cascade_consistent():
    family = next(f for f in FAMILIES if f.name == "timm_vit_reg4_dinov2")
    model = family.build()
    a = randomised_copy(model, ["head", "block_2"], seed=1)
    b = randomised_copy(model, ["head", "block_2"], seed=1)
    c = randomised_copy(model, ["head", "block_2"], seed=2)
    assert _same(a, _snapshot(b)) and not _same(a, _snapshot(c))
    full = randomised_copy(model, [g for g, _ in randomisation_groups(model)], seed=1)
    for (name, p), (_, q), (_, r) in zip(a.named_parameters(), full.named_parameters(), model.named_parameters()):
        if name.startswith(("blocks.2", "head", "norm")):
            assert torch.equal(p, q), name            # the same draw whichever other groups are randomised
        else:
            assert torch.equal(p, r), name            # the other groups untouched
    steps = randomisation_steps(model, "top_down")
    assert steps[0] == ("head", ["head"]) and steps[-1][1][-1] == "embedding" and len(steps) == 5
    assert [s for s, g in randomisation_steps(model, "independent")] == [s for s, _ in steps][::-1]
    assert [s for s, _ in randomised_models(model, "bottom_up")][0] == "embedding"
    with pytest.raises(ValueError, match="unknown groups"):
        randomised_copy(model, ["block_9"])
    with pytest.raises(ValueError, match="order"):
        randomisation_steps(model, "sideways")


def _quantus_fully_randomised(model: nn.Module) -> nn.Module:
    """Quantus 0.6.0's MPRT randomiser (``PyTorchModel.get_random_layer_generator``, cascading top-down) run to
    its last step: every module with ``reset_parameters`` reset."""
    from quantus.helpers.model.pytorch_model import PyTorchModel

    steps = list(PyTorchModel(model, channel_first=True).get_random_layer_generator("top_down", seed=42))
    return steps[-1][1]


def test_quantus_leaves_transformer_parameters_alone_timm_vit():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=24,
                              depth=2, num_heads=2, num_classes=5, reg_tokens=2, class_token=True).eval()
    with torch.no_grad():
        model.cls_token.normal_()
        model.reg_token.normal_()
    theirs = _quantus_fully_randomised(model)
    ours = randomised_copy(model, [g for g, _ in randomisation_groups(model)], seed=0)
    kept = {n for n, p in model.named_parameters() if torch.equal(p, dict(theirs.named_parameters())[n])}
    for name in ("cls_token", "reg_token", "pos_embed", "norm.weight", "norm.bias", "blocks.0.norm1.weight",
                 "blocks.1.norm2.bias"):
        assert name in kept, name                     # Quantus: tokens, positions and fresh norms untouched
    assert coverage(model, theirs) < 0.99
    assert coverage(model, ours) >= 0.99


def test_quantus_leaves_multihead_attention_and_tokens_alone_open_clip():
    family = next(f for f in FAMILIES if f.name == "open_clip_vision")
    model = family.build()
    before = _snapshot(model)
    theirs = _quantus_fully_randomised(model)
    assert _same(model, before)
    mine = dict(model.named_parameters())
    got = dict(theirs.named_parameters())
    in_proj = [n for n in mine if n.endswith(("in_proj_weight", "in_proj_bias"))]
    assert in_proj
    for name in in_proj + ["clip.visual.class_embedding", "clip.visual.positional_embedding",
                           "clip.positional_embedding"]:
        assert torch.equal(mine[name], got[name]), name       # never touched
    lns = [n for n, m in theirs.named_modules() if isinstance(m, nn.LayerNorm)]
    for name in lns:                                          # reset to the identity, not random
        module = dict(theirs.named_modules())[name]
        assert torch.equal(module.weight, torch.ones_like(module.weight))
        assert torch.equal(module.bias, torch.zeros_like(module.bias))
    ours = randomised_copy(model, [g for g, _ in randomisation_groups(model)], seed=0)
    for name in in_proj + ["clip.visual.class_embedding", "clip.visual.positional_embedding"]:
        assert not torch.equal(mine[name], dict(ours.named_parameters())[name]), name
    print(f"coverage open_clip_vision: ours {coverage(model, ours):.4f}, quantus {coverage(model, theirs):.4f}")
    assert coverage(model, theirs) < 0.99 <= coverage(model, ours)
