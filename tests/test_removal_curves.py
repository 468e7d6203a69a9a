"""The removal-curve metrics (callbacks/removal_curves.py, evaluation/curves.py, evaluation/substrates.py,
evaluation/road_imputation.py) against independent implementations and their published definitions:

* RISE's deletion / insertion (Petsiuk et al. 2018): the ``CausalMetric`` loop, ``gkern`` and ``auc`` of the
  authors' ``evaluation.py`` re-derived here from their published code (scipy's ``gaussian_filter`` of a delta,
  the blur of the normalised tensor, one step of units per iteration, ``(sum y - y0/2 - yn/2) / n``);
* Quantus 0.6.0's ``RegionPerturbation`` (MoRF and LeRF, patch regions, a float baseline): its ``y0 - y_k``
  equals ours within 1e-6 (no numpy shim is needed: the test never asks Quantus for its ``np.trapz`` AUC);
* grad-cam 1.5.7's ``NoisyLinearImputer`` (noise 0) equals ROAD's imputation here within 1e-6, and its
  percentile semantics (a map that is 0 on most pixels loses every pixel) against ours (exactly ``int(p * N)``);
* AttCAT's AOPC (``|Delta p|``), signed AOPC and log-odds re-derived on a tiny BERT;
* each test's forward count equals its formula; a text run of the image-only ROAD is refused by name.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from callbacks.removal_curves import ATTCAT_LEVELS, AOPCTest, DeletionInsertionTest, MoRFLeRFTest, ROADTest
from evaluation.classifier import AnswerTokenClassifier, Classifier, TextClassifier
from evaluation.curves import integrate
from evaluation.pixel_maps import pixel_maps
from evaluation.road_imputation import impute
from evaluation.substrates import blur, gaussian_kernel
from tests.tiny_clip_text import tiny_clip_text_classifier

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def tiny_image_classifier(seed=0, classes=3):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                          nn.Linear(24, classes)).eval().double()
    return Classifier(model, MEAN, STD, batch_size=7)   # a batch size that splits the step-major inputs


def image_case(b=3, size=16, grid=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    clf = tiny_image_classifier(seed)
    images = torch.rand(b, 3, size, size, generator=gen, dtype=torch.float64)
    logits = clf.logits(images)
    rel = torch.rand(b, grid * grid, generator=gen)          # continuous: no ties
    batch = {"image": images, "label": torch.randint(0, 3, (b,), generator=gen), "index": torch.arange(b) * 3 + 1}
    outputs = {"relevance": {"m": {"predicted": rel}}, "targets": {"predicted": logits.argmax(-1)},
               "logits": logits, "classifier": clf, "layout": SimpleNamespace(grid=(grid, grid))}
    return clf, images, rel, batch, outputs


def per_sample(cb, key):
    index, values = cb.per_sample_scores()[key]
    return index, values


# ------------------------------------------------------------------------------------------ RISE
def rise_gkern(klen, nsig):
    """RISE's ``gkern`` (evaluation.py): scipy's gaussian_filter of a centred delta (its 'reflect' border)."""
    from scipy.ndimage import gaussian_filter

    inp = np.zeros((klen, klen))
    inp[klen // 2, klen // 2] = 1
    return gaussian_filter(inp, nsig)


def rise_auc(arr):
    """RISE's ``auc``: the normalised trapezoid of equally spaced points."""
    return (arr.sum() - arr[0] / 2 - arr[-1] / 2) / (arr.shape[0] - 1)


def rise_curve(clf, image, order_pixels, step, start, finish, c):
    """RISE's ``CausalMetric.single_run`` on one normalised image: ``n + 1`` scores, ``step`` pixels per step."""
    hw = image.shape[-1] * image.shape[-2]
    n = (hw + step - 1) // step
    start, finish = start.clone(), finish.clone()
    scores = []
    for i in range(n + 1):
        with torch.no_grad():
            pred = torch.softmax(clf.model(start[None]), dim=-1)[0, c]
        scores.append(float(pred))
        if i < n:
            coords = order_pixels[step * i: step * (i + 1)]
            start.reshape(3, hw)[:, coords] = finish.reshape(3, hw)[:, coords]
    return np.array(scores)


