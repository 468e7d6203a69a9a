"""benchmarks/oracle_random.py: the oracle / random-map counts of issue 34 from run folders, by hand on two fake
runs (directions read from metrics.meta.json; class-agnostic methods, counts and curves left out; ties apart)."""
from __future__ import annotations

import json

import pytest

from benchmarks.oracle_random import main
from evaluation.reporting import write_per_sample
from tests.fake_runs import write_run


def test_counts_and_exceptions(tmp_path, capsys):
    loc = {"localisation/a/target/pointing_game": 0.9, "localisation/b/target/pointing_game": 0.4,
           "localisation/random/target/pointing_game": 0.5, "localisation/oracle/target/pointing_game": 0.9,
           "localisation/rollout/target/pointing_game": 0.1, "complexity/a/predicted/gini": 0.3,
           "complexity/random/predicted/gini": 0.9}
    curves = {"rise/a/predicted/deletion_auc": 0.2, "rise/b/predicted/deletion_auc": 0.3,
              "rise/random/predicted/deletion_auc": 0.5, "rise/oracle/predicted/deletion_auc": 0.1,
              "rise/forward_passes": 100.0, "rise/a/predicted/deletion_curve": [1.0, 0.0]}
    runs = [write_run(tmp_path / "loc", loc, {k: True for k in loc}),
            write_run(tmp_path / "curves", curves, {k: False for k in curves if k.endswith("_auc")})]
    lines = main(runs + ["--class-agnostic", "rollout"])
    # random: PG a (hit), b (miss: 0.4 < 0.5); deletion a, b (hits, lower is better); rollout left out
    assert lines[0].startswith("- random map worse than every class-specific method: 3 of 4 pairs (75.0 %)")
    assert "localisation/pointing_game: b 0.400 vs random 0.500" in lines[0]
    # oracle: PG vs a (tie), b, rollout, random; deletion vs a, b, random: 6 of 7 strictly better, 1 tie
    assert lines[1].startswith("- oracle strictly better than the method: 6 of 7 pairs (85.7 %), tied 1, not better 0")
    assert capsys.readouterr().out.strip() == "\n".join(lines)
    per_test = main(runs + ["--class-agnostic", "rollout", "--by-test"])[2:]
    assert per_test == ["  - localisation: random worse 1 of 2; oracle strictly better 3 of 4, tied 1",
                        "  - rise: random worse 2 of 2; oracle strictly better 3 of 3, tied 0"]
    # a key in two runs: the same clean accuracy is one value; a key with two values is an error
    same = write_run(tmp_path / "same", {"accuracy": 0.5, **curves}, {})
    other = write_run(tmp_path / "other", {"accuracy": 0.5, "localisation/a/target/pointing_game": 0.9}, {})
    assert main([same, other]) == []
    with pytest.raises(ValueError, match="more than one of the runs .* different values"):
        main([runs[0], write_run(tmp_path / "changed", {"localisation/a/target/pointing_game": 0.8}, {})])


def test_samples_count_the_means_over_a_subset(tmp_path, capsys):
    """``--samples``: each counted key is the mean of its per-sample values over the listed dataset indices; a key
    whose run value is not the mean of its per-sample values (a class-mean) is left out and named."""
    per_sample = {"rise/a/predicted/deletion_auc": [0.1, 0.2, 0.9, 0.9],      # mean 0.525
                  "rise/random/predicted/deletion_auc": [0.5, 0.5, 0.5, 0.5],
                  "rise/oracle/predicted/deletion_auc": [0.3, 0.3, 0.0, 0.0],
                  "localisation/a/target/pointing_game": [1.0, 0.0, 0.0, 0.0]}
    values = {k: sum(v) / 4 for k, v in per_sample.items()}
    values["localisation/a/target/pointing_game"] = 0.5                          # a class-mean, not 0.25
    values["localisation/random/target/pointing_game"] = 0.1                     # no per-sample values
    directions = {k: not k.startswith("rise") for k in values}
    run = write_run(tmp_path / "run", values, directions)
    write_per_sample({k: ([3, 2, 1, 0], v[::-1]) for k, v in per_sample.items()}, tmp_path / "run" / "per_sample.npz")
    # the whole run: random 0.5 beats a's 0.525; the oracle (0.15) beats both
    assert main([run])[0].startswith("- random map worse than every class-specific method: 1 of 2 pairs")
    first = tmp_path / "first.json"
    first.write_text("[0, 1]")
    lines = main([run, "--samples", str(first)])
    # samples 0 and 1: a 0.15 beats random 0.5, the oracle 0.3 does not beat a; pointing game left out
    assert lines[0] == "- random map worse than every class-specific method: 1 of 1 pairs (100.0 %); exceptions: none"
    assert lines[1].startswith("- oracle strictly better than the method: 1 of 2 pairs (50.0 %), tied 0, not better 1")
    assert "rise/deletion_auc: a 0.150 vs oracle 0.300" in lines[1]
    assert lines[2] == ("- 2 samples; left out (no plain mean of per-sample values): "
                        "localisation/a/target/pointing_game; localisation/random/target/pointing_game")
    capsys.readouterr()
    unknown = tmp_path / "unknown.json"
    unknown.write_text("[0, 7]")
    with pytest.raises(ValueError, match=r"no value for the dataset indices \[7\]"):
        main([run, "--samples", str(unknown)])
    bad = tmp_path / "bad.json"
    bad.write_text('{"0": 1}')
    with pytest.raises(ValueError, match="non-empty JSON list of dataset indices"):
        main([run, "--samples", str(bad)])
    with pytest.raises(FileNotFoundError, match="per_sample.npz is missing"):
        main([write_run(tmp_path / "bare", values, directions), "--samples", str(first)])
    # a class-mean key whose run value happens to equal its plain mean is left out by its declared convention
    balanced = dict(values, **{"localisation/a/target/pointing_game": 0.25})
    declared = write_run(tmp_path / "declared", balanced, directions)
    meta_path = tmp_path / "declared" / "metrics.meta.json"
    meta = json.loads(meta_path.read_text())
    meta["metrics"]["localisation/a/target/pointing_game"]["conventions"] = {
        "pointing_game_mean": "per class, then over classes seen", "unit": "pixel"}
    meta_path.write_text(json.dumps(meta))
    write_per_sample({k: ([0, 1, 2, 3], v) for k, v in per_sample.items()}, tmp_path / "declared" / "per_sample.npz")
    assert main([declared, "--samples", str(first)])[2] == lines[2]
    undeclared = write_run(tmp_path / "undeclared", balanced, directions)
    write_per_sample({k: ([0, 1, 2, 3], v) for k, v in per_sample.items()}, tmp_path / "undeclared" / "per_sample.npz")
    assert main([undeclared, "--samples", str(first)])[2].endswith("left out (no plain mean of per-sample values): "
                                                                   "localisation/random/target/pointing_game")
