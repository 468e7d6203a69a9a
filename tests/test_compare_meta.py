"""comparison.meta on hand-built tiny run folders: rankings, Kendall's W across seeds, agreement, reliability of
per-sample rankings, separation from the random map, the oracle rule and the sanity table."""
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from comparison import load_runs
from comparison.meta import RELIABILITY_MIN, meta_evaluate, sanity_table
from evaluation.reporting import PER_SAMPLE_FILE, metrics_meta, write_per_sample

METHODS = ("a", "b", "c", "random")
N = 40


def key(method, metric="miou"):
    return f"segmentation/{method}/{metric}"


def write_run(folder, scalars, directions, per_sample=None, seed=0):
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(scalars))
    (folder / "metrics.meta.json").write_text(json.dumps(metrics_meta(directions)))
    (folder / "config.yaml").write_text(yaml.safe_dump({"seed_everything": seed, "model": {"seed": seed, "x": 1},
                                                        "output_dir": str(folder)}))   # where: not a setting
    if per_sample:
        write_per_sample(per_sample, folder / PER_SAMPLE_FILE)
    return folder


def consistent_samples(order, metric="miou"):
    """Per-sample values that rank the methods in ``order`` (best first) on every sample."""
    base = np.linspace(0.0, 0.2, N)
    return {key(m, metric): (np.arange(N), base + 1.0 - 0.2 * rank) for rank, m in enumerate(order)}


def runs_of(tmp_path, orders, per_sample=True, metric="miou", higher=True):
    folders = []
    for seed, order in enumerate(orders):
        samples = consistent_samples(order, metric) if per_sample else None
        scalars = {k: float(v.mean()) for k, (_, v) in consistent_samples(order, metric).items()}
        folders.append(write_run(tmp_path / f"seed{seed}", scalars, {k: higher for k in scalars}, samples, seed))
    return load_runs(folders)


def metric(report, name="miou"):
    return next(m for m in report.metrics if m.family[2] == name)


def test_identical_rankings_have_w_one_and_reliable_samples(tmp_path):
    runs = runs_of(tmp_path, [("a", "b", "c", "random")] * 3)
    report = meta_evaluate(runs)
    m = metric(report)
    assert report.groups == {"seed0": ["seed0", "seed1", "seed2"]}   # only the seeds differ
    assert m.ranks["seed0"] == {"a": 1.0, "b": 2.0, "c": 3.0, "random": 4.0}
    assert m.stability == {"seed0": pytest.approx(1.0)}
    assert m.reliability["seed1"] == pytest.approx(1.0) and m.samples["seed1"] == N
    assert m.intervals["seed0"]["a"] == (1.0, 1.0, 1.0)
    assert m.separated["seed0"] == {"a": True, "b": True, "c": True}
    assert m.failures == []


def test_ranking_and_its_reverse_have_w_zero_and_are_unstable(tmp_path):
    runs = runs_of(tmp_path, [("a", "b", "c", "random"), ("random", "c", "b", "a")], per_sample=False)
    m = metric(meta_evaluate(runs))
    assert m.stability == {"seed0": pytest.approx(0.0)}
    assert [f.rule for f in m.failures] == ["unstable"]
    assert m.reliability == {} and m.intervals == {}   # no sidecar: no per-sample measures


def test_direction_is_read_from_the_declarations(tmp_path):
    runs = runs_of(tmp_path, [("a", "b", "c", "random")], higher=False)
    assert metric(meta_evaluate(runs)).ranks["seed0"] == {"a": 4.0, "b": 3.0, "c": 2.0, "random": 1.0}


def test_noise_per_sample_is_flagged_unreliable_and_not_separated(tmp_path):
    rng = np.random.default_rng(0)
    samples = {key(m): (np.arange(N), rng.normal(size=N)) for m in METHODS}
    scalars = {k: float(v.mean()) for k, (_, v) in samples.items()}
    run = write_run(tmp_path / "noise", scalars, {k: True for k in scalars}, samples)
    m = metric(meta_evaluate(load_runs([run])))
    assert m.reliability["noise"] < RELIABILITY_MIN
    rules = {f.rule for f in m.failures}
    assert "unreliable" in rules and "no separation" in rules
    assert not any(m.separated["noise"].values())