def test_blur_kernel_is_rises_gkern():
    ours = gaussian_kernel(11, 5.0).numpy()
    assert np.abs(ours - rise_gkern(11, 5)).max() < 1e-12


@pytest.mark.parametrize("unit, step", [("pixel", 16), ("pixel", 50), ("patch", 1), ("patch", 3)])
def test_deletion_and_insertion_are_rises_causal_metric(unit, step):
    clf, images, rel, batch, outputs = image_case()
    cb = DeletionInsertionTest(unit=unit, step=step, ties="index")
    cb.update(outputs, batch)
    res = cb.compute()
    kern = torch.from_numpy(rise_gkern(11, 5))
    conv = torch.zeros(3, 3, 11, 11, dtype=torch.float64)
    for i in range(3):
        conv[i, i] = kern
    for b in range(images.shape[0]):
        x = clf.normalize(images[b:b + 1])[0]
        c = int(outputs["targets"]["predicted"][b])
        # the salient order of the pixels: patch scores broadcast to their pixels (patch units: a patch is a run
        # of pixels removed together; RISE orders pixels, so the patch-unit order is emulated by a stable sort)
        if unit == "patch":
            cell = rel[b].reshape(4, 4).repeat_interleave(4, 0).repeat_interleave(4, 1).flatten().double()
            patch_id = torch.arange(16).reshape(4, 4).repeat_interleave(4, 0).repeat_interleave(4, 1).flatten()
            order = torch.from_numpy(np.lexsort((np.arange(256), patch_id.numpy(), -cell.numpy())))
            pixel_step = step * 16
        else:
            saliency = pixel_maps(rel[b:b + 1], (16, 16), (4, 4)).flatten().double()
            order = torch.from_numpy(np.argsort(-saliency.numpy(), kind="stable"))
            pixel_step = step
        deletion = rise_curve(clf, x, order, pixel_step, x, torch.zeros_like(x), c)
        blurred = torch.nn.functional.conv2d(x[None], conv, padding=5)[0]
        insertion = rise_curve(clf, x, order, pixel_step, blurred, x, c)
        _, ours_del = per_sample(cb, "rise/m/predicted/deletion_curve")
        _, ours_ins = per_sample(cb, "rise/m/predicted/insertion_curve")
        assert np.abs(ours_del[b].numpy() - deletion).max() < 1e-9
        assert np.abs(ours_ins[b].numpy() - insertion).max() < 1e-9
        # RISE's auc of our curve is our area (the curves agree to float64 rounding of the blur and the forwards)
        assert abs(float(per_sample(cb, "rise/m/predicted/deletion_auc")[1][b]) - rise_auc(ours_del[b].numpy())) \
            < 1e-12
        assert abs(float(per_sample(cb, "rise/m/predicted/insertion_auc")[1][b]) - rise_auc(ours_ins[b].numpy())) \
            < 1e-12
        assert abs(float(per_sample(cb, "rise/m/predicted/deletion_auc")[1][b]) - rise_auc(deletion)) < 1e-9
    n = math.ceil((256 if unit == "pixel" else 16) / step)
    assert res["rise/forward_passes"] == images.shape[0] * 2 * (n + 1)
    assert cb.higher_is_better()["rise/m/predicted/deletion_auc"] is False
    assert cb.higher_is_better()["rise/m/predicted/insertion_auc"] is True


def test_insertion_from_the_mean_colour_image():
    """``insertion_substrate: mean`` (the synthetic catalogue's choice): RISE's insertion loop started from the
    normalised zero image instead of the blurred one; its first point is the deletion curve's last."""
    clf, images, rel, batch, outputs = image_case()
    cb = DeletionInsertionTest(unit="pixel", step=16, ties="index", insertion_substrate="mean")
    cb.update(outputs, batch)
    _, ours_del = per_sample(cb, "rise/m/predicted/deletion_curve")
    _, ours_ins = per_sample(cb, "rise/m/predicted/insertion_curve")
    for b in range(images.shape[0]):
        x = clf.normalize(images[b:b + 1])[0]
        c = int(outputs["targets"]["predicted"][b])
        order = torch.from_numpy(np.argsort(-pixel_maps(rel[b:b + 1], (16, 16), (4, 4)).flatten().double().numpy(),
                                            kind="stable"))
        insertion = rise_curve(clf, x, order, 16, torch.zeros_like(x), x, c)
        assert np.abs(ours_ins[b].numpy() - insertion).max() < 1e-9
    assert torch.allclose(ours_ins[:, 0], ours_del[:, -1], atol=1e-12)
    assert cb.conventions()["insertion_removal"] == "mean"
    assert DeletionInsertionTest(unit="pixel", step=16).conventions()["insertion_removal"] == "blur"
    with pytest.raises(ValueError, match="unknown insertion substrate 'grey'"):
        DeletionInsertionTest(unit="pixel", step=16, insertion_substrate="grey")


