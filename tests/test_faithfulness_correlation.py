"""Faithfulness correlation (evaluation/faithfulness_correlation.py, callbacks/faithfulness_correlation.py):
parity with Quantus 0.6.0's FaithfulnessCorrelation given the same subsets (within 1e-6), per-sample subsets that
do not depend on the batch, the counted forwards equal to R x samples, the token path through a token perturber,
halves merged and the progress round trip identical to one run, refusals by name."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from callbacks.faithfulness_correlation import FaithfulnessCorrelationTest
from evaluation.classifier import Classifier
from evaluation.faithfulness_correlation import draw_subsets, pearson_rows, subset_size

SIZE, GRID, CLASSES = 8, 4, 3


class _ToDouble(nn.Module):
    def forward(self, x):
        return x.double()       # Quantus feeds float32 arrays: the model computes in float64 either way


def _model():
    torch.manual_seed(0)
    layers = [_ToDouble(), nn.Conv2d(3, 4, 3, padding=1), nn.Tanh(), nn.Flatten(), nn.Linear(4 * SIZE * SIZE, CLASSES)]
    return nn.Sequential(*layers).double().eval()


class _Float64Classifier(Classifier):
    def normalize(self, images):
        return images.double()


def _batches(model, n=3, b=4, seed=0):
    classifier = _Float64Classifier(model, (0.0,) * 3, (1.0,) * 3, batch_size=16)
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(n):
        images = torch.rand(b, 3, SIZE, SIZE, generator=g, dtype=torch.float64)
        with torch.no_grad():
            logits = model(images)
        rel = {"a": {"predicted": torch.randn(b, SIZE, SIZE, generator=g, dtype=torch.float64)},
               "b": {"predicted": torch.randn(b, GRID * GRID, generator=g, dtype=torch.float64)}}
        outputs = {"relevance": rel, "logits": logits, "targets": {"predicted": logits.argmax(1)},
                   "classifier": classifier, "layout": SimpleNamespace(grid=(GRID, GRID))}
        out.append((outputs, {"image": images, "label": torch.zeros(b, dtype=torch.long),
                              "index": torch.arange(k * b, (k + 1) * b) + 100}))
    return out


def _drive(callback, batches):
    for outputs, batch in batches:
        callback.update(outputs, batch)
    return callback


def test_matches_quantus_given_the_same_subsets(monkeypatch):
    quantus = pytest.importorskip("quantus")
    model = _model()
    (outputs, batch), = _batches(model, n=1)
    runs, fraction = 12, 0.2
    cb = _drive(FaithfulnessCorrelationTest(methods=["a"], runs=runs, subset_fraction=fraction, unit="pixel"),
                [(outputs, batch)])
    ours = cb.compute()["faithfulness_correlation/a/predicted/pearson"]
    per_sample = cb.per_sample_scores()["faithfulness_correlation/a/predicted/pearson"][1].numpy()
    # Quantus draws np.random.choice(C*H*W features, subset_size) per run and sample (run-major): feed it the same
    # pixel subsets, every channel of each chosen pixel (its map is broadcast to the 3 channels)
    subsets = draw_subsets(batch["index"].tolist(), torch.ones(4, SIZE * SIZE, dtype=torch.bool), runs, fraction, 0)
    hw = SIZE * SIZE
    calls = iter([np.concatenate([np.flatnonzero(subsets[r, i].numpy()) + c * hw for c in range(3)])
                  for r in range(runs) for i in range(4)])
    monkeypatch.setattr(np.random, "choice", lambda *args, **kwargs: next(calls))
    k = subset_size(hw, fraction)
    judge = quantus.FaithfulnessCorrelation(nr_runs=runs, subset_size=3 * k, perturb_baseline=0.0, abs=False,
                                            normalise=False, return_aggregate=False, disable_warnings=True)
    a = outputs["relevance"]["a"]["predicted"].numpy()[:, None]
    expected = np.asarray(judge(model=model, x_batch=batch["image"].numpy(), y_batch=outputs["targets"]["predicted"]
                                .numpy(), a_batch=np.repeat(a, 3, axis=1), channel_first=True, softmax=True,
                                device="cpu"), dtype=np.float64)
    assert np.abs(per_sample - expected).max() < 1e-6, (per_sample, expected)
    assert ours == pytest.approx(float(expected.mean()), abs=1e-6)
    assert np.abs(expected).max() > 0.05           # not a degenerate fixture


def test_subsets_are_per_sample_and_forwards_counted():
    s1 = draw_subsets([5, 9], torch.ones(2, 20, dtype=torch.bool), 7, 0.25, 3)
    s2 = draw_subsets([9], torch.ones(1, 20, dtype=torch.bool), 7, 0.25, 3)
    assert torch.equal(s1[:, 1], s2[:, 0]) and not torch.equal(s1[:, 0], s1[:, 1])
    assert (s1.sum(-1) == 5).all()
    restricted = draw_subsets([1], torch.tensor([[True, False, True, True]]), 4, 0.5, 0)
    assert not restricted[:, 0, 1].any() and (restricted.sum(-1) == 2).all()
    model = _model()
    batches = _batches(model)
    cb = _drive(FaithfulnessCorrelationTest(runs=6), batches)
    res = cb.compute()
    assert res["faithfulness_correlation/forwards"] == 6 * 12
    assert res.keys() == {"faithfulness_correlation/forwards", "faithfulness_correlation/a/predicted/pearson",
                          "faithfulness_correlation/b/predicted/pearson"}
    assert cb.higher_is_better()["faithfulness_correlation/a/predicted/pearson"] is True
    # the same samples in other batches: identical per-sample values and results
    flat = [(o, {k: v for k, v in b.items()}) for o, b in batches]
    merged = _drive(FaithfulnessCorrelationTest(runs=6), flat[::-1]).compute()
    assert all(np.array_equal(merged[k], res[k]) for k in res)


def test_pearson_rows_and_constant_maps():
    x, y = torch.randn(10, 3, dtype=torch.float64), torch.randn(10, 3, dtype=torch.float64)
    r = pearson_rows(x, y)
    assert r[1] == pytest.approx(np.corrcoef(x[:, 1], y[:, 1])[0, 1], abs=1e-12)
    x[:, 2] = 1.0
    assert torch.isnan(pearson_rows(x, y)[2])


def test_halves_merged_and_resumed():
    model = _model()
    batches = _batches(model, n=4, seed=1)
    whole = _drive(FaithfulnessCorrelationTest(runs=5, unit="pixel"), batches).compute()
    a = _drive(FaithfulnessCorrelationTest(runs=5, unit="pixel"), batches[::2])
    b = _drive(FaithfulnessCorrelationTest(runs=5, unit="pixel"), batches[1::2])
    for ma, mb in zip(a.metrics(), b.metrics()):
        ma.merge_state(mb)
    assert all(np.array_equal(v, whole[k]) for k, v in a.compute().items())
    first = _drive(FaithfulnessCorrelationTest(runs=5, unit="pixel"), batches[:1])
    resumed = FaithfulnessCorrelationTest(runs=5, unit="pixel")
    resumed.build_from_progress(first.progress_state())
    assert all(np.array_equal(v, whole[k]) for k, v in _drive(resumed, batches[1:]).compute().items())


class _TokenModel:
    """A fake text classifier: class scores from the real token ids (pad id 0)."""

    batch_size, pad_token_id, mask_token_id = 5, 0, None

    def __init__(self):
        self.weights = torch.randn(30, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        self.calls = 0

    @staticmethod
    def num_samples(inputs):
        return int(inputs["input_ids"].shape[0])

    @staticmethod
    def take(inputs, index):
        return {k: v[index] for k, v in inputs.items()}

    def logits(self, inputs, batch_size=None):
        self.calls += 1
        assert inputs["input_ids"].shape[0] == self.batch_size          # every forward at the fixed width
        return self.scores(inputs)

    def scores(self, inputs):
        return (self.weights[inputs["input_ids"]] * inputs["attention_mask"][..., None]).sum(1)


def test_token_path_uses_removable_tokens_and_refuses_pixel_units():
    model = _TokenModel()
    ids = torch.tensor([[1, 5, 6, 7, 8, 2, 0], [1, 9, 10, 11, 2, 0, 0]])
    batch = {"input_ids": ids, "attention_mask": (ids > 0).long(), "special_tokens_mask": ((ids == 1) | (ids == 2) |
                                                                                            (ids == 0)).long(),
             "label": torch.zeros(2, dtype=torch.long), "index": torch.tensor([0, 1])}
    inputs = {"input_ids": ids, "attention_mask": batch["attention_mask"]}
    logits = model.scores(inputs)
    rel = {"a": {"predicted": model.weights[ids, 1] - model.weights[ids, 0]}}       # a faithful linear map
    outputs = {"relevance": rel, "logits": logits, "targets": {"predicted": torch.tensor([0, 0])},
               "classifier": model}
    cb = _drive(FaithfulnessCorrelationTest(runs=4, subset_fraction=0.5, score="logit"), [(outputs, batch)])
    res = cb.compute()
    # with logits, removing tokens of a linear bag-of-tokens model drops class 0 by the sum of its weights: the
    # map w1 - w0 correlates with the drop of class 0 negatively unless w1 dominates; check against the formula
    subsets = draw_subsets([0, 1], (batch["special_tokens_mask"] == 0), 4, 0.5, 0)
    drops = (subsets.double() * model.weights[ids, 0][None]).sum(-1)
    sums = (subsets.double() * rel["a"]["predicted"][None]).sum(-1)
    assert res["faithfulness_correlation/a/predicted/pearson"] == pytest.approx(
        float(pearson_rows(sums, drops).nanmean()), abs=1e-12)
    assert model.calls == 2 and res["faithfulness_correlation/forwards"] == 8       # 8 inputs, padded to 5 per forward
    with pytest.raises(ValueError, match="unit 'patch' is not defined on texts"):
        FaithfulnessCorrelationTest(unit="patch").update(outputs, batch)
    with pytest.raises(ValueError, match="masking 'pad' does not remove pixels"):
        FaithfulnessCorrelationTest(masking="pad").update(*_batches(_model(), n=1)[0])
