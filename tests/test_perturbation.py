"""Perturbation test: ordering and tie-breaking, masking, accuracy curves and both AUC conventions."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from callbacks.perturbation import (PerturbationCurve, PerturbationTest, masked_images, perturbation_auc,
                                    pixels_per_step, random_tie_order, removal_ranks)
from callbacks.pixel_maps import pixel_maps

torch.set_num_threads(1)


def test_removal_ranks_break_ties_by_flat_index():
    maps = torch.tensor([[[0.5, 1.0], [0.5, 0.0]]])  # flat: 0.5, 1.0, 0.5, 0.0
    assert removal_ranks(maps).tolist() == [[1, 0, 2, 3]]
    # negative test: the negated map; the tie (-0.5 at flat 0 and 2) again goes to the smaller index first
    assert removal_ranks(-maps).tolist() == [[1, 3, 2, 0]]
    flat = torch.zeros(1, 3, 3)  # a constant map removes pixels in row-major order
    assert removal_ranks(flat).tolist() == [list(range(9))]


def test_random_tie_order_breaks_only_ties_and_depends_on_the_index_alone():
    maps = torch.tensor([[[0.5, 1.0], [0.5, 0.0]]])
    order = torch.tensor([[3, 2, 1, 0]])           # ties go to the pixel earlier in this order
    assert removal_ranks(maps, order).tolist() == [[2, 0, 1, 3]]
    assert removal_ranks(-maps, order).tolist() == [[2, 3, 1, 0]]
    # a constant map is removed in the tie order itself
    flat = torch.zeros(2, 3, 3)
    orders = random_tie_order(torch.tensor([7, 3]), 9, seed=1)
    ranks = removal_ranks(flat, orders)
    assert all(sorted(o) == list(range(9)) for o in orders.tolist())
    assert torch.equal(ranks.gather(1, orders), torch.arange(9).expand(2, 9))
    # per sample: the same index gives the same order in any batch; another seed or index another one
    assert torch.equal(random_tie_order(torch.tensor([3]), 9, seed=1)[0], orders[1])
    assert not torch.equal(random_tie_order(torch.tensor([3]), 9, seed=2)[0], orders[1])
    assert not torch.equal(orders[0], orders[1])
    # no ties: the order is irrelevant
    distinct = torch.rand(2, 3, 3)
    assert torch.equal(removal_ranks(distinct, orders), removal_ranks(distinct))


def test_callback_random_ties_need_the_dataset_index():
    cb = PerturbationTest(class_settings=["target"], fractions=(0.5,), ties="random")
    cb._build(["m"])
    images, labels = torch.ones(2, 3, 2, 2), torch.tensor([1, 1])
    outputs = {"relevance": {"m": {"target": torch.zeros(2, 2, 2)}}, "logits": torch.tensor([[0.0, 1.0]] * 2)}
    with pytest.raises(KeyError, match="index"):
        cb.update(outputs, {"image": images, "label": labels}, BrightnessClassifier())
    cb.update(outputs, {"image": images, "label": labels, "index": torch.tensor([0, 1])}, BrightnessClassifier())
    assert cb.compute()["perturbation/m/positive/target/curve"] == [1.0, 0.0]


def test_pixels_per_step_truncates_like_the_reference():
    assert pixels_per_step((0.1, 0.5, 0.9), 224 * 224) == [5017, 25088, 45158]
    assert pixels_per_step((0.3, 0.7), 10) == [3, 7]


def test_masked_images_zero_all_channels_before_normalisation():
    images = torch.ones(1, 3, 2, 2)
    ranks = torch.tensor([[1, 0, 2, 3]])
    out = masked_images(images, ranks, [1, 3], torch.zeros(3))
    assert out.shape == (2, 1, 3, 2, 2)
    assert out[0, 0, :, 0, 1].tolist() == [0, 0, 0] and out[0].sum() == 9
    assert out[1, 0, 0].tolist() == [[0, 0], [0, 1]]
    grey = masked_images(images, ranks, [1], torch.tensor([0.1, 0.2, 0.3]))
    assert torch.allclose(grey[0, 0, :, 0, 1], torch.tensor([0.1, 0.2, 0.3]))


def test_auc_conventions_by_hand():
    fractions = [0.1 * i for i in range(1, 10)]
    ones = [1.0] * 10
    assert perturbation_auc(ones, fractions, "chefer") == pytest.approx(90.0)
    assert perturbation_auc(ones, fractions, "bi") == pytest.approx(95.0)  # + trapezoid (1 + 0) / 2 * 0.1
    curve = [0.9, 0.8, 0.7, 0.5, 0.4, 0.3, 0.3, 0.2, 0.1, 0.0]
    x = [0.0] + fractions
    assert perturbation_auc(curve, fractions, "chefer") == pytest.approx(100 * np.trapezoid(curve, x))
    from sklearn.metrics import auc

    assert perturbation_auc(curve, fractions, "bi") == pytest.approx(100 * auc(x + [1.0], curve + [0.0]))
    assert perturbation_auc([1.0, 0.5], [0.5], "chefer") == pytest.approx(100 * 0.5 * 0.75)
    with pytest.raises(ValueError, match="AUC convention"):
        perturbation_auc(curve, fractions, "mean")
    with pytest.raises(ValueError, match="expected 10"):
        perturbation_auc(curve[:-1], fractions)


def test_curve_metric_sums_and_divides():
    m = PerturbationCurve(3)
    m.update(torch.tensor([[True, True, False], [True, False, False]]))
    m.update(torch.tensor([[False, True, True]]))
    assert m.compute().tolist() == pytest.approx([2 / 3, 2 / 3, 1 / 3])


class BrightnessClassifier:
    """Fake evaluation module: class 1 iff the mean intensity of the [0, 1] image exceeds 0.5."""

    mean = (0.5, 0.5, 0.5)
    method_names = ["m"]

    def __init__(self):
        self.calls = 0

    def classify(self, images, batch_size=None):
        self.calls += 1
        return (images.mean(dim=(1, 2, 3)) > 0.5).long()


def test_callback_curves_by_hand():
    # two 2x2 white images, both labelled 1 (clean prediction: 1 = correct)
    images = torch.ones(2, 3, 2, 2)
    labels = torch.tensor([1, 1])
    # pixel maps: sample 0 ranks pixels 3 > 2 > 1 > 0; sample 1 is constant (ties -> flat order 0, 1, 2, 3)
    rel = torch.stack([torch.tensor([[0.0, 1.0], [2.0, 3.0]]), torch.zeros(2, 2)])
    cb = PerturbationTest(class_settings=["predicted", "target"], fractions=(0.25, 0.5, 0.75), auc="chefer")
    module = BrightnessClassifier()
    cb._build(["m"])
    outputs = {"relevance": {"m": {"predicted": rel, "target": rel}}, "logits": torch.tensor([[0.0, 1.0], [0.0, 1.0]])}
    cb.update(outputs, {"image": images, "label": labels}, module)
    # mean after removing k of 4 white pixels: 1 - k/4 -> correct iff k/4 < 0.5, i.e. k = 1 only
    res = cb.compute()
    assert res["perturbation/m/positive/predicted/curve"] == pytest.approx([1.0, 1.0, 0.0, 0.0])
    assert res["perturbation/m/negative/target/curve"] == pytest.approx([1.0, 1.0, 0.0, 0.0])
    assert res["perturbation/m/positive/predicted/auc"] == pytest.approx(100 * (0.25 + 0.125))
    assert module.calls == 2  # the same tensor for both settings is tested once per direction


def test_callback_direction_matters_and_step0_is_clean():
    # left half black, right half white; label 1 = "bright" (mean > 0.5 is false at the start: mean = 0.5)
    images = torch.zeros(1, 3, 2, 2)
    images[..., 1] = 1.0
    labels = torch.tensor([0])
    rel = torch.tensor([[[0.0, 1.0], [0.0, 1.0]]])  # the white pixels are the relevant ones
    cb = PerturbationTest(class_settings=["target"], fractions=(0.5,), masking="mean")
    cb._build(["m"])
    module = BrightnessClassifier()
    logits = torch.tensor([[5.0, 0.0]])  # clean prediction 0 = correct
    cb.update({"relevance": {"m": {"target": rel}}, "logits": logits}, {"image": images, "label": labels}, module)
    res = cb.compute()
    # 'mean' masking fills 0.5: positive removes the white pixels -> mean 0.25 -> class 0, correct
    assert res["perturbation/m/positive/target/curve"] == [1.0, 1.0]
    # negative removes the black pixels -> mean 0.75 -> class 1, wrong
    assert res["perturbation/m/negative/target/curve"] == [1.0, 0.0]


def test_token_maps_are_upsampled_bilinearly_and_normalised_per_sample():
    rel = torch.tensor([[0.0, 1.0, 2.0, 3.0], [10.0, 10.0, 10.0, 20.0]])
    maps = pixel_maps(rel, (4, 4))
    assert maps.shape == (2, 4, 4)
    for b in range(2):
        assert maps[b].min() == 0 and maps[b].max() == 1
    ref = torch.nn.functional.interpolate(rel[0].reshape(1, 1, 2, 2), scale_factor=2, mode="bilinear",
                                          align_corners=False)[0, 0]
    assert torch.allclose(maps[0], (ref - ref.min()) / (ref.max() - ref.min()))


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="masking"):
        PerturbationTest(masking="blur")
    with pytest.raises(ValueError, match="tie-breaking"):
        PerturbationTest(ties="first")
    with pytest.raises(ValueError, match="class_settings"):
        PerturbationTest(class_settings=["top"])
    with pytest.raises(ValueError, match="fractions"):
        PerturbationTest(fractions=(0.5, 0.2))