def test_blur_pads_with_the_mean_colour():
    img = torch.full((1, 3, 8, 8), 0.0, dtype=torch.float64)
    img[..., :, :] = torch.tensor(MEAN, dtype=torch.float64).reshape(1, 3, 1, 1)
    assert torch.allclose(blur(img, MEAN), img, atol=1e-12)   # the mean colour is the normalised zero


# ------------------------------------------------------------------------------------------ Quantus
class Normalised(nn.Module):
    def __init__(self, clf):
        super().__init__()
        self.clf = clf

    def forward(self, x):
        return self.clf.model(self.clf.normalize(x.double())).float()


@pytest.mark.parametrize("order", ["morf", "lerf"])
def test_morf_and_lerf_curves_match_quantus_region_perturbation(order):
    import quantus

    clf, images, rel, batch, outputs = image_case(b=4, size=16, grid=4, seed=1)
    cb = MoRFLeRFTest(unit="patch", step=1, removal="black", score="probability", ties="index")
    cb.update(outputs, batch)
    _, ours = per_sample(cb, f"morf_lerf/m/predicted/{order}_curve")
    a = rel.reshape(-1, 1, 4, 4).repeat_interleave(4, 2).repeat_interleave(4, 3).numpy().astype(np.float32)
    metric = quantus.RegionPerturbation(patch_size=4, order=order, regions_evaluation=16, perturb_baseline=0.0,
                                        normalise=False, abs=False, disable_warnings=True)
    model = Normalised(clf).eval()
    theirs = np.asarray(metric(model=model, x_batch=images.float().numpy(),
                               y_batch=outputs["targets"]["predicted"].numpy(), a_batch=a, channel_first=True,
                               device="cpu", softmax=True))
    drop = (ours[:, :1] - ours[:, 1:]).numpy()
    assert theirs.shape == drop.shape
    assert np.abs(theirs - drop).max() < 1e-6
    # and the area between the curves is LeRF's area minus MoRF's, per sample
    _, srg = per_sample(cb, "morf_lerf/m/predicted/srg")
    _, morf = per_sample(cb, "morf_lerf/m/predicted/morf_auc")
    _, lerf = per_sample(cb, "morf_lerf/m/predicted/lerf_auc")
    assert torch.equal(srg, lerf - morf)


def test_quantus_black_baseline_is_the_per_sample_minimum_not_zero():
    """Quantus' default ``perturb_baseline='black'`` is the minimum of each input, not 0 (ours: a value)."""
    from quantus.helpers.utils import get_baseline_value

    arr = np.full((3, 4), 0.25)
    assert get_baseline_value(value="black", arr=arr, return_shape=(1,)) == pytest.approx(0.25)


