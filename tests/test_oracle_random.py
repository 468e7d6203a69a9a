"""benchmarks/oracle_random.py: the oracle / random-map counts of issue 34 from run folders, by hand on two fake
runs (directions read from metrics.meta.json; class-agnostic methods, counts and curves left out; ties apart)."""
from __future__ import annotations

import pytest

from benchmarks.oracle_random import main
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
