"""Result keys (``evaluation.result_keys``), the sidecar ``metrics.meta.json``, the directions of runs without one,
and the W&B tags the callbacks declare."""
import json

import pytest

from callbacks.accuracy import CleanAccuracyTest
from callbacks.cdam_analysis import CDAMAnalysis
from callbacks.faithfulness import ERASERFaithfulnessTest
from callbacks.perturbation import PerturbationTest
from callbacks.rationale import RationaleTest
from callbacks.segmentation import SegmentationTest
from cli.commands import run_group_and_tags
from comparison import RunLoadError, load_run
from comparison.directions import declared_directions
from comparison.runs import load_wandb_project
from evaluation.reporting import metrics_meta, read_metrics_meta
from evaluation.result_keys import ResultKey

METHODS = ["gradcam", "beyond_intuition_token", "lrp-v2", "m.1"]

KEYS = {
    "accuracy": ResultKey("accuracy"),
    "perturbation/lrp-v2/positive/predicted/auc": ResultKey("perturbation", "lrp-v2", "predicted", "auc", "positive"),
    "perturbation/m.1/negative/target/curve": ResultKey("perturbation", "m.1", "target", "curve", "negative"),
    "segmentation/a_b/miou": ResultKey("segmentation", "a_b", metric="miou"),
    "cdam_analysis/pearson/a_b__vs__c.d": ResultKey("cdam_analysis", "a_b__vs__c.d", metric="pearson"),
    "cdam_analysis/sparsity/x-y": ResultKey("cdam_analysis", "x-y", metric="sparsity"),
    "cdam_analysis/discrimination/x/target_share_on_other":
        ResultKey("cdam_analysis", "x", metric="discrimination/target_share_on_other"),
    "rationale/coverage": ResultKey("rationale", metric="coverage"),
    "rationale/a.b/target/token_f1@10": ResultKey("rationale", "a.b", "target", "token_f1@10"),
    "eraser/a-b/predicted/comprehensiveness@0.05": ResultKey("eraser", "a-b", "predicted", "comprehensiveness@0.05"),
    "eraser/a/predicted/aopc_sufficiency": ResultKey("eraser", "a", "predicted", "aopc_sufficiency"),
}


@pytest.mark.parametrize("text", sorted(KEYS))
def test_every_key_form_round_trips(text):
    key = ResultKey.parse(text)
    assert key == KEYS[text] and key.format() == text and str(key) == text


@pytest.mark.parametrize("text", ["", "a//b", "/a", "a/", "accuracy/accuracy", "a/b/c/d/e/f", "cdam_analysis/x",
                                  "cdam_analysis/discrimination/m", "cdam_analysis/a/b/c"])
def test_malformed_keys_are_refused_naming_them(text):
    with pytest.raises(ValueError, match=f"malformed result key {text!r}"):
        ResultKey.parse(text)
    assert ResultKey.try_parse(text) is None


def test_parts_with_a_slash_are_refused():
    with pytest.raises(ValueError, match="must not hold '/'"):
        ResultKey("segmentation", "a/b", metric="miou")
    with pytest.raises(ValueError, match="setting needs a method"):
        ResultKey("rationale", setting="target", metric="auprc")


def declaring_callbacks():
    """Every test's callback, built for :data:`METHODS` (as the evaluation run builds them)."""
    pert = PerturbationTest(class_settings=["predicted", "target"])
    seg, cdam = SegmentationTest(), CDAMAnalysis(pairs=[METHODS[:2]])
    rationale = RationaleTest(class_settings=["predicted", "target"], ks=[1, 5])
    eraser = ERASERFaithfulnessTest(class_settings=["predicted", "target"], bins=[0.1, 0.5])
    for callback in (pert, seg, cdam, rationale, eraser):
        callback.build(METHODS)
    return [CleanAccuracyTest(), pert, seg, cdam, rationale, eraser]


def test_callbacks_keys_round_trip_and_runs_without_a_sidecar_get_their_declared_directions():
    declared = {}
    for callback in declaring_callbacks():
        declared.update(callback.higher_is_better())
    assert len(declared) > 200
    for key in declared:
        assert ResultKey.parse(key).format() == key
    # the table for runs written before metrics.meta.json says what the callbacks declare, key for key
    assert declared_directions(declared) == declared
    assert set(declared.values()) == {True, False, None}