# ------------------------------------------------------------------------------------------ ROAD
def blob_masks(k, h, w, seed=0):
    gen = torch.Generator().manual_seed(seed)
    m = torch.rand(k, 1, h // 3, w // 3, generator=gen)
    m = torch.nn.functional.interpolate(m, size=(h, w), mode="bilinear", align_corners=False)[:, 0]
    return m > 0.5


def test_road_imputation_matches_grad_cam_noisy_linear_imputer():
    from pytorch_grad_cam.metrics.road import NoisyLinearImputer

    gen = torch.Generator().manual_seed(0)
    images = torch.rand(5, 3, 12, 10, generator=gen)
    removed = blob_masks(5, 12, 10) | (torch.rand(5, 12, 10, generator=gen) < 0.2)
    ours = impute(images, removed, noise=0.0)
    worst = 0.0
    for i in range(5):
        theirs = NoisyLinearImputer(noise=0.0)(images[i], (~removed[i]).float())   # grad-cam: 1 = kept
        worst = max(worst, float((theirs - ours[i]).abs().max()))
    assert worst < 1e-6
    assert torch.equal(ours[:, :, ~removed[0]][0], images[0][:, ~removed[0]])   # known pixels untouched


def test_road_noise_is_seeded_per_image():
    images = torch.rand(2, 3, 6, 6)
    removed = torch.zeros(2, 6, 6, dtype=torch.bool)
    removed[:, 2:4, 2:4] = True
    a = impute(images, removed, noise=0.01, seeds=[1, 2])
    b = impute(images[1:], removed[1:], noise=0.01, seeds=[2])
    assert torch.equal(a[1:], b) and not torch.equal(a, impute(images, removed, noise=0.0))


def test_grad_cams_percentile_removes_every_pixel_of_a_mostly_zero_map_ours_removes_the_fraction():
    """grad-cam's ``RemoveMostRelevantFirst(p)`` keeps ``map < percentile_p(map)``: on a map that is 0 on 90 % of
    the pixels, percentile 80 is 0 and every pixel is removed. Ours removes exactly ``int(p * N)`` pixels, ties in
    the order of the random map."""
    from pytorch_grad_cam.metrics.perturbation_confidence import RemoveMostRelevantFirst

    cam = torch.zeros(10, 10)
    cam.view(-1)[:10] = torch.linspace(0.1, 1.0, 10)
    seen = {}

    def spy(img, mask):
        seen["kept"] = mask.clone()
        return img

    RemoveMostRelevantFirst(80, spy)(torch.rand(3, 10, 10), cam)
    assert int(seen["kept"].sum()) == 0            # grad-cam: the whole image is imputed
    clf = tiny_image_classifier()
    images = torch.rand(1, 3, 10, 10, dtype=torch.float64)
    outputs = {"relevance": {"m": {"predicted": cam[None]}}, "targets": {"predicted": torch.tensor([0])},
               "logits": clf.logits(images), "classifier": clf, "layout": SimpleNamespace(grid=(2, 2))}
    cb = ROADTest(fractions=[0.2, 0.8], noise=0.0)
    removed = {}
    original = cb.perturber.perturb

    def record(batch, mask, classifier, stream=0):
        removed[stream] = mask.clone()
        return original(batch, mask, classifier, stream)

    cb.perturber.perturb = record
    cb.update(outputs, {"image": images, "label": torch.tensor([0]), "index": torch.tensor([0])})
    assert removed[0].sum(dim=-1).flatten().tolist() == [0, 20, 80]    # MoRF: 0, 20 %, 80 % of the pixels
    assert removed[0][1, 0, :10].all()                                # the 10 relevant pixels first


def test_road_combined_and_refusals():
    clf, images, rel, batch, outputs = image_case(b=2, size=8, grid=2)
    cb = ROADTest(score="probability", fractions=[0.25, 0.5])
    cb.update(outputs, batch)
    res = cb.compute()
    assert res["road/m/predicted/combined"] == pytest.approx(
        (res["road/m/predicted/lerf_auc"] - res["road/m/predicted/morf_auc"]) / 2, abs=1e-15)
    assert res["road/forward_passes"] == 2 * 2 * 3
    with pytest.raises(ValueError, match="ROAD is defined on images only"):
        ROADTest(unit="token", removal="road")
    with pytest.raises(ValueError, match="needs images"):
        ROADTest().update(outputs, {"input_ids": torch.ones(2, 4, dtype=torch.long), "index": torch.arange(2)})
    with pytest.raises(ValueError, match="fractions must stay below 1"):
        ROADTest(fractions=[0.5, 1.0])


# ------------------------------------------------------------------------------------------ text
def tiny_text_case(b=4, n=14, seed=0):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    model = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                      num_attention_heads=2, intermediate_size=32,
                                                      max_position_embeddings=32, num_labels=2)).eval()
    clf = TextClassifier(model, pad_token_id=0, mask_token_id=3, batch_size=5)
    gen = torch.Generator().manual_seed(seed)
    lengths = [n, n - 3, n - 5, n - 1][:b]
    ids = torch.zeros(b, n, dtype=torch.long)
    mask = torch.zeros(b, n, dtype=torch.long)
    special = torch.zeros(b, n, dtype=torch.long)
    for i, length in enumerate(lengths):
        ids[i, :length] = torch.randint(5, 50, (length,), generator=gen)
        ids[i, 0], ids[i, length - 1] = 1, 2
        mask[i, :length] = 1
        special[i, 0] = special[i, length - 1] = 1
    batch = {"input_ids": ids, "attention_mask": mask, "special_tokens_mask": special,
             "label": torch.randint(0, 2, (b,), generator=gen), "index": torch.arange(b)}
    logits = clf.logits({"input_ids": ids, "attention_mask": mask})
    rel = torch.rand(b, n, generator=gen)
    outputs = {"relevance": {"m": {"predicted": rel}}, "targets": {"predicted": logits.argmax(-1)},
               "logits": logits, "classifier": clf}
    return clf, batch, rel, outputs, lengths


