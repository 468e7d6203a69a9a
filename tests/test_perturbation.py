"""Perturbation test: ordering and tie-breaking, masking, accuracy curves and both AUC conventions."""
import numpy as np
import pytest
import torch

from callbacks.perturbation import PerturbationTest
from evaluation.auc import perturbation_auc
from evaluation.metrics import NegativePerturbationCurve, PerturbationCurve, PositivePerturbationCurve
from evaluation.perturbers import PixelPerturber, build_perturber, fill_pixels
from evaluation.pixel_maps import pixel_maps
from evaluation.ranking import removal_counts, removal_masks, removal_ranks
from methods.adapters import PatchGrid

torch.set_num_threads(1)


def test_removal_ranks_break_ties_by_flat_index():
    maps = torch.tensor([[[0.5, 1.0], [0.5, 0.0]]])  # flat: 0.5, 1.0, 0.5, 0.0
    assert removal_ranks(maps).tolist() == [[1, 0, 2, 3]]
    # negative test: the negated map; the tie (-0.5 at flat 0 and 2) again goes to the smaller index first
    assert removal_ranks(-maps).tolist() == [[1, 3, 2, 0]]
    flat = torch.zeros(1, 3, 3)  # a constant map removes pixels in row-major order
    assert removal_ranks(flat).tolist() == [list(range(9))]


def test_tie_breaker_orders_only_ties():
    maps = torch.tensor([[[0.5, 1.0], [0.5, 0.0]]])
    breaker = torch.tensor([[[0.1, 0.9], [0.7, 0.3]]])   # the tie (flat 0 and 2) goes to the larger value: 2
    assert removal_ranks(maps, breaker).tolist() == [[2, 0, 1, 3]]
    assert removal_ranks(-maps, -breaker).tolist() == [[1, 3, 2, 0]]
    # a constant map is removed in the breaker's own order; a map without ties ignores the breaker
    breakers = torch.rand(2, 3, 3)
    assert torch.equal(removal_ranks(torch.zeros(2, 3, 3), breakers), removal_ranks(breakers))
    distinct = torch.rand(2, 3, 3)
    assert torch.equal(removal_ranks(distinct, breakers), removal_ranks(distinct))


def test_removal_counts_truncate_like_the_reference():
    assert removal_counts((0.1, 0.5, 0.9), 224 * 224).tolist() == [5017, 25088, 45158]
    assert removal_counts((0.3, 0.7), 10).tolist() == [3, 7]
    # one number of units per sample (e.g. the real length of each text): [S, B]
    assert removal_counts((0.3, 0.7), torch.tensor([10, 4])).tolist() == [[3, 1], [7, 2]]


def test_units_that_may_not_be_removed_come_last():
    scores = torch.tensor([[0.9, 0.1, 0.5, 0.7]])
    removable = torch.tensor([[False, True, True, True]])   # e.g. padding or a special token at flat 0
    assert removal_ranks(scores, removable=removable).tolist() == [[3, 2, 1, 0]]
    assert removal_ranks(-scores, removable=removable).tolist() == [[3, 0, 1, 2]]
    masks = removal_masks(removal_ranks(scores, removable=removable), torch.tensor([[1], [3]]))
    assert masks.tolist() == [[[False, False, False, True]], [[False, True, True, True]]]


def test_masked_images_zero_all_channels_before_normalisation():
    images = torch.ones(1, 3, 2, 2)
    ranks = torch.tensor([[1, 0, 2, 3]])
    out = fill_pixels(images, removal_masks(ranks, removal_counts([0.25, 0.75], 4)), torch.zeros(3))
    assert out.shape == (2, 1, 3, 2, 2)
    assert out[0, 0, :, 0, 1].tolist() == [0, 0, 0] and out[0].sum() == 9
    assert out[1, 0, 0].tolist() == [[0, 0], [0, 1]]
    grey = fill_pixels(images, removal_masks(ranks, torch.tensor([1])), torch.tensor([0.1, 0.2, 0.3]))
    assert torch.allclose(grey[0, 0, :, 0, 1], torch.tensor([0.1, 0.2, 0.3]))
    # the perturbers: 'chefer' fills 0 in [0, 1] space, 'mean' the classifier's mean colour; step-major output
    removed = removal_masks(ranks, torch.tensor([1, 3]))
    batch = {"image": images}
    assert torch.equal(build_perturber("chefer").perturb(batch, removed, BrightnessClassifier()), out.flatten(0, 1))
    mean = build_perturber("mean").perturb(batch, removed, BrightnessClassifier())
    assert mean[0, :, 0, 1].tolist() == [0.5, 0.5, 0.5] and mean[0].sum() == 9 + 1.5
    assert isinstance(build_perturber("mean"), PixelPerturber)


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
    # the direction each test's area declares
    assert PositivePerturbationCurve.higher_is_better is False and NegativePerturbationCurve.higher_is_better is True


