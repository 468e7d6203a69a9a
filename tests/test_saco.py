"""SaCo (evaluation/saco.py, callbacks/saco.py): the groups and the coefficient against a transcription of the
paper's Algorithm 1 written here with plain loops (no runnable reference exists), the counted forwards, class-agnostic
maps perturbed once, the oracle, halves merged == one run."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_faithfulness_correlation import _batches, _drive, _model

from callbacks.saco import SaCoTest
from evaluation.saco import saco, saco_groups


def _algorithm_1(scores: np.ndarray, drop_of_group, k: int) -> float:
    """Wu et al. 2024, Alg. 1, with loops: rank, split into K groups (array_split), s_i, Δ_i, the signed weights."""
    order = sorted(range(len(scores)), key=lambda u: (-scores[u], u))
    groups = np.array_split(np.array(order), k)
    s = [float(scores[g].sum()) for g in groups]
    d = [drop_of_group(g) for g in groups]
    num = den = 0.0
    for i in range(k):
        for j in range(i + 1, k):
            w = s[i] - s[j]
            num += w if d[i] >= d[j] else -w
            den += abs(w)
    return num / den


def test_coefficient_matches_algorithm_1():
    rng = np.random.default_rng(0)
    for n, k in ((23, 10), (40, 10), (12, 4)):
        scores = rng.normal(size=n)
        scores[3] = scores[5]                                  # a tie: by unit index
        effect = rng.normal(size=n)

        def drop(g, effect=effect):
            return float(effect[g].sum())

        groups = saco_groups(torch.tensor(scores)[None], torch.ones(1, n, dtype=torch.bool), k)[0]
        members = torch.stack([groups == i for i in range(k)])
        sums = (members.double() * torch.tensor(scores)).sum(-1)[:, None]
        drops = torch.tensor([drop(np.flatnonzero(m.numpy())) for m in members])[:, None]
        assert float(saco(sums, drops)[0]) == pytest.approx(_algorithm_1(scores, drop, k), abs=1e-12)
    assert saco(torch.tensor([[3.0], [2.0], [1.0]]), torch.tensor([[0.5], [0.2], [0.1]]))[0] == 1.0
    assert saco(torch.tensor([[3.0], [2.0], [1.0]]), torch.tensor([[0.1], [0.2], [0.5]]))[0] == -1.0
    assert torch.isnan(saco(torch.ones(3, 1), torch.rand(3, 1)))[0]
    few = saco_groups(torch.rand(1, 5), torch.tensor([[True, True, False, False, False]]), 3)
    assert (few == -1).all()


def test_callback_counts_forwards_and_merges():
    model = _model()
    batches = _batches(model, n=3)
    res = _drive(SaCoTest(groups=4, class_settings=["predicted"]), batches).compute()
    assert res["saco/forwards"] == 4 * 12 * 2                     # 2 maps, 12 samples, 4 groups
    assert -1 <= res["saco/a/predicted/coefficient"] <= 1
    a, b = _drive(SaCoTest(groups=4), batches[::2]), _drive(SaCoTest(groups=4), batches[1::2])
    for ma, mb in zip(a.metrics(), b.metrics()):
        ma.merge_state(mb)
    assert all(np.array_equal(v, res[k]) for k, v in a.compute().items())
    with pytest.raises(ValueError, match="unit 'token' is not defined on images"):
        SaCoTest(unit="token").update(*batches[0])
