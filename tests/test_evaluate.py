"""End-to-end evaluate.py runs on a tiny config: metrics.json, 1 vs 2 processes, clear data errors.

DDP runs go through a subprocess of ``evaluate.py`` (never ``strategy="ddp"`` inside pytest: its children would
re-run pytest). The classifier is a random tiny timm ViT; the data the synthetic shapes benchmark.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = "{img_size: 32, patch_size: 8, embed_dim: 32, depth: 4, num_heads: 2, num_classes: 4}"
METHODS = "[rollout, gradcam, random, beyond_intuition_token]"


def tiny_args(out_dir, test_size=5, batch_size=2, logger=False):
    args = [
        "--model.classifier", "timm:vit_tiny_patch16_224", "--model.pretrained", "false",
        "--model.model_kwargs", TINY_MODEL, "--model.methods", METHODS,
        "--model.method_options", "{beyond_intuition_token: {start_layer: 2}}",
        "--data.init_args.image_size", "32", "--data.init_args.test_size", str(test_size),
        "--data.init_args.batch_size", str(batch_size),
        "--trainer.default_root_dir", str(out_dir), "--output_dir", str(out_dir / "run"),
    ]
    if not logger:
        args += ["--trainer.logger", "false"]
    return args


def run_evaluate(args, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline", WANDB_SILENT="true", CI="1")
    return subprocess.run([sys.executable, str(ROOT / "evaluate.py"), *args], cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=timeout)


def load(path):
    return json.loads(Path(path).read_text())


#: the command-line arguments that run evaluate.py on two CPU processes (gloo DDP)
TWO_PROCESSES = ["--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu"]


def metrics_on_one_and_two_processes(args, tmp_path, timeout=600):
    """``metrics.json`` of ``evaluate.py args`` on one process and on two, each written under ``tmp_path``;
    both runs must succeed and report the same keys."""
    runs = {}
    for n in (1, 2):
        out = tmp_path / f"p{n}"
        result = run_evaluate(args + ["--output_dir", str(out)] + (TWO_PROCESSES if n == 2 else []), timeout=timeout)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        runs[n] = load(out / "metrics.json")
    assert sorted(runs[1]) == sorted(runs[2])
    return runs[1], runs[2]


def assert_same_metrics(one, two, atol=1e-6):
    """Every metric of ``one`` equals ``two``'s within ``atol`` (NaN equals NaN)."""
    for key in one:
        a, b = torch.tensor(one[key], dtype=torch.float64), torch.tensor(two[key], dtype=torch.float64)
        assert a.shape == b.shape and torch.allclose(a, b, atol=atol, rtol=0, equal_nan=True), (key, one[key], two[key])


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    result = run_evaluate(tiny_args(out, logger=True))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, result


def test_end_to_end_metrics_json(one_process):
    out, result = one_process
    path = out / "run" / "metrics.json"
    assert f"metrics written to {path}" in result.stdout
    assert "perturbation AUC" in result.stdout and "segmentation" in result.stdout
    # the table says which direction is better as the metrics declare it
    assert any(line.split() == ["better", "lower", "higher", "lower", "higher"] for line in result.stdout.splitlines())
    metrics = load(path)
    methods = ["rollout", "gradcam", "random", "beyond_intuition_token"]
    for m in methods:
        for direction in ("positive", "negative"):
            for setting in ("predicted", "target"):
                curve = metrics[f"perturbation/{m}/{direction}/{setting}/curve"]
                assert len(curve) == 10 and curve[0] == pytest.approx(metrics["accuracy"])
                x = [0.1 * i for i in range(10)]
                expected = 100 * sum((x[i + 1] - x[i]) * (curve[i] + curve[i + 1]) / 2 for i in range(9))
                assert metrics[f"perturbation/{m}/{direction}/{setting}/auc"] == pytest.approx(expected)
        for name in ("pixel_accuracy", "miou", "map", "f1", "f1_rows"):
            assert 0.0 <= metrics[f"segmentation/{m}/{name}"] <= 1.0
    # 5 samples: every accuracy is a multiple of 1/5
    assert math.isclose(metrics["accuracy"] * 5, round(metrics["accuracy"] * 5), abs_tol=1e-9)
    # W&B offline run with the config, tables and overlay images
    runs = list((out / "wandb").glob("offline-run-*"))
    assert runs, "no offline W&B run written"
    media = list(runs[0].rglob("*.png"))
    assert any("overlays" in str(p) for p in media)


