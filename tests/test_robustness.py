"""Infidelity and max-sensitivity (evaluation/robustness.py, callbacks/robustness.py): parity with Captum 0.9.0's
``infidelity`` (``normalize`` both ways) and ``sensitivity_max`` given the same perturbations (within 1e-6), the
counted forwards and re-explanations, class-agnostic methods re-explained once, per-sample perturbations that do
not depend on the batch, the refusal of a batch of neither images nor tokens, and the evaluation module's
``explain`` entry point (texts: tests/test_robustness_text.py)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from callbacks.faithfulness_correlation import FaithfulnessCorrelationTest
from callbacks.robustness import RobustnessTest
from evaluation.classifier import Classifier
from evaluation.robustness import infidelity, max_sensitivity, sample_noise
from lightning_modules.evaluation import AttributionEvaluationModule
from tests.gloo import gloo_group, run_on_two_processes

SIZE, GRID, CLASSES = 8, 4, 3


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Tanh(), nn.Flatten(),
                         nn.Linear(4 * SIZE * SIZE, CLASSES)).double().eval()


def _gxi(model, inputs, target):
    """Gradient x input of the target logit, summed over channels: a pixel map [B, H, W]."""
    with torch.enable_grad():
        x = inputs.detach().clone().requires_grad_(True)
        logits = model(x)
        grad, = torch.autograd.grad(logits.gather(1, target[:, None]).sum(), x)
    return (grad * x).sum(1).detach()


def _setup(b=4, seed=0, n_batches=1):
    model = _model()
    classifier = Classifier(model, (0.5, 0.4, 0.3), (0.25, 0.2, 0.3), batch_size=8)
    calls = []

    def explain(method, inputs, target, sample_ids):
        calls.append((method, inputs.shape[0], target is None))
        if method == "flat":
            return torch.ones(inputs.shape[0], GRID * GRID, dtype=torch.float64) + inputs.mean((1, 2, 3))[:, None]
        return _gxi(model, inputs, target)

    g = torch.Generator().manual_seed(seed)
    batches = []
    for k in range(n_batches):
        images = torch.rand(b, 3, SIZE, SIZE, generator=g, dtype=torch.float64)
        inputs = classifier.normalize(images)
        with torch.no_grad():
            logits = model(inputs)
        pred = logits.argmax(1)
        flat = explain("flat", inputs, None, None)
        rel = {"gxi": {"predicted": _gxi(model, inputs, pred), "target": _gxi(model, inputs, torch.zeros_like(pred))},
               "flat": {"predicted": flat, "target": flat}}
        outputs = {"relevance": rel, "logits": logits, "targets": {"predicted": pred, "target": torch.zeros_like(pred)},
                   "classifier": classifier, "layout": SimpleNamespace(grid=(GRID, GRID)), "explain": explain,
                   "class_specific": {"gxi": True, "flat": False}}
        batches.append((outputs, {"image": images, "label": torch.zeros(b, dtype=torch.long),
                                  "index": torch.arange(k * b, (k + 1) * b) + 10}))
    calls.clear()
    return model, classifier, batches, calls


def _drive(callback, batches):
    for outputs, batch in batches:
        callback.update(outputs, batch)
    return callback


@pytest.mark.parametrize("normalize", [True, False])
def test_matches_captum_infidelity_and_sensitivity_max(normalize):
    captum_metrics = pytest.importorskip("captum.metrics")
    model, classifier, batches, _ = _setup()
    (outputs, batch), = batches
    runs = 6
    cb = _drive(RobustnessTest(methods=["gxi"], infidelity_runs=runs, sensitivity_runs=runs, noise_std=0.1,
                               normalize=normalize), batches)
    cb.compute()
    scores = cb.per_sample_scores()
    ours_infid = scores["robustness/gxi/predicted/infidelity"][1].numpy()
    ours_sens = scores["robustness/gxi/predicted/max_sensitivity"][1].numpy()
    images, ids, target = batch["image"], batch["index"].tolist(), outputs["targets"]["predicted"]
    noise = sample_noise(ids, (3, SIZE, SIZE), runs, 0, "infidelity", 0.1)
    sample_major = noise.transpose(0, 1).reshape(-1, 3, SIZE, SIZE)      # Captum repeat_interleaves the samples

    def perturb(inputs):
        return sample_major, inputs - sample_major

    def forward(x):
        return model(classifier.normalize(x))

    attributions = outputs["relevance"]["gxi"]["predicted"][:, None].expand(-1, 3, -1, -1)
    expected = captum_metrics.infidelity(forward, perturb, images, attributions, target=target,
                                         n_perturb_samples=runs, normalize=normalize).numpy()
    assert np.abs(ours_infid - expected).max() <= 1e-6 * max(1.0, np.abs(expected).max()), (ours_infid, expected)
    delta = sample_noise(ids, (3, SIZE, SIZE), runs, 0, "sensitivity", 0.02).transpose(0, 1).reshape(-1, 3, SIZE,
                                                                                                      SIZE)

    def shake(inputs, perturb_radius=None):
        return inputs + delta

    def explanation(x, target):
        x = x[0] if isinstance(x, tuple) else x          # Captum passes its inputs as a tuple, and iterates over
        return (_gxi(model, classifier.normalize(x), target),)     # the clean explanation: a tuple of tensors

    expected = captum_metrics.sensitivity_max(explanation, images, perturb_func=shake, n_perturb_samples=runs,
                                              target=target).numpy()
    assert np.abs(ours_sens - expected).max() <= 1e-6 * max(1.0, np.abs(expected).max()), (ours_sens, expected)
    assert expected.min() > 0 and np.ptp(ours_infid) > 0


def test_counts_and_class_agnostic_methods_are_reexplained_once():
    _, _, batches, calls = _setup(n_batches=2)
    cb = _drive(RobustnessTest(class_settings=["predicted", "target"], infidelity_runs=3, sensitivity_runs=2),
                batches)
    res = cb.compute()
    assert res["robustness/forwards"] == 3 * 8
    # gxi: 2 settings x 2 runs x 8 samples; flat (class-agnostic): once for both settings
    assert res["robustness/reexplanations"] == 2 * 2 * 8 + 2 * 8
    assert [c for c in calls if c[0] == "flat"] == [("flat", 8, True)] * 2
    assert cb.higher_is_better()["robustness/gxi/target/infidelity"] is False
    # the same samples in other batches: identical values
    _, _, again, _ = _setup(n_batches=2)
    merged = _drive(RobustnessTest(class_settings=["predicted", "target"], infidelity_runs=3, sensitivity_runs=2),
                    again[::-1]).compute()
    assert all(np.array_equal(merged[k], res[k]) for k in res)


def test_measures_by_hand_and_refusals():
    a, d = torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([[2.0], [4.0], [7.0]])
    assert infidelity(a, d, normalize=False)[0] == pytest.approx((1 + 4 + 16) / 3)
    beta = (2 + 8 + 21) / 14
    assert infidelity(a, d)[0] == pytest.approx(((beta - 2) ** 2 + (2 * beta - 4) ** 2 + (3 * beta - 7) ** 2) / 3)
    clean = torch.tensor([[3.0, 4.0]])
    assert max_sensitivity(torch.tensor([[[3.0, 4.0]], [[3.0, 5.0]]]), clean)[0] == pytest.approx(0.2)
    assert sample_noise([1], (2,), 3, 0, "sensitivity", 0.5).abs().max() <= 0.5
    assert not torch.equal(sample_noise([1], (4,), 1, 0, "infidelity", 1.0), sample_noise([2], (4,), 1, 0,
                                                                                          "infidelity", 1.0))
    with pytest.raises(ValueError, match="neither 'image' nor 'input_ids'"):
        RobustnessTest().update({"relevance": {}}, {"pixels": torch.ones(1, 4), "index": torch.tensor([0])})
    _, _, batches, _ = _setup()
    outputs, batch = batches[0]
    with pytest.raises(KeyError, match="'explain'"):
        RobustnessTest().update({k: v for k, v in outputs.items() if k != "explain"}, batch)


def test_evaluation_module_explain_entry_point():
    module = AttributionEvaluationModule(classifier="timm:vit_tiny_patch16_224", pretrained=False,
                                         model_kwargs={"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2,
                                                       "num_heads": 2, "num_classes": 4},
                                         methods=["rollout", "gradcam"])
    images = torch.rand(3, 3, 32, 32)
    inputs = module.model_inputs({"image": images})
    maps = module.explain("gradcam", inputs, torch.tensor([0, 1, 2]), torch.arange(3))
    assert maps.shape == (3, 16) and not maps.requires_grad
    direct = module.methods["gradcam"](module.model, inputs, target=torch.tensor([0, 1, 2]), sample_ids=torch.arange(3))
    torch.testing.assert_close(maps, direct.detach())
    with pytest.raises(KeyError, match="no method 'lrp'"):
        module.explain("lrp", inputs, None)


def _catalogue_results(batches):
    results = _drive(RobustnessTest(class_settings=["predicted", "target"], infidelity_runs=3, sensitivity_runs=2),
                     batches).compute()
    results.update(_drive(FaithfulnessCorrelationTest(runs=4, class_settings=["predicted", "target"]), batches)
                   .compute())
    return results


def _gloo_worker(rank: int, world: int, port: int, path: str) -> None:
    with gloo_group(rank, world, port):
        _, _, batches, _ = _setup(n_batches=3)
        results = _catalogue_results(batches[rank::world])
        if rank == 0:
            with open(path, "w") as f:
                json.dump(results, f)


@pytest.mark.slow
def test_two_gloo_processes_give_identical_robustness_and_faithfulness_correlation(tmp_path):
    _, _, batches, _ = _setup(n_batches=3)
    one = _catalogue_results(batches)
    run_on_two_processes(_gloo_worker, str(tmp_path / "two.json"), base_port=29800)
    two = json.loads((tmp_path / "two.json").read_text())
    assert two.keys() == one.keys() and len(one) > 10
    assert all(np.array_equal(two[k], one[k], equal_nan=True) for k in one), {
        k: (one[k], two[k]) for k in one if not np.array_equal(two[k], one[k], equal_nan=True)}