def test_aopc_and_log_odds_are_attcats_formulas_on_a_tiny_bert():
    clf, batch, rel, outputs, lengths = tiny_text_case()
    cb = AOPCTest(removal="mask", ties="index")
    cb.update(outputs, batch)
    res = cb.compute()
    aopc_abs, aopc_signed, lodds = [], [], []
    for i, length in enumerate(lengths):
        c = int(outputs["targets"]["predicted"][i])
        ids = batch["input_ids"][i:i + 1]
        positions = torch.arange(1, length - 1)
        order = positions[torch.argsort(-rel[i, 1:length - 1].double(), stable=True)]
        p0 = torch.softmax(clf.logits({"input_ids": ids, "attention_mask": batch["attention_mask"][i:i + 1]})
                           .double(), -1)[0, c]
        drops, logs = [], []
        for level in ATTCAT_LEVELS:
            k = int(level * (length - 2))
            masked = ids.clone()
            masked[0, order[:k]] = 3
            p = torch.softmax(clf.logits({"input_ids": masked, "attention_mask": batch["attention_mask"][i:i + 1]})
                              .double(), -1)[0, c]
            drops.append(float(p0 - p))
            logs.append(math.log(float(p) / float(p0)))
        aopc_abs.append(np.mean(np.abs(drops)))
        aopc_signed.append(np.mean(drops))
        lodds.append(np.mean(logs))
    assert res["aopc/m/predicted/morf_aopc_abs"] == pytest.approx(np.mean(aopc_abs), abs=1e-6)
    assert res["aopc/m/predicted/morf_aopc"] == pytest.approx(np.mean(aopc_signed), abs=1e-6)
    assert res["aopc/m/predicted/morf_log_odds"] == pytest.approx(np.mean(lodds), abs=1e-6)
    assert res["aopc/forward_passes"] == len(lengths) * (len(ATTCAT_LEVELS) + 1)
    assert cb.higher_is_better()["aopc/m/predicted/morf_log_odds"] is False


@pytest.mark.parametrize("removal", ["delete", "mask", "pad"])
def test_token_deletion_and_insertion(removal):
    clf, batch, rel, outputs, lengths = tiny_text_case()
    cb = DeletionInsertionTest(unit="token", removal=removal, step=None, fractions=[0.25, 0.5, 1.0])
    cb.update(outputs, batch)
    res = cb.compute()
    _, deletion = per_sample(cb, "rise/m/predicted/deletion_curve")
    _, insertion = per_sample(cb, "rise/m/predicted/insertion_curve")
    clean = torch.softmax(outputs["logits"].double(), -1).gather(1, outputs["targets"]["predicted"][:, None])[:, 0]
    assert torch.allclose(deletion[:, 0], clean, atol=1e-6)          # nothing removed: the clean text
    assert torch.allclose(insertion[:, -1], clean, atol=1e-6)        # everything inserted: the clean text
    assert torch.allclose(deletion[:, -1], insertion[:, 0], atol=1e-6)   # all removed, both ways
    assert res["rise/forward_passes"] == len(lengths) * 2 * 4
    assert cb.conventions()["unit"] == "token"


