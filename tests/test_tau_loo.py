"""τ-LOO (callbacks/tau_loo.py): Kendall's τ-b against scipy's ``kendalltau`` on leave-one-out drops recomputed here
token by token, the counted forwards (one per removable token), ties, the refusal on images."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from test_faithfulness_correlation import _batches, _drive, _model, _TokenModel

from callbacks.tau_loo import TauLOOTest, kendall_tau_b


def _text():
    ids = torch.tensor([[1, 5, 6, 7, 8, 9, 2, 0], [1, 9, 10, 11, 2, 0, 0, 0], [1, 12, 2, 0, 0, 0, 0, 0]])
    special = ((ids == 1) | (ids == 2) | (ids == 0)).long()
    return ids, {"input_ids": ids, "attention_mask": (ids > 0).long(), "special_tokens_mask": special,
                 "label": torch.zeros(3, dtype=torch.long), "index": torch.tensor([7, 8, 9])}


def test_matches_scipy_on_leave_one_out_drops():
    model = _TokenModel()
    model.batch_size = 4
    ids, batch = _text()
    clean_inputs = {"input_ids": ids, "attention_mask": batch["attention_mask"]}
    logits = model.scores(clean_inputs)
    rel = torch.randn(3, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    rel[0, 2] = rel[0, 3]                                          # a tie
    outputs = {"relevance": {"a": {"predicted": rel}}, "logits": logits, "targets": {"predicted": logits.argmax(1)},
               "classifier": model}
    cb = _drive(TauLOOTest(methods=["a"]), [(outputs, batch)])
    res = cb.compute()
    per_sample = cb.per_sample_scores()["tau_loo/a/predicted/kendall_tau"][1]
    assert res["tau_loo/forwards"] == 5 + 3 + 1
    clean = torch.softmax(logits, -1)
    for i in range(2):
        positions = [p for p in range(8) if batch["special_tokens_mask"][i, p] == 0]
        drops = []
        for p in positions:
            mask = batch["attention_mask"][i:i + 1].clone()
            mask[0, p] = 0
            after = torch.softmax(model.scores({"input_ids": ids[i:i + 1].masked_fill(mask == 0, 0),
                                                "attention_mask": mask}), -1)
            drops.append(float(clean[i, logits[i].argmax()] - after[0, logits[i].argmax()]))
        expected = stats.kendalltau(rel[i, positions].numpy(), np.array(drops)).statistic
        assert float(per_sample[i]) == pytest.approx(expected, abs=1e-12)
    assert torch.isnan(per_sample[2])                              # one token: no pair, skipped


def test_tau_b_with_ties_and_refusal():
    x, y = torch.tensor([1.0, 2.0, 2.0, 3.0, 0.5]), torch.tensor([0.1, 0.3, 0.2, 0.2, 0.0])
    assert float(kendall_tau_b(x, y)) == pytest.approx(stats.kendalltau(x.numpy(), y.numpy()).statistic, abs=1e-12)
    assert torch.isnan(kendall_tau_b(torch.ones(4), torch.rand(4)))
    with pytest.raises(ValueError, match="defined on token sequences"):
        TauLOOTest().update(*_batches(_model(), n=1)[0])
