"""The removal-curve tests in real ``evaluate.py`` runs (configs/evaluate/synthetic_catalogue.yaml on a random tiny
ViT, 5 images): ``metrics.json``, the per-sample sidecar ``per_sample.npz`` and the conventions of
``metrics.meta.json`` are the same on one process and on two (gloo DDP) and after a kill and ``--resume``; the
logged forward counts equal their formulas. Slow (four ``evaluate.py`` runs): ``pytest -m slow``.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from evaluation.reporting import read_per_sample
from tests.test_evaluate import run_evaluate
from tests.test_resume import DDP, _kill_when, _popen, _resume, tiny_args

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = str(ROOT / "configs" / "evaluate" / "synthetic_catalogue.yaml")

pytestmark = pytest.mark.slow


def args(run):
    return ["--config", CATALOGUE] + tiny_args(run)


def load(run):
    return (json.loads((run / "metrics.json").read_text()), read_per_sample(run / "per_sample.npz"),
            json.loads((run / "metrics.meta.json").read_text()))


def run_to_end(run, extra=()):
    result = run_evaluate(args(run) + list(extra), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def conventions(meta):
    """``metrics.meta.json`` without its ``run`` block, which times the run itself (wall seconds, this process's model
    passes: different in every run by design, tests/test_run_clock.py)."""
    return {key: value for key, value in meta.items() if key != "run"}


def same(a, b, atol):
    (ma, sa, meta_a), (mb, sb, meta_b) = a, b
    assert sorted(ma) == sorted(mb) and sorted(sa) == sorted(sb) and conventions(meta_a) == conventions(meta_b)
    for key in ma:
        x, y = np.asarray(ma[key], dtype=float), np.asarray(mb[key], dtype=float)
        assert x.shape == y.shape and np.allclose(x, y, atol=atol, rtol=0, equal_nan=True), key
    for key in sa:
        assert np.array_equal(sa[key][0], sb[key][0]), key
        assert np.allclose(sa[key][1], sb[key][1], atol=atol, rtol=0, equal_nan=True), key


def test_one_process_two_processes_and_resume_agree(tmp_path):
    one = tmp_path / "one"
    run_to_end(one)
    reference = load(one)
    metrics, rows, meta = reference
    # every sample once, sorted; the forward counts are their formulas (5 images, 3 methods: rollout, gradcam and
    # the random map; a 4x4 patch grid and 32x32 pixels)
    assert rows["rise/rollout/predicted/deletion_auc"][0].tolist() == [0, 1, 2, 3, 4]
    methods, images = len({k.split("/")[1] for k in metrics if k.startswith("rise/") and k.count("/") == 3}), 5
    assert metrics["rise/forward_passes"] == images * methods * 2 * (16 + 1)
    assert metrics["rise_pixel/forward_passes"] == images * methods * 2 * (math.ceil(32 * 32 / 64) + 1)
    assert metrics["morf_lerf/forward_passes"] == images * methods * 2 * (16 + 1)
    assert metrics["road/forward_passes"] == images * methods * 2 * (9 + 1)
    conventions = meta["metrics"]["road/rollout/predicted/combined"]["conventions"]
    assert conventions["removal"] == "road" and conventions["seed"] == 0 and conventions["unit"] == "pixel"
    assert meta["metrics"]["rise/rollout/predicted/insertion_auc"]["higher_is_better"] is True
    # two processes (gloo): the same samples, the same values (forwards of other batch compositions: 1e-6)
    two = tmp_path / "two"
    run_to_end(two, DDP)
    same(load(two), reference, atol=1e-6)
    # killed after its first checkpoint, then resumed: bit for bit
    killed = tmp_path / "killed"
    proc = _popen(args(killed), {"rank": 0, "batch": 1, "how": "pause"})
    _kill_when(proc, [killed / "progress" / "rank0.pt"])
    result = _resume(killed)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    same(load(killed), reference, atol=0.0)