def test_token_units_are_refused_on_images_and_bad_options_named():
    clf, images, rel, batch, outputs = image_case(b=2)
    with pytest.raises(ValueError, match="unit 'token' on an image batch"):
        AOPCTest().update(outputs, batch)
    with pytest.raises(ValueError, match="give fractions"):
        DeletionInsertionTest(unit="token", removal="mask")
    with pytest.raises(ValueError, match="unknown score"):
        MoRFLeRFTest(score="odds")
    with pytest.raises(ValueError, match="log-odds needs score='probability'"):
        AOPCTest(score="logit")
    with pytest.raises(ValueError, match="unknown integration rule"):
        MoRFLeRFTest(integration="simpson")


# ------------------------------------------------------------------------------------------ mechanism
def test_per_sample_rows_are_sorted_by_index_and_the_mean_is_order_free():
    clf, images, rel, batch, outputs = image_case(b=4)
    one = MoRFLeRFTest(step=2)
    one.update(outputs, batch)
    two = MoRFLeRFTest(step=2)
    perm = torch.tensor([2, 0, 3, 1])
    for part in (perm[:2], perm[2:]):
        sub_out = {**outputs, "relevance": {"m": {"predicted": rel[part]}}, "targets": {"predicted":
                   outputs["targets"]["predicted"][part]}, "logits": outputs["logits"][part]}
        two.update(sub_out, {k: v[part] for k, v in batch.items()})
    a, b = one.per_sample_scores(), two.per_sample_scores()
    for key in a:
        assert torch.equal(a[key][0], b[key][0]) and torch.allclose(a[key][1], b[key][1], atol=1e-12, rtol=0)
        assert a[key][0].tolist() == sorted(a[key][0].tolist())
    assert one.compute().keys() == two.compute().keys()


def test_integration_rules_by_hand():
    y = torch.tensor([[1.0, 0.5, 0.0]], dtype=torch.float64)
    assert float(integrate(y, [0.0, 0.5, 1.0], "trapezoid")) == pytest.approx(0.5)
    assert float(integrate(y, [0.0, 0.1, 1.0], "rise")) == pytest.approx((1.5 - 0.5 - 0.0) / 2)
    assert float(integrate(y, [0.0, 0.5, 1.0], "mean")) == pytest.approx(0.25)