def test_old_run_folder_loads_with_the_table_and_a_sidecar_overrides_it(tmp_path):
    metrics = {"accuracy": 0.5, "perturbation/m/positive/predicted/auc": 30.0,
               "perturbation/m/positive/predicted/curve": [0.5, 0.25], "segmentation/m/miou": 0.3,
               "eraser/m/target/sufficiency@0.1": 0.2, "newtest/m/score": 1.0}
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    old = load_run(tmp_path)
    assert old.higher_is_better == {"accuracy": True, "perturbation/m/positive/predicted/auc": False,
                                    "perturbation/m/positive/predicted/curve": None, "segmentation/m/miou": True,
                                    "eraser/m/target/sufficiency@0.1": False, "newtest/m/score": None}
    assert old.curve_x["perturbation/m/positive/predicted/curve"] == [0.0, 1.0]   # no fractions fit: the steps
    # a run that describes itself: its declarations win
    declared = {"newtest/m/score": False, "segmentation/m/miou": None}
    meta = metrics_meta(declared, {"perturbation/m/positive/predicted/curve": [0.0, 0.5]})
    assert read_metrics_meta(json.loads(json.dumps(meta))) == (
        {**declared, "perturbation/m/positive/predicted/curve": None},
        {"perturbation/m/positive/predicted/curve": [0.0, 0.5]})
    (tmp_path / "metrics.meta.json").write_text(json.dumps(meta))
    new = load_run(tmp_path)
    assert new.higher_is_better["newtest/m/score"] is False and new.higher_is_better["segmentation/m/miou"] is None
    assert new.higher_is_better["accuracy"] is True   # not in the sidecar: the table's
    assert new.curve_x["perturbation/m/positive/predicted/curve"] == [0.0, 0.5]
    (tmp_path / "metrics.meta.json").write_text(json.dumps(dict(meta, schema_version=99)))
    with pytest.raises(RunLoadError, match="metrics.meta.json: metrics sidecar schema version 99 is newer"):
        load_run(tmp_path)


def test_online_wandb_runs_read_the_declarations_from_their_summary():
    class Remote:   # what wandb.Api().runs yields, as far as load_wandb_project reads it
        name, id, group, tags, config = "r", "abc", "g", ["t"], {"seed_everything": 0}
        summary = {"accuracy": 0.5, "newtest/m/score": 1.0,
                   "metrics_meta": json.dumps(metrics_meta({"newtest/m/score": False}))}

        def logged_artifacts(self):
            return []

    class Api:
        def runs(self, path, filters):
            return [Remote()]

    (run,) = load_wandb_project("p", api=Api())
    assert run.metrics == {"accuracy": 0.5, "newtest/m/score": 1.0}
    assert run.higher_is_better == {"accuracy": True, "newtest/m/score": False}


def test_the_callbacks_declare_the_wandb_tags():
    config = {"data": {"class_path": "datamodules.synthetic_shapes.SyntheticShapesDataModule"},
              "model": {"classifier": "timm:vit_tiny_patch16_224", "methods": ["rollout", "gradcam"]},
              "trainer": {"callbacks": [
                  {"class_path": "callbacks.perturbation.PerturbationTest",
                   "init_args": {"auc": "bi", "masking": "mean", "ties": "index"}},
                  {"class_path": "pytorch_lightning.callbacks.LearningRateMonitor", "init_args": {}},
                  {"class_path": "callbacks.segmentation.SegmentationTest", "init_args": {"class_setting": None}},
                  {"class_path": "callbacks.cdam_analysis.CDAMAnalysis", "init_args": {"class_setting": "target"}},
                  {"class_path": "callbacks.accuracy.CleanAccuracyTest"}]}}
    assert run_group_and_tags(config) == ("SyntheticShapes/vit_tiny_patch16_224", [
        "dataset:SyntheticShapes", "model:vit_tiny_patch16_224", "methods:gradcam+rollout", "auc:bi",
        "masking:mean", "ties:index", "segmentation:predicted", "cdam_analysis:target"])