def test_tiny_run_reproduces_the_reference_metrics(one_process):
    """The tiny config's metrics.json equals, key for key within 1e-6, the one written by the evaluation code
    before its refactor into callbacks + ``evaluation/`` protocols + one results reporter
    (``tests/data/evaluate_tiny_metrics.json``: commit ab9c48c, same command line, CPU). One value was re-recorded
    since: ``segmentation/gradcam/map`` 0.7515 -> 0.5251, when a constant map's mAP followed the reference script
    (every pixel tied, AP 0.5: ``evaluation/segmentation.py``); Grad-CAM's relu leaves whole maps at 0. Four more
    on 2026-11-26, when rollout began composing its read-out row alone, in float64 (``methods.rollout``): its
    segmentation f1 0.32119 -> 0.32164, mAP 0.704267 -> 0.704280, mIoU 0.40094 -> 0.40154, pixel accuracy
    0.64180 -> 0.64258 (2 of 2,560 pixels cross the threshold; the new map is nearer the float64 rollout: 2.9e-7
    against 5.8e-7 of the largest score, measured on a random ViT)."""
    out, _ = one_process
    new, reference = load(out / "run" / "metrics.json"), load(ROOT / "tests" / "data" / "evaluate_tiny_metrics.json")
    assert sorted(new) == sorted(reference)
    for key, expected in reference.items():
        got = new[key]
        if expected is None or (isinstance(expected, list) and None in expected):
            assert got == expected, key
            continue
        a, b = torch.tensor(got, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64)
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-6, rtol=0), (key, got, expected)


def test_two_processes_match_one_process_on_uneven_data(one_process, tmp_path):
    out_one, _ = one_process
    result = run_evaluate(tiny_args(tmp_path) + TWO_PROCESSES)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    one, two = load(out_one / "run" / "metrics.json"), load(tmp_path / "run" / "metrics.json")
    assert sorted(one) == sorted(two)
    assert_same_metrics(one, two)
    # the map gallery (samples 0-3, split over the two processes) gathered to the same file
    from evaluation.gallery import GALLERY_FILE, read_gallery

    a, b = read_gallery(out_one / "run" / GALLERY_FILE), read_gallery(tmp_path / "run" / GALLERY_FILE)
    assert a.keys() == b.keys() and a["ids"].tolist() == [0, 1, 2, 3]
    assert all(np.allclose(a[k], b[k], atol=1e-6, rtol=0) if a[k].dtype.kind == "f" else np.array_equal(a[k], b[k])
               for k in a)


def test_reporting_uses_the_declared_directions_and_curve_axes(tmp_path):
    from evaluation.reporting import curve_rows, results_table, write_metrics_json

    results = {"accuracy": 0.5, "perturbation/m/positive/target/auc": 30.0, "perturbation/m/negative/target/auc": 40.0,
               "perturbation/m/positive/target/curve": [0.5, 0.25], "segmentation/m/miou": 0.25,
               "cdam_analysis/sparsity/x": float("nan"), "cdam_analysis/sparsity/y": 0.75}
    better = {"accuracy": True, "perturbation/m/positive/target/auc": False,
              "perturbation/m/negative/target/auc": True, "segmentation/m/miou": True,
              "cdam_analysis/sparsity/y": False}
    lines = results_table(results, better).splitlines()
    header = lines.index("perturbation AUC")
    assert lines[header + 1].split() == ["method", "positive/target", "negative/target"]
    assert lines[header + 2].split() == ["better", "lower", "higher"]
    assert lines[lines.index("segmentation") + 2].split() == ["better", "higher"]
    assert any(line.startswith("cdam_analysis/sparsity/y") and line.endswith("(lower is better)") for line in lines)
    assert any(line.startswith("cdam_analysis/sparsity/x") and line.endswith("nan") for line in lines)
    # no declaration: the grid says so instead of guessing
    assert results_table(results).splitlines()[header + 2].split() == ["better", "-", "-"]
    assert curve_rows(results, {"perturbation/m/positive/target/curve": [0.0, 0.5]}) == [
        ["perturbation/m/positive/target/curve", 0, 0.0, 0.5], ["perturbation/m/positive/target/curve", 1, 0.5, 0.25]]
    written = load(write_metrics_json(results, tmp_path / "metrics.json"))
    assert list(written) == sorted(results) and written["cdam_analysis/sparsity/x"] is None


def test_wrong_data_path_is_a_clear_error(tmp_path):
    missing = tmp_path / "no_imagenet"
    result = run_evaluate([
        "--config", str(ROOT / "configs" / "evaluate" / "imagenet_perturbation.yaml"),
        "--model.classifier", "timm:vit_tiny_patch16_224", "--model.pretrained", "false",
        "--model.model_kwargs", TINY_MODEL, "--model.methods", "[rollout]",
        "--data.init_args.root", str(missing), "--trainer.logger", "false",
        "--trainer.default_root_dir", str(tmp_path),
    ], timeout=120)
    assert result.returncode != 0
    assert f"data folder {str(missing)!r} does not exist" in result.stderr + result.stdout


