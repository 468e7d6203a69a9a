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