def test_decoder_through_the_answer_token_classifier():
    """A decoder LM (tiny random Llama) through the answer-token classifier: deletion and MoRF/LeRF on tokens; the
    first deletion point is the clean probability of the explained answer token."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=32)).eval()
    clf = AnswerTokenClassifier(model, answer_ids=[7, 9], pad_token_id=0, batch_size=4)
    ids = torch.randint(3, 40, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0   # left padding
    ids[1, :3] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "special_tokens_mask": torch.zeros_like(ids),
             "label": torch.tensor([0, 1, 0]), "index": torch.tensor([4, 5, 6])}
    logits = clf.logits({"input_ids": ids, "attention_mask": mask})
    outputs = {"relevance": {"m": {"predicted": torch.rand(3, 10)}}, "targets": {"predicted": logits.argmax(-1)},
               "logits": logits, "classifier": clf}
    for cb in (DeletionInsertionTest(unit="token", removal="pad", step=None, fractions=[0.5, 1.0]),
               MoRFLeRFTest(unit="token", removal="delete", step=None, fractions=[0.5, 0.9], score="logit"),
               MoRFLeRFTest(unit="token", removal="zero_embedding", step=None, fractions=[0.5, 0.9], score="logit")):
        cb.update(outputs, batch)
        res = cb.compute()
        first = next(k for k in cb.per_sample_scores() if k.endswith("_curve"))
        _, curves = cb.per_sample_scores()[first]
        expected = torch.softmax(logits.double(), -1) if cb.score == "probability" else logits.double()
        assert torch.allclose(curves[:, 0], expected.gather(1, outputs["targets"]["predicted"][:, None])[:, 0],
                              atol=1e-5)
        assert res[f"{cb.name}/forward_passes"] == 3 * 2 * 3


def test_wandb_tags_name_every_convention_defaults_included():
    tags = ROADTest.wandb_tags({"score": "probability"})
    assert {"road_score:probability", "road_removal:road", "road_unit:pixel", "road_integration:mean",
            "road_seed:0", "road_noise:0.01"} <= set(tags)
    assert "rise_pixel_unit:pixel" in DeletionInsertionTest.wandb_tags({"name": "rise_pixel", "unit": "pixel",
                                                                         "step": 64})


def test_zeroed_embeddings_are_attnlrps_recipe_on_bert_and_llama():
    """``removal='zero_embedding'``: the curve of a removal is the model run on ``inputs_embeds`` with the removed
    tokens' word embeddings set to 0 (LXT#40), on an encoder and through the answer-token classifier."""
    clf, batch, rel, outputs, lengths = tiny_text_case()
    cb = MoRFLeRFTest(unit="token", removal="zero_embedding", step=None, fractions=[0.5, 1.0], score="logit",
                      ties="index")
    cb.update(outputs, batch)
    _, morf = per_sample(cb, "morf_lerf/m/predicted/morf_curve")
    for i, length in enumerate(lengths):
        c = int(outputs["targets"]["predicted"][i])
        positions = torch.arange(1, length - 1)
        order = positions[torch.argsort(-rel[i, 1:length - 1].double(), stable=True)]
        for j, p in enumerate([0.0, 0.5, 1.0]):
            embeds = clf.model.get_input_embeddings()(batch["input_ids"][i:i + 1]).detach().clone()
            embeds[0, order[:int(p * (length - 2))]] = 0.0
            with torch.no_grad():
                expected = clf.model(inputs_embeds=embeds, attention_mask=batch["attention_mask"][i:i + 1]).logits
            assert abs(float(morf[i, j]) - float(expected[0, c])) < 1e-5
    with pytest.raises(ValueError, match="token units: removal must be one of"):
        MoRFLeRFTest(unit="token", removal="blur", step=None, fractions=[0.5])


def test_clip_image_tower_through_the_zero_shot_classifier():
    """CLIP's image tower (a tiny random CLIP as a zero-shot classifier): RISE and ROAD run on its images; the first
    deletion point is the zero-shot probability of the clean image."""
    from transformers import CLIPConfig, CLIPModel

    from models.clip import ZeroShotClassifier

    torch.manual_seed(0)
    clip = CLIPModel(CLIPConfig(text_config=dict(vocab_size=30, hidden_size=16, intermediate_size=32,
                                                 num_hidden_layers=1, num_attention_heads=2,
                                                 max_position_embeddings=8),
                                vision_config=dict(image_size=16, patch_size=4, hidden_size=16, intermediate_size=32,
                                                   num_hidden_layers=1, num_attention_heads=2),
                                projection_dim=8)).eval()
    clf = Classifier(ZeroShotClassifier(clip, torch.randn(3, 8)).eval(), MEAN, STD, batch_size=16)
    images = torch.rand(2, 3, 16, 16)
    logits = clf.logits(images)
    outputs = {"relevance": {"m": {"predicted": torch.rand(2, 16)}}, "targets": {"predicted": logits.argmax(-1)},
               "logits": logits, "classifier": clf, "layout": SimpleNamespace(grid=(4, 4))}
    batch = {"image": images, "label": torch.tensor([0, 2]), "index": torch.tensor([0, 1])}
    rise = DeletionInsertionTest(unit="patch", step=4)
    rise.update(outputs, batch)
    _, deletion = per_sample(rise, "rise/m/predicted/deletion_curve")
    clean = torch.softmax(logits.double(), -1).gather(1, outputs["targets"]["predicted"][:, None])[:, 0]
    assert torch.allclose(deletion[:, 0], clean, atol=1e-6)
    road = ROADTest(fractions=[0.5], score="probability")
    road.update(outputs, batch)
    assert road.compute()["road/forward_passes"] == 2 * 2 * 2