class BrightnessClassifier:
    """Fake classifier (``outputs["classifier"]``): class 1 iff the mean intensity of the [0, 1] image exceeds 0.5."""

    mean = (0.5, 0.5, 0.5)

    def __init__(self):
        self.calls = 0

    def predict(self, images, batch_size=None):
        self.calls += 1
        return (images.mean(dim=(1, 2, 3)) > 0.5).long()


def test_random_ties_score_a_constant_map_exactly_like_the_random_baseline():
    """ties='random': equal scores follow the random baseline's map of the sample (same seed), so a map that
    ranks nothing gets the random method's curves, in both directions; the dataset index is required."""
    from methods.random_baseline import random_token_scores

    torch.manual_seed(0)
    images = torch.rand(6, 3, 8, 8) * 0.4 + 0.35          # 8x8 images, a 2x2 token grid (patch 4)
    labels = torch.randint(0, 2, (6,))
    index = torch.tensor([5, 0, 9, 2, 7, 3])
    classifier = BrightnessClassifier()
    # a classifier that depends on which pixels remain: the parity of the brightest pixel's position
    classifier.predict = lambda x, batch_size=None: x[:, 0].flatten(1).argmax(dim=1) % 2
    relevance = {"constant": torch.zeros(6, 4), "random": random_token_scores(index, 4, seed=0).float()}
    outputs = {"relevance": {m: {"target": r} for m, r in relevance.items()},
               "logits": torch.nn.functional.one_hot(classifier.predict(images), 2).float(),
               "layout": PatchGrid(2, 2, 1), "classifier": classifier}
    cb = PerturbationTest(class_settings=["target"], fractions=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9))
    assert cb.ties == "random"   # the default
    cb.build(list(relevance))
    with pytest.raises(KeyError, match="index"):
        cb.update(outputs, {"image": images, "label": labels})
    cb.update(outputs, {"image": images, "label": labels, "index": index})
    res = cb.compute()
    for direction in ("positive", "negative"):
        key = "perturbation/{}/%s/target/curve" % direction
        assert res[key.format("constant")] == res[key.format("random")]
    # the index convention removes a constant map top to bottom instead
    assert removal_ranks(pixel_maps(relevance["constant"], (8, 8)))[0].tolist() == list(range(64))


def test_callback_curves_by_hand():
    # two 2x2 white images, both labelled 1 (clean prediction: 1 = correct)
    images = torch.ones(2, 3, 2, 2)
    labels = torch.tensor([1, 1])
    # pixel maps: sample 0 ranks pixels 3 > 2 > 1 > 0; sample 1 is constant (ties -> flat order 0, 1, 2, 3)
    rel = torch.stack([torch.tensor([[0.0, 1.0], [2.0, 3.0]]), torch.zeros(2, 2)])
    cb = PerturbationTest(class_settings=["predicted", "target"], fractions=(0.25, 0.5, 0.75), auc="chefer",
                          ties="index")
    module = BrightnessClassifier()
    cb.build(["m"])
    outputs = {"relevance": {"m": {"predicted": rel, "target": rel}}, "logits": torch.tensor([[0.0, 1.0], [0.0, 1.0]]),
               "classifier": module}
    cb.update(outputs, {"image": images, "label": labels})
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
    cb = PerturbationTest(class_settings=["target"], fractions=(0.5,), masking="mean", ties="index")
    cb.build(["m"])
    module = BrightnessClassifier()
    logits = torch.tensor([[5.0, 0.0]])  # clean prediction 0 = correct
    cb.update({"relevance": {"m": {"target": rel}}, "logits": logits, "classifier": module},
              {"image": images, "label": labels})
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
