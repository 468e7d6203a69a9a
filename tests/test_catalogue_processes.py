"""SaCo, τ-LOO and completeness (callbacks/saco.py, callbacks/tau_loo.py, callbacks/completeness.py) give identical
numbers on one process, on two gloo processes (each its share of the batches, the states gathered by torchmetrics)
and after a resume from a progress state taken mid-run: values compared with ``np.array_equal``, counts included.
The gloo test spawns two processes (slow tier); the resume test runs in the fast tier."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from test_faithfulness_correlation import _batches, _drive, _model, _TokenModel

from callbacks.completeness import CompletenessTest
from callbacks.saco import SaCoTest
from callbacks.tau_loo import TauLOOTest
from tests.gloo import gloo_group, run_on_two_processes


def _token_batches(n=4, b=3, seed=0):
    """Token batches of different lengths and real-token counts for the fake text classifier, two maps."""
    model = _TokenModel()
    model.batch_size = 4
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(n):
        ids = torch.randint(3, 30, (b, 9), generator=g)
        lengths = torch.randint(2, 9, (b,), generator=g)
        ids[torch.arange(9)[None] >= lengths[:, None]] = 0
        ids[:, 0] = 1
        ids[torch.arange(b), lengths - 1] = 2
        special = ((ids == 0) | (ids == 1) | (ids == 2)).long()
        inputs = {"input_ids": ids, "attention_mask": (ids > 0).long()}
        logits = model.scores(inputs)
        rel = {"a": {"predicted": torch.randn(b, 9, generator=g, dtype=torch.float64)},
               "b": {"predicted": torch.randn(b, 9, generator=g, dtype=torch.float64)}}
        outputs = {"relevance": rel, "logits": logits, "targets": {"predicted": logits.argmax(1)},
                   "classifier": model}
        out.append((outputs, {**inputs, "special_tokens_mask": special, "label": torch.zeros(b, dtype=torch.long),
                              "index": torch.arange(k * b, (k + 1) * b) + 50}))
    return out


def _tests():
    """``(factory, batches)`` of each test: SaCo and completeness on images, τ-LOO on tokens."""
    images = _batches(_model(), n=4, seed=5)
    return [(lambda: SaCoTest(groups=4), images),
            (lambda: CompletenessTest(methods=["a", "b"]), images),
            (lambda: TauLOOTest(methods=["a", "b"]), _token_batches())]


def _one_process():
    results = {}
    for make, batches in _tests():
        results.update(_drive(make(), batches).compute())
    return results


def _same(one, other):
    assert other.keys() == one.keys() and len(one) >= 9
    differ = {k: (one[k], other[k]) for k in one if not np.array_equal(other[k], one[k], equal_nan=True)}
    assert not differ, differ


def test_resumed_from_a_progress_state_equals_one_process():
    one = _one_process()
    assert one["saco/forwards"] == 4 * 16 * 2 and one["tau_loo/forwards"] > 0
    resumed_results = {}
    for make, batches in _tests():
        first = _drive(make(), batches[:2])
        resumed = make()
        saved = io.BytesIO()
        torch.save(first.progress_state(), saved)              # as callbacks/progress.py writes and reads it
        saved.seek(0)
        resumed.build_from_progress(torch.load(saved, weights_only=True))
        resumed_results.update(_drive(resumed, batches[2:]).compute())
    _same(one, resumed_results)


def _gloo_worker(rank: int, world: int, port: int, path: str) -> None:
    with gloo_group(rank, world, port):
        results = {}
        for make, batches in _tests():
            results.update(_drive(make(), batches[rank::world]).compute())
        if rank == 0:
            with open(path, "w") as f:
                json.dump(results, f)


@pytest.mark.slow
def test_two_gloo_processes_equal_one_process(tmp_path):
    one = _one_process()
    run_on_two_processes(_gloo_worker, str(tmp_path / "two.json"), base_port=29900)
    _same(one, json.loads((tmp_path / "two.json").read_text()))