def test_module_contract_with_other_class_and_cdam_callback(tmp_path):
    """In-process single-device run: the 'other' setting is computed when a callback needs it."""
    import pytorch_lightning as pl

    from callbacks.accuracy import CleanAccuracyTest
    from callbacks.base import EvaluationCallback
    from callbacks.cdam_analysis import CDAMAnalysis
    from callbacks.reporter import ResultsReporter
    from callbacks.segmentation import SegmentationTest
    from datamodules.synthetic_shapes import SyntheticShapesDataModule
    from datamodules.unrepeated import UnrepeatedTestData
    from lightning_modules.evaluation import AttributionEvaluationModule

    torch.set_num_threads(1)
    seen = {}

    class Spy(pl.Callback):
        def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            seen["outputs"], seen["batch"] = outputs, batch

    cdam = CDAMAnalysis(methods=["cdam", "rollout"])
    reporter = ResultsReporter(output_dir=None, print_results=False)
    callbacks = [cdam, SegmentationTest(), CleanAccuracyTest(), Spy(), reporter]
    # the callbacks declare the class settings they need; the module is built to explain their union
    settings = EvaluationCallback.declared_class_settings(callbacks)
    assert settings == ("predicted", "target", "other")
    kwargs = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4)
    module = AttributionEvaluationModule("timm:vit_tiny_patch16_224", pretrained=False, model_kwargs=kwargs,
                                         methods=["cdam", "rollout"], class_settings=settings)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, inference_mode=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=callbacks, default_root_dir=str(tmp_path))
    data = SyntheticShapesDataModule(image_size=32, test_size=3, batch_size=3, two_objects=True)
    trainer.test(module, datamodule=UnrepeatedTestData(data), verbose=False)
    outputs, batch = seen["outputs"], seen["batch"]
    assert set(outputs["targets"]) == {"predicted", "target", "other"}
    assert torch.equal(outputs["targets"]["other"], batch["other_label"])
    assert outputs["relevance"]["cdam"]["target"].shape == (3, 16)
    # class-agnostic rollout: one tensor shared by every setting, and declared so
    assert outputs["relevance"]["rollout"]["target"] is outputs["relevance"]["rollout"]["other"]
    assert outputs["class_specific"] == {"cdam": True, "rollout": False}
    # what the callbacks need besides the maps: the token grid and the one way to classify
    assert tuple(outputs["layout"].grid) == (4, 4)
    assert torch.equal(outputs["classifier"].predict(batch["image"]), outputs["logits"].argmax(dim=-1))
    results = reporter.results
    assert any(k.startswith("cdam_analysis/discrimination/cdam/") for k in results)
    # ... and no (trivial) target-vs-other discrimination rows for it; its other analyses stay
    assert not any("/discrimination/rollout/" in k for k in results)
    assert "cdam_analysis/sparsity/rollout" in results
    assert 0 <= results["accuracy"] <= 1 and reporter.higher_is_better["accuracy"] is True
    assert reporter.higher_is_better["segmentation/cdam/miou"] is True


def test_short_batches_run_at_the_loaders_batch_size(tmp_path):
    """The last batch (1 of 4 samples at batch size 3) and the last chunk of ``method_batch_size`` 2 are padded with
    copies of their last sample: every method call and the clean forward run at 2 and 3 samples, and a sample's
    map and logits are those of a full batch, to the bit (a float32 matrix product rounds a row differently
    with 1 to 3 rows than with more: unpadded they would depend on how the data is split over processes)."""
    import pytorch_lightning as pl

    from datamodules.synthetic_shapes import SyntheticShapesDataModule
    from lightning_modules.evaluation import AttributionEvaluationModule

    torch.set_num_threads(1)
    kwargs = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4)
    module = AttributionEvaluationModule("timm:vit_tiny_patch16_224", pretrained=False, model_kwargs=kwargs,
                                         methods=["generic_attribution"], method_batch_size=2)
    method, calls, seen = module.methods["generic_attribution"], [], []

    def recorded(model, inputs, target=None, sample_ids=None):
        calls.append(len(inputs))
        return method(model, inputs, target=target, sample_ids=sample_ids)

    recorded.class_specific = True  # type: ignore[attr-defined]
    module.methods["generic_attribution"] = recorded

    class Spy(pl.Callback):
        def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            seen.append((outputs, batch))

    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, inference_mode=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[Spy()], default_root_dir=str(tmp_path))
    trainer.test(module, datamodule=SyntheticShapesDataModule(image_size=32, test_size=4, batch_size=3), verbose=False)
    assert calls == [2, 2, 2] and [len(b["label"]) for _, b in seen] == [3, 1]
    outputs, batch = seen[1]
    assert outputs["relevance"]["generic_attribution"]["predicted"].shape == (1, 16)
    images = torch.cat([module.model_inputs(b) for _, b in seen])   # samples 0, 1, 2 | 3
    with torch.no_grad():
        full = module.classifier.model_logits(images[[3, 0, 1]])
    assert torch.equal(outputs["logits"][0], full[0])
    target = outputs["targets"]["predicted"]
    in_pair = method(module.model, images[[3, 1]], target=torch.cat([target, target]))
    assert torch.equal(outputs["relevance"]["generic_attribution"]["predicted"][0], in_pair[0])


