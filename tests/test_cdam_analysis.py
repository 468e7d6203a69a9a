"""callbacks.cdam_analysis: metrics against hand-computed numpy / scipy values, N-process equivalence."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from callbacks.cdam_analysis import CDAMAnalysis
from evaluation.cdam import mask_to_map, positive_share, sparsity_per_image
from evaluation.metrics import MeanOverImages, PooledPearson


def _batches(seed=0, n_batches=3, b=4, grid=4, patch=4):
    g = torch.Generator().manual_seed(seed)
    out = []
    size = grid * patch
    for _ in range(n_batches):
        rel = {m: {s: torch.randn(b, grid * grid, generator=g) for s in ("predicted", "target", "other")}
               for m in ("cdam", "tam", "attn")}
        rel["attn"]["predicted"] = rel["cdam"]["predicted"] * 0.5 + 0.5 * torch.randn(b, grid * grid, generator=g)
        mask = (torch.rand(b, size, size, generator=g) < 0.3).float()
        other = (torch.rand(b, size, size, generator=g) < 0.3).float() * (1 - mask)
        out.append(({"relevance": rel}, {"mask": mask, "other_mask": other, "image": torch.rand(b, 3, size, size)}))
    return out


def _run(batches, **kwargs):
    cb = CDAMAnalysis(methods=["cdam", "tam", "attn"], **kwargs)
    for metric in cb.metrics():
        metric.reset()
    for outputs, batch in batches:
        cb.update(outputs, batch)
    return cb.compute()


def test_pooled_pearson_matches_scipy():
    batches = _batches()
    res = _run(batches)
    x = np.concatenate([o["relevance"]["cdam"]["predicted"].double().numpy().ravel() for o, _ in batches])
    y = np.concatenate([o["relevance"]["attn"]["predicted"].double().numpy().ravel() for o, _ in batches])
    assert res["cdam_analysis/pearson/cdam__vs__attn"] == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
    assert res["cdam_analysis/pearson/cdam__vs__attn"] > 0.5  # correlated by construction
    # pooled over images, not a mean of per-image correlations: a per-image offset changes it
    shifted = [({"relevance": {m: dict(v) for m, v in o["relevance"].items()}}, b) for o, b in batches]
    for i, (o, _) in enumerate(shifted):
        o["relevance"]["attn"]["predicted"] = o["relevance"]["attn"]["predicted"] + 10.0 * i
    y2 = np.concatenate([o["relevance"]["attn"]["predicted"].double().numpy().ravel() for o, _ in shifted])
    res2 = _run(shifted)
    assert res2["cdam_analysis/pearson/cdam__vs__attn"] == pytest.approx(stats.pearsonr(x, y2)[0], abs=1e-12)


def test_sparsity_hand_computed():
    s = torch.tensor([[1.0, 0.01, -0.02, 0.5], [-2.0, 0.04, 0.2, 0.06], [-1.0, -0.5, -0.2, -3.0]])
    # image 0: max 1 -> thr 0.05: |0.01|,|-0.02| below -> 2/4; image 1: max 0.2 -> thr 0.01: none -> 0
    # image 2: max -0.2 -> thr < 0 -> 0 (ill-defined, flagged); absmax: 0.05, 0.1 (0.04, 0.06 -> 2/4), 0.15 (none)
    np.testing.assert_allclose(sparsity_per_image(s).numpy(), [0.5, 0.0, 0.0])
    np.testing.assert_allclose(sparsity_per_image(s, absolute_max=True).numpy(), [0.5, 0.5, 0.0])
    cb = CDAMAnalysis(methods=["m"], discrimination=False)
    cb.update({"relevance": {"m": {"predicted": s}}}, {})
    res = cb.compute()
    assert res["cdam_analysis/sparsity/m"] == pytest.approx(0.5 / 3)
    assert res["cdam_analysis/sparsity_absmax/m"] == pytest.approx(1.0 / 3)
    assert res["cdam_analysis/nonpositive_max/m"] == pytest.approx(1.0 / 3)


def test_discrimination_shares_hand_computed():
    # 2x2 token grid on a 4x4 image (patch 2). Target object covers token 0 fully and half of token 1.
    mask = torch.zeros(1, 4, 4)
    mask[0, 0:2, 0:2] = 1
    mask[0, 0:2, 2] = 1
    other = torch.zeros(1, 4, 4)
    other[0, 2:4, 2:4] = 1
    np.testing.assert_allclose(mask_to_map(mask, (4,), (4, 4)).numpy(), [[1.0, 0.5, 0.0, 0.0]])
    tgt = torch.tensor([[3.0, 2.0, -5.0, 1.0]])  # positive mass 6: on target 3 + 1 = 4, on other 1
    oth = torch.tensor([[0.0, -1.0, 1.0, 3.0]])  # positive mass 4: on target 0, on other 3
    cb = CDAMAnalysis(methods=["cdam"], class_setting="target")
    cb.update({"relevance": {"cdam": {"target": tgt, "other": oth}}}, {"mask": mask, "other_mask": other})
    r = cb.compute()
    k = "cdam_analysis/discrimination/cdam/"
    assert r[k + "target_share_on_target"] == pytest.approx(4 / 6)
    assert r[k + "target_share_on_other"] == pytest.approx(1 / 6)
    assert r[k + "other_share_on_target"] == pytest.approx(0.0)
    assert r[k + "other_share_on_other"] == pytest.approx(3 / 4)
    assert r[k + "pearson_target_other"] == pytest.approx(stats.pearsonr(tgt[0].numpy(), oth[0].numpy())[0])
    # declared directions: a map's share on its own object is the goal, on the other object the opposite
    better = cb.higher_is_better()
    assert better[k + "target_share_on_target"] is True and better[k + "other_share_on_other"] is True
    assert better[k + "target_share_on_other"] is False and better[k + "other_share_on_target"] is False
    assert better[k + "pearson_target_other"] is None and set(better) == set(r)
    # equivalence with the nearest-upsampled pixel map
    up = tgt.view(1, 1, 2, 2).repeat_interleave(2, -1).repeat_interleave(2, -2)[0, 0].clamp_min(0)
    assert float((up * mask[0]).sum() / up.sum()) == pytest.approx(4 / 6)
    # no positive relevance -> skipped, not counted as 0
    assert torch.isnan(positive_share(torch.tensor([[-1.0, -2.0, 0.0, -1.0]]), torch.ones(1, 4))).all()


def test_missing_masks_and_settings_raise():
    cb = CDAMAnalysis(methods=["cdam"])
    s = torch.randn(2, 4)
    with pytest.raises(KeyError, match="other_mask"):
        cb.update({"relevance": {"cdam": {"predicted": s, "target": s, "other": s}}}, {"mask": torch.ones(2, 4, 4)})
    with pytest.raises(KeyError, match="class setting 'predicted'"):
        CDAMAnalysis(methods=["cdam"], discrimination=False).update({"relevance": {"cdam": {"target": s}}}, {})
    assert set(CDAMAnalysis(methods=["a"]).required_class_settings) == {"predicted", "target", "other"}


def test_split_over_processes_equals_single_process():
    """States are sums: merging two 'ranks' (what the sum reduction does under DDP) equals one process."""
    batches = _batches(seed=1, n_batches=4)
    whole = _run(batches)
    a, b = CDAMAnalysis(methods=["cdam", "tam", "attn"]), CDAMAnalysis(methods=["cdam", "tam", "attn"])
    for i, (outputs, batch) in enumerate(batches):
        (a if i % 2 else b).update(outputs, batch)
    for ma, mb in zip(a.metrics(), b.metrics()):
        ma.merge_state(mb)
    merged = a.compute()
    assert whole.keys() == merged.keys() and len(whole) > 10
    for key in whole:
        assert merged[key] == pytest.approx(whole[key], rel=1e-12, abs=1e-12), key


def test_states_are_sum_reduced_float64():
    for metric in (PooledPearson(), MeanOverImages()):
        for name, fx in metric._reductions.items():
            assert getattr(metric, name).dtype == torch.float64
            assert fx is not None and "sum" in getattr(fx, "__name__", str(fx))