def test_agreement_flags_contradictory_metrics_and_oracle_rule(tmp_path):
    order = ("oracle", "a", "b", "random")
    forward = consistent_samples(order, "miou")
    backward = consistent_samples(order[::-1], "f1")
    scalars = {k: float(v.mean()) for k, (_, v) in {**forward, **backward}.items()}
    run = write_run(tmp_path / "r", scalars, {k: True for k in scalars}, {**forward, **backward})
    report = meta_evaluate(load_runs([run]))
    assert report.agreement_names == ["segmentation / f1", "segmentation / miou"]
    assert report.agreement[0, 1] == pytest.approx(-1.0) and report.agreement[0, 0] == pytest.approx(1.0)
    assert report.contradictory == [("segmentation / f1", "segmentation / miou")]
    assert metric(report, "miou").oracle_rank == {"r": 1.0}
    assert [f.rule for f in metric(report, "f1").failures] == ["oracle not first"]


def test_runs_with_other_settings_are_not_one_seed_group(tmp_path):
    runs = runs_of(tmp_path, [("a", "b", "c", "random")] * 2, per_sample=False)
    config = yaml.safe_load((tmp_path / "seed1" / "config.yaml").read_text())
    config["model"]["x"] = 2
    (tmp_path / "seed1" / "config.yaml").write_text(yaml.safe_dump(config))
    report = meta_evaluate(load_runs([tmp_path / "seed0", tmp_path / "seed1"]))
    assert len(report.groups) == 2 and metric(report).stability == {}
    assert len(runs) == 2


def test_sanity_table_reads_pass_keys(tmp_path):
    scalars = {"sanity/gradcam/predicted/mprt_cascading_pass": 1.0, "sanity/edges/predicted/mprt_cascading_pass": 0.0,
               "sanity/gradcam/predicted/mprt_cascading_spearman": [0.9, 0.1], "accuracy": 0.5}
    run = write_run(tmp_path / "s", scalars, {k: True for k in scalars})
    table = sanity_table(load_runs([run]))
    assert table == {("edges", "mprt_cascading (predicted)"): {"s": 0.0},
                     ("gradcam", "mprt_cascading (predicted)"): {"s": 1.0}}
    assert meta_evaluate(load_runs([run])).metrics == []   # sanity and accuracy are no metric of methods


def test_sweep_config_sets_the_seeds_and_keeps_the_data(tmp_path):
    from comparison.sweep import seeded_config

    config = seeded_config("configs/evaluate/synthetic_catalogue.yaml", 7)
    assert config["seed_everything"] == 7 and config["data"]["init_args"]["seed"] == 0   # the same samples
    assert all(Path(b).is_absolute() and Path(b).is_file() for b in config["base"])
    road = next(c for c in config["trainer"]["callbacks"] if c["class_path"].endswith("ROADTest"))
    assert road["init_args"]["seed"] == 7 and road["init_args"]["tie_seed"] == 7
    assert all(c["init_args"]["tie_seed"] == 7 for c in config["trainer"]["callbacks"])


def test_separation_is_judged_only_where_the_samples_could_separate():
    from comparison.meta import can_separate
    from evaluation.meta_evaluation import wilcoxon_p

    # the smallest p of n differences of one sign, against Holm's first threshold
    for n, tests in ((8, 14), (8, 1), (16, 14), (5, 1)):
        smallest = wilcoxon_p(np.arange(1.0, n + 1), np.zeros(n))
        assert can_separate(n, tests) == (tests * smallest < 0.05)
    assert not can_separate(8, 14) and can_separate(16, 14)


def test_corrupt_sidecar_names_the_file(tmp_path):
    import compare

    runs_of(tmp_path, [("a", "b", "c", "random")])
    (tmp_path / "seed0" / PER_SAMPLE_FILE).write_bytes(b"not a zip")
    with pytest.raises(SystemExit, match="seed0/per_sample.npz: corrupt per-sample sidecar"):
        compare.main([str(tmp_path / "seed0"), "--out", str(tmp_path / "out"), "--no-png"])
