"""Segmentation metrics against hand-computed values and a direct sklearn / numpy computation."""
import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, f1_score

from callbacks.segmentation import SegmentationTest
from evaluation.segmentation import SegmentationMetrics, average_precision, binarize, two_channel_ap

torch.set_num_threads(1)
EPS = np.spacing(1)


def test_average_precision_matches_sklearn_with_ties():
    gen = torch.Generator().manual_seed(0)
    scores = (torch.rand(4, 300, generator=gen) * 7).floor() / 7  # many ties
    labels = torch.rand(4, 300, generator=gen) > 0.7
    ours = average_precision(scores, labels)
    for b in range(4):
        assert float(ours[b]) == pytest.approx(average_precision_score(labels[b].numpy(), scores[b].numpy()), abs=1e-12)


def test_average_precision_by_hand():
    # scores 0.9 (pos), 0.5 (neg), 0.5 (pos), 0.1 (neg): thresholds 0.9 -> P=1, R=.5; 0.5 -> P=2/3, R=1
    ap = average_precision(torch.tensor([[0.9, 0.5, 0.5, 0.1]]), torch.tensor([[True, False, True, False]]))
    assert float(ap) == pytest.approx(0.5 * 1.0 + 0.5 * 2 / 3)


def test_threshold_is_the_mean_of_the_normalised_map():
    maps = torch.tensor([[[0.0, 0.2], [0.3, 1.0]]])  # mean 0.375
    assert binarize(maps).tolist() == [[[False, False], [False, True]]]


def test_metric_by_hand():
    maps = torch.tensor([[[0.0, 0.2], [0.3, 1.0]]])  # foreground prediction: only the bottom-right pixel
    gt = torch.tensor([[[0.0, 0.0], [1.0, 1.0]]])
    m = SegmentationMetrics()
    m.update(maps, gt)
    r = {k: float(v) for k, v in m.compute().items()}
    assert r["pixel_accuracy"] == pytest.approx(3 / 4)
    # background: intersection 2 (top row), union 3; foreground: intersection 1, union 2
    assert r["miou"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert r["f1"] == pytest.approx(2 * 1 / (2 * 1 + 0 + 1))
    # rows: top row has no foreground at all -> 0 (sklearn zero_division); bottom row F1 = 2/3
    assert r["f1_rows"] == pytest.approx((0 + 2 / 3) / 2)
    scores = np.array([1.0, 0.8, 0.7, 0.0, 0.0, 0.2, 0.3, 1.0])
    labels = np.array([1, 1, 0, 0, 0, 0, 1, 1])
    assert r["map"] == pytest.approx(average_precision_score(labels, scores))


def test_metric_against_direct_computation():
    gen = torch.Generator().manual_seed(1)
    maps = torch.rand(5, 8, 6, generator=gen) ** 2
    low, high = maps.amin((1, 2), keepdim=True), maps.amax((1, 2), keepdim=True)
    maps = (maps - low) / (high - low)
    gt = (torch.rand(5, 8, 6, generator=gen) > 0.6).float()
    gt[2] = 0  # an image without foreground
    m = SegmentationMetrics()
    m.update(maps[:2], gt[:2])
    m.update(maps[2:], gt[2:])
    r = {k: float(v) for k, v in m.compute().items()}

    correct = labeled = 0
    inter, union = np.zeros(2), np.zeros(2)
    aps, f1s, rows = [], [], []
    for b in range(5):
        mp, g = maps[b].numpy(), gt[b].numpy().astype(int)
        pred = (mp > mp.mean()).astype(int)
        correct += (pred == g).sum()
        labeled += g.size
        for c in (0, 1):
            inter[c] += ((pred == c) & (g == c)).sum()
            union[c] += ((pred == c) | (g == c)).sum()
        aps.append(np.nan_to_num(average_precision_score(np.concatenate([1 - g.ravel(), g.ravel()]),
                                                         np.concatenate([1 - mp.ravel(), mp.ravel()]))))
        f1s.append(f1_score(g.ravel(), pred.ravel(), zero_division=0))
        rows.append(np.mean([f1_score(g[i], pred[i], zero_division=0) for i in range(g.shape[0])]))
    assert r["pixel_accuracy"] == pytest.approx(correct / (EPS + labeled), abs=1e-12)
    assert r["miou"] == pytest.approx(np.mean(inter / (EPS + union)), abs=1e-12)
    assert r["map"] == pytest.approx(np.mean(aps), abs=1e-9)
    assert r["f1"] == pytest.approx(np.mean(f1s), abs=1e-12)
    assert r["f1_rows"] == pytest.approx(np.mean(rows), abs=1e-12)


def test_two_channel_ap_is_per_image():
    maps = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])
    gt = torch.tensor([[[1.0, 0.0]], [[1.0, 0.0]]])
    assert two_channel_ap(maps, gt).tolist() == pytest.approx([1.0, 0.5])


def test_callback_upsamples_token_maps_and_needs_masks():
    cb = SegmentationTest(methods=["m"])
    cb.build(["m"])
    rel = torch.tensor([[0.0, 0.0, 0.0, 1.0]])  # 2x2 tokens on a 4x4 image: the bottom-right patch
    gt = torch.zeros(1, 4, 4)
    gt[0, 2:, 2:] = 1
    cb.update({"relevance": {"m": {"predicted": rel}}}, {"mask": gt})
    res = cb.compute()
    assert set(res) == {f"segmentation/m/{k}" for k in ("pixel_accuracy", "miou", "map", "f1", "f1_rows")}
    assert res["segmentation/m/map"] == pytest.approx(1.0)  # every foreground pixel outranks every background pixel
    assert set(cb.higher_is_better().values()) == {True}   # every segmentation metric: higher is better
    with pytest.raises(KeyError, match="mask"):
        cb.update({"relevance": {"m": {"predicted": rel}}}, {"image": torch.zeros(1, 3, 4, 4)})


def test_constant_map_ties_every_pixel_as_the_reference_script():
    """Chefer's script min-max normalises a constant map to 0/0 = NaN and zeroes the NaNs of both score channels:
    every one of the 2 * H * W scores ties, so the AP is the share of positives, N / 2N = 0.5, whatever the mask.
    (Scored as the all-zero normalised map [1 - 0, 0], a 4 x 4 mask with a quarter foreground would get
    (1 - 0.25)^2 + 0.25 / 2 = 0.6875.)"""
    gt = torch.zeros(1, 4, 4)
    gt[0, :2, :2] = 1  # foreground share 1/4
    raw = np.full((4, 4), 3.0)
    with np.errstate(invalid="ignore"):
        res = (raw - raw.min()) / (raw.max() - raw.min())   # the reference's normalisation: all NaN
    fg_scores, bg_scores = np.nan_to_num(res), np.nan_to_num(1 - res)   # both channels zeroed
    labels = np.concatenate([(gt[0] == 0).numpy().ravel(), (gt[0] == 1).numpy().ravel()])
    reference = average_precision_score(labels, np.concatenate([bg_scores.ravel(), fg_scores.ravel()]))
    assert reference == 0.5
    assert two_channel_ap(torch.zeros(1, 4, 4), gt).tolist() == [reference]
    cb = SegmentationTest(methods=["flat"])
    cb.build(["flat"])
    cb.update({"relevance": {"flat": {"predicted": torch.full((1, 4), 7.0)}}}, {"mask": gt})
    assert cb.compute()["segmentation/flat/map"] == 0.5
    # a map with two values is not constant: scored as before
    assert two_channel_ap(torch.tensor([[[1.0, 0.0]]]), torch.tensor([[[1.0, 0.0]]])).tolist() == [1.0]
