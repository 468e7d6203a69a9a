"""benchmarks/run_tables.py: a run's results as one markdown table and the counts against the random map, by hand on
a fake run (directions read from metrics.meta.json; curves and keys without a direction left out; ties apart)."""
from __future__ import annotations

import pytest

from benchmarks.run_tables import main
from tests.fake_runs import write_run


def test_table_and_counts(tmp_path, capsys):
    values = {"accuracy": 0.75,
              "perturbation/a/positive/target/auc": 20.0, "perturbation/random/positive/target/auc": 30.0,
              "perturbation/b/positive/target/auc": 40.0, "perturbation/a/positive/target/curve": [1.0, 0.0],
              "rationale/a/target/token_f1@10": 0.5, "rationale/a/target/token_f1@2": 0.25,
              "rationale/random/target/token_f1@10": 0.5, "rationale/random/target/token_f1@2": 0.125,
              "rationale/b/target/token_f1@2": 0.0625, "rationale/forward_passes": 12.0}
    directions = {k: (not k.startswith("perturbation")) for k in values if k.endswith(("auc", "@2", "@10"))}
    lines = main([write_run(tmp_path / "run", values, directions), "--first", "b", "--anchors", "random"])
    assert lines[0] == "run-level: `accuracy` 0.75, `rationale/forward_passes` 12"
    # the one setting of each test is left out of the labels; f1@2 before f1@10; curves left out
    assert lines[2] == "| method | perturbation positive auc ↓ | rationale token_f1@2 ↑ | rationale token_f1@10 ↑ |"
    assert lines[4:7] == ["| b | 40.00 | 0.0625 | - |", "| a | 20.00 | 0.2500 | 0.5000 |",
                          "| **random** | 30.00 | 0.1250 | 0.5000 |"]
    assert lines[8:] == [
        "- `b`: better than the random map on 0 of 2 keys, worse on 2 (perturbation positive auc, "
        "rationale token_f1@2)",
        "- `a`: better than the random map on 2 of 3 keys, tied on 1 (rationale token_f1@10)"]
    assert capsys.readouterr().out.strip() == "\n".join(lines)


def test_both_settings_kept_and_no_methods_refused(tmp_path):
    values = {"perturbation/a/positive/target/auc": 20.0, "perturbation/a/positive/predicted/auc": 25.0}
    lines = main([write_run(tmp_path / "run", values, {k: False for k in values})])
    assert lines[2] == "| method | perturbation positive predicted auc ↓ | perturbation positive target auc ↓ |"
    assert len(lines) == 5   # no random map: no counts
    with pytest.raises(ValueError, match="no perturbation results"):
        main([write_run(tmp_path / "bare", {"accuracy": 1.0}, {})])


def test_methods_named_by_another_test_only_some_tests_and_small_values(tmp_path):
    """A run without the perturbation test (the catalogue's non-curve half): the methods named by ``--methods-from``;
    ``--tests`` keeps those tests' columns; values below 1e-3 keep 4 significant digits."""
    values = {"localisation/a/target/pointing_game": 1.0, "localisation/random/target/pointing_game": 0.5,
              "robustness/a/predicted/infidelity": 7.17e-07, "robustness/random/predicted/infidelity": 7.265e-07,
              "robustness/a/predicted/max_sensitivity": 0.0, "robustness/random/predicted/max_sensitivity": 0.0}
    run = write_run(tmp_path / "run", values, {k: k.startswith("localisation") for k in values})
    lines = main([run, "--methods-from", "localisation", "--tests", "robustness", "--anchors", "random"])
    assert lines[2] == "| method | robustness infidelity ↓ | robustness max_sensitivity ↓ |"
    assert lines[4:6] == ["| a | 7.170e-07 | 0.0000 |", "| **random** | 7.265e-07 | 0.0000 |"]
    assert lines[7] == "- `a`: better than the random map on 1 of 2 keys, tied on 1 (robustness max_sensitivity)"
    with pytest.raises(ValueError, match="no rationale results"):
        main([run, "--methods-from", "rationale"])