def test_inference_mode_is_refused(tmp_path):
    import pytorch_lightning as pl

    from datamodules.synthetic_shapes import SyntheticShapesDataModule
    from lightning_modules.evaluation import AttributionEvaluationModule

    kwargs = dict(img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=1, num_classes=4)
    module = AttributionEvaluationModule("timm:vit_tiny_patch16_224", pretrained=False, model_kwargs=kwargs,
                                         methods=["gradcam"])
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="inference_mode=False"):
        trainer.test(module, datamodule=SyntheticShapesDataModule(image_size=32, test_size=2, batch_size=2),
                     verbose=False)


@pytest.mark.parametrize("methods,message", [
    (["rollout"], r"rollout: start_layer=99 is outside VisionTransformer with 2 blocks \(valid: -2 to 1"),
    (["raw_attention"], r"raw_attention: layer=-3 is outside VisionTransformer with 2 blocks"),
    ({"bi": {"method": "beyond_intuition_token", "start_layer": None, "token_scale_values": "attention_input"}},
     # the image default, 6, on a 2-block model
     r"method 'bi': beyond_intuition_token: start_layer \(default\)=6 is outside VisionTransformer with 2 blocks"),
    (["beyond_intuition_token"], r"token_scale_values='post_attention'.*VisionTransformer .*does not"),
    (["lrp"], r"lrp: text_input='word_embeddings' .*VisionTransformer"),
])
def test_method_options_are_checked_against_the_model_when_the_module_is_built(methods, message):
    """Options that do not fit the model (a block past its depth, a capability its adapter lacks) fail in
    ``__init__``, naming the method, the option and the model, instead of at the first test batch."""
    from lightning_modules.evaluation import AttributionEvaluationModule

    kwargs = dict(img_size=32, patch_size=8, embed_dim=16, depth=2, num_heads=1, num_classes=4)
    options = {"rollout": {"start_layer": 99}, "raw_attention": {"layer": -3}, "lrp": {"text_input": "word_embeddings"},
               "beyond_intuition_token": {"start_layer": 0, "token_scale_values": "post_attention"}}
    with pytest.raises(ValueError, match=message):
        AttributionEvaluationModule("timm:vit_tiny_patch16_224", pretrained=False, model_kwargs=kwargs,
                                    methods=methods, method_options=options)
    fitting = {"rollout": {"start_layer": -2}, "raw_attention": {"layer": 1}, "lrp": {},
               "beyond_intuition_token": {"start_layer": 1}}
    AttributionEvaluationModule("timm:vit_tiny_patch16_224", pretrained=False, model_kwargs=kwargs,
                                methods=methods if isinstance(methods, list) else ["beyond_intuition_token"],
                                method_options=fitting)


def test_methods_selected_by_a_set_leave_out_those_undefined_on_the_model():
    """``all``, ``null`` and ``tag:`` select methods by set: one the model does not serve (ALTI-Logit on a ViT: it
    needs a decoder) is left out of the run while ``alti`` of the same tag stays; asked for by name it is an error
    naming the model."""
    from lightning_modules.evaluation import AttributionEvaluationModule
    from methods import MethodUndefinedError

    kwargs = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4)
    module = AttributionEvaluationModule("timm:vit_tiny_patch16_224", pretrained=False, model_kwargs=kwargs,
                                         methods=["rollout", "tag:alti"])
    assert set(module.methods) == {"rollout", "alti"} and set(module.method_specs) == {"rollout", "alti"}
    with pytest.raises(MethodUndefinedError, match="alti_logit"):
        AttributionEvaluationModule("timm:vit_tiny_patch16_224", pretrained=False, model_kwargs=kwargs,
                                    methods=["rollout", "alti_logit"])
