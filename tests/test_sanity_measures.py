"""The sanity checks' measures (:mod:`evaluation.sanity`) against scipy and skimage, and on hand-worked cases."""
from __future__ import annotations

import math

import pytest
import torch

from evaluation.sanity import emprt, histogram_entropy, spearman_abs, ssim, topk_intersection


def _maps(seed: int, shape=(3, 20, 17)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_ssim_matches_skimage():
    metrics = pytest.importorskip("skimage.metrics")
    a, b = _maps(0), _maps(1)
    b[0] = a[0] + 0.3 * b[0]                        # one close pair, two unrelated ones
    a[2, :5] = a[2, :5].round()                      # ties and flat parts
    ours = ssim(a, b)
    for i in range(a.shape[0]):
        x = (a[i].abs() / a[i].abs().max()).numpy()
        y = (b[i].abs() / b[i].abs().max()).numpy()
        theirs = metrics.structural_similarity(x, y, win_size=7, data_range=1.0)
        assert ours[i].item() == pytest.approx(theirs, abs=1e-10)
    raw = ssim(a, b, win_size=5, data_range=8.0, normalise=False)
    for i in range(a.shape[0]):
        theirs = metrics.structural_similarity(a[i].numpy(), b[i].numpy(), win_size=5, data_range=8.0)
        assert raw[i].item() == pytest.approx(theirs, abs=1e-10)
    assert torch.allclose(ssim(a, a), torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="win_size"):
        ssim(a[:, :5, :5], b[:, :5, :5])


def test_spearman_matches_scipy_with_ties_and_masks():
    stats = pytest.importorskip("scipy.stats")
    a, b = _maps(2, (4, 30)), _maps(3, (4, 30))
    a[1, :10] = 1.0                                  # ties
    valid = torch.ones(4, 30, dtype=torch.bool)
    valid[3, 20:] = False
    ours = spearman_abs(a, b, valid)
    for i in range(4):
        keep = valid[i]
        theirs = stats.spearmanr(a[i][keep].abs().numpy(), b[i][keep].abs().numpy()).statistic
        assert ours[i].item() == pytest.approx(theirs, abs=1e-12)
    assert spearman_abs(a, -a).tolist() == pytest.approx([1.0] * 4)   # absolute maps
    assert math.isnan(spearman_abs(torch.ones(1, 5), a[:1, :5]).item())


def test_topk_intersection_by_hand():
    a = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    b = torch.tensor([[5.0, 0.0, -4.0, 2.0, 1.0, 3.0]])   # |b| top-3: units 0, 2, 5
    assert topk_intersection(a, b, 0.5).item() == pytest.approx(2 / 3)
    assert topk_intersection(a, a, 0.5).item() == 1.0
    with pytest.raises(ValueError, match="fraction"):
        topk_intersection(a, b, 0.0)


def test_entropy_and_emprt_by_hand():
    one_hot = torch.tensor([[0.0, 0.0, 0.0, 1.0]])          # histogram: 3 in bin 0, 1 in the last bin
    uniform = torch.tensor([[0.05, 0.35, 0.65, 0.95]])       # 4 distinct bins of 10
    h1 = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert histogram_entropy(one_hot, bins=10).item() == pytest.approx(h1)
    assert histogram_entropy(uniform * 2, bins=10).item() == pytest.approx(math.log(4))
    assert emprt(one_hot, uniform, bins=10).item() == pytest.approx((math.log(4) - h1) / h1)
    assert math.isnan(histogram_entropy(torch.zeros(1, 4)).item())
