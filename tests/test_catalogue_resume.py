"""The catalogue tests of issue 34 part B (localisation, complexity, faithfulness correlation, SaCo, robustness,
completeness) through ``evaluate.py`` on the tiny ViT of tests/test_resume.py: a run that crashes mid-way and is
resumed writes the ``metrics.json`` of the uninterrupted run, bit for bit, counts included."""
from __future__ import annotations

import json

import pytest
from test_resume import ROOT, evaluate_main, load, tiny_args

CALLBACKS = [
    {"class_path": "callbacks.localisation.LocalisationTest", "init_args": {"tolerance": 4, "oracle": True}},
    {"class_path": "callbacks.complexity.ComplexityTest", "init_args": {}},
    {"class_path": "callbacks.faithfulness_correlation.FaithfulnessCorrelationTest", "init_args": {"runs": 4}},
    {"class_path": "callbacks.saco.SaCoTest", "init_args": {"groups": 4}},
    {"class_path": "callbacks.robustness.RobustnessTest", "init_args": {"infidelity_runs": 2, "sensitivity_runs": 2}},
    {"class_path": "callbacks.completeness.CompletenessTest", "init_args": {"methods": ["gradcam"]}},
]


def _config(tmp_path):
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps({"base": str(ROOT / "configs/evaluate/synthetic.yaml"),
                                "trainer": {"callbacks": CALLBACKS}}))
    return ["--config", str(path)]


@pytest.mark.slow
def test_catalogue_run_resumes_to_the_uninterrupted_metrics(tmp_path, monkeypatch):
    config = _config(tmp_path)
    evaluate_main(config + tiny_args(tmp_path / "reference", every=1), monkeypatch)
    reference = load(tmp_path / "reference" / "metrics.json")
    assert reference["faithfulness_correlation/forwards"] == 4 * 5
    assert reference["saco/forwards"] == 4 * 5 * 2                    # rollout and gradcam, each its own map
    assert reference["robustness/reexplanations"] == 2 * 5 * 2
    assert any(k.startswith("localisation/oracle/") for k in reference)
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="StopAt"):
        evaluate_main(config + tiny_args(run, every=1), monkeypatch, stop={"rank": 0, "batch": 1, "how": "raise"})
    assert not (run / "metrics.json").exists()
    evaluate_main(["--resume", str(run)], monkeypatch)
    resumed = load(run / "metrics.json")
    assert sorted(resumed) == sorted(reference)
    for key, value in reference.items():
        assert json.dumps(resumed[key]) == json.dumps(value), (key, resumed[key], value)
