"""The generic baselines run the passes their cost rows count (``benchmarks/methods.py``): SmoothGrad ``samples``
noisy forwards (one more, without autograd, only to resolve ``target=None``), Integrated Gradients ``steps``
(chunked by ``internal_batch_size``), occlusion one clean forward and one per window."""
from __future__ import annotations

import pytest
import torch

from methods import build_method
from tests.generic_baselines_support import family


def _counted(model):
    rows = []
    handle = model.head.register_forward_hook(lambda _m, _i, out: rows.append(out.shape[0]))
    return rows, handle


def test_smoothgrad_resolves_the_target_with_a_forward_only_when_none_is_given():
    model = family("timm_vit_cls").build().eval()
    images = family("timm_vit_cls").inputs(2)
    method = build_method("smoothgrad", samples=3, samples_per_forward=1, seed=1)
    rows, handle = _counted(model)
    try:
        predicted = model(images).argmax(-1)
        rows.clear()
        given = method(model, images, target=predicted)
        assert rows == [2, 2, 2]
        rows.clear()
        resolved = method(model, images)
        assert rows == [2, 2, 2, 2]
    finally:
        handle.remove()
    torch.testing.assert_close(given, resolved, rtol=0, atol=0)
    contrast = build_method("smoothgrad", samples=2, options={"explain": "logit_difference"})
    with pytest.raises(ValueError, match="foil"):
        contrast(model, images, target=1)
    torch.testing.assert_close(contrast(model, images, target=1, foil=torch.tensor([0, 2])),
                               contrast(model, images, target=torch.tensor([1, 1]), foil=torch.tensor([0, 2])))


def test_integrated_gradients_and_occlusion_count_their_forwards():
    model = family("timm_vit_cls").build().eval()
    images = family("timm_vit_cls").inputs(2)
    rows, handle = _counted(model)
    try:
        build_method("integrated_gradients", steps=4, internal_batch_size=2)(model, images, target=1)
        assert rows == [2, 2, 2, 2]
        rows.clear()
        build_method("occlusion", batch_size=8)(model, images, target=1)   # 16 patches of 8 px
        assert rows == [2] + [8] * 4
    finally:
        handle.remove()