def test_oracle_option_adds_the_ground_truth_as_a_method():
    """``oracle=True``: the mask as method ``oracle`` gives the curves of the same mask passed as a method, for every
    test, counted as one more map; a run that already has a method named ``oracle`` is refused by name."""
    clf, images, rel, batch, outputs = image_case(b=3, size=16, grid=4, seed=2)
    mask = torch.zeros(3, 16, 16)
    mask[0, 2:9, 3:10], mask[1, 8:16, 0:6], mask[2, 4:12, 4:12] = 1, 1, 1
    batch = dict(batch, mask=mask)
    for make in (lambda **kw: DeletionInsertionTest(unit="patch", step=2, **kw),
                 lambda **kw: MoRFLeRFTest(unit="pixel", step=32, score="logit", **kw),
                 lambda **kw: ROADTest(fractions=[0.3, 0.6], score="probability", **kw)):
        with_oracle = make(oracle=True)
        with_oracle.update(outputs, batch)
        ours = with_oracle.compute()
        by_hand = make(methods=["m", "truth"])
        by_hand.update(dict(outputs, relevance={**outputs["relevance"], "truth": {"predicted": mask.clone()}}), batch)
        theirs = by_hand.compute()
        name = with_oracle.name
        assert ours[f"{name}/forward_passes"] == theirs[f"{name}/forward_passes"]
        oracle_keys = [k for k in ours if k.startswith(f"{name}/oracle/")]
        assert oracle_keys and all(ours[k] == theirs[k.replace("/oracle/", "/truth/")] for k in oracle_keys)
        assert with_oracle.conventions()["oracle"] is True and "oracle" not in by_hand.conventions()
    assert "rise_oracle:True" in DeletionInsertionTest.wandb_tags({"oracle": True})
    assert not any("oracle" in tag for tag in DeletionInsertionTest.wandb_tags({}))
    clash = dict(outputs, relevance={**outputs["relevance"], "oracle": {"predicted": rel}})
    with pytest.raises(ValueError, match="already has a method named 'oracle'"):
        DeletionInsertionTest(oracle=True).update(clash, batch)


def test_clip_text_tower_through_the_prompt_scorer():
    """CLIP's text tower (a tiny random CLIP's ``PromptScorer``: texts -> fixed images as classes, read by the text
    classifier): the token curves run on it; the first deletion point is the clean probability of the explained
    image, deleting every content token leaves the start and end tokens, and zeroed input embeddings are read
    through CLIP's own ``get_input_embeddings``."""
    _, clf, batch = tiny_clip_text_classifier()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    logits = clf.logits({"input_ids": ids, "attention_mask": mask})
    rel = torch.rand(2, 8, generator=torch.Generator().manual_seed(1))
    outputs = {"relevance": {"m": {"predicted": rel}}, "targets": {"predicted": logits.argmax(-1)},
               "logits": logits, "classifier": clf}
    rise = DeletionInsertionTest(unit="token", removal="delete", step=None, fractions=[0.5, 1.0])
    rise.update(outputs, batch)
    _, deletion = per_sample(rise, "rise/m/predicted/deletion_curve")
    probs = torch.softmax(logits.double(), -1)
    clean = probs.gather(1, outputs["targets"]["predicted"][:, None])[:, 0]
    assert torch.allclose(deletion[:, 0], clean, atol=1e-6)
    empty = clf.logits({"input_ids": torch.tensor([[28, 29], [28, 29]]), "attention_mask": torch.ones(2, 2).long()})
    expected = torch.softmax(empty.double(), -1).gather(1, outputs["targets"]["predicted"][:, None])[:, 0]
    assert torch.allclose(deletion[:, -1], expected, atol=1e-6)
    assert rise.compute()["rise/forward_passes"] == 2 * 2 * 3
    zeroed = MoRFLeRFTest(unit="token", removal="zero_embedding", step=None, fractions=[1.0], score="logit",
                          integration="trapezoid")
    zeroed.update(outputs, batch)
    _, morf = per_sample(zeroed, "morf_lerf/m/predicted/morf_curve")
    assert torch.allclose(morf[:, 0], logits.double().gather(1, outputs["targets"]["predicted"][:, None])[:, 0],
                          atol=1e-6)
    assert not torch.allclose(morf[:, 1], morf[:, 0], atol=1e-4)
