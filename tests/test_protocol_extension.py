"""A new protocol is two pieces: its metric (what ``evaluation/<x>.py`` holds) and its callback (``callbacks/<x>.py``).

The toy "constant score" test below is both, defined here and named in a config by its class path only. Nothing
else in the code base knows it, yet its results reach ``metrics.json``, the sidecar ``metrics.meta.json`` (its
direction, its curve's x values), the printed table and ``compare.py``'s tables with the declared direction, and
its W&B tag reaches the run's tags.
"""
import json
import shutil
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import torch
from torchmetrics import Metric

import compare
import evaluate
from callbacks.base import EvaluationCallback, outputs_device, relevance_for
from cli.commands import run_group_and_tags
from evaluation.result_keys import ResultKey

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "constant_score"
CURVE_X = [0.25, 0.75]


# ---------------------------------------------------------------------------- the metric (evaluation/<x>.py)
class ConstantScore(Metric):
    """Mean over samples of a per-sample score (float64 sums, reduced across processes); lower is better."""

    higher_is_better = False
    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, scores: torch.Tensor) -> None:
        self.total += scores.to(torch.float64).sum()
        self.count += scores.numel()

    def compute(self) -> torch.Tensor:
        return self.total / self.count


# ---------------------------------------------------------------------------- the callback (callbacks/<x>.py)
class ConstantScoreTest(EvaluationCallback):
    """Every map of ``methods`` scores ``value``: ``constant_score/<method>/<setting>/score`` and a two-point curve
    ``.../curve`` over :data:`CURVE_X`."""

    def __init__(self, methods: Optional[List[str]] = None, class_setting: str = "predicted",
                 value: float = 0.5) -> None:
        super().__init__()
        self.methods, self.class_setting, self.value = methods, class_setting, float(value)
        self.required_class_settings = (class_setting,)
        self._metrics: Dict[str, ConstantScore] = {}

    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        return [f"{PREFIX}:{init_args.get('class_setting') or 'predicted'}"]

    def build(self, methods: List[str], device=None) -> None:
        self._metrics = {m: ConstantScore() for m in methods}
        self._place_metrics(device)

    def reset(self) -> None:
        self._metrics = {}

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        if not self._metrics:
            self.build(self.methods or list(outputs["relevance"]), outputs_device(outputs))
        for method, metric in self._metrics.items():
            rel = relevance_for(outputs["relevance"], method, self.class_setting, PREFIX)
            metric.update(torch.full(rel.shape[:1], self.value, device=rel.device))

    def _key(self, method: str, metric: str) -> str:
        return ResultKey(PREFIX, method, self.class_setting, metric).format()

    def compute(self) -> Dict[str, Any]:
        results: Dict[str, Any] = {}
        for method, metric in self._metrics.items():
            value = float(metric.compute())
            results[self._key(method, "score")] = value
            results[self._key(method, "curve")] = [value, value]
        return results

    def higher_is_better(self) -> Dict[str, Optional[bool]]:
        return {key: ConstantScore.higher_is_better if key.endswith("/score") else None
                for m in self._metrics for key in (self._key(m, "score"), self._key(m, "curve"))}

    def curve_x(self) -> Dict[str, List[float]]:
        return {self._key(m, "curve"): CURVE_X for m in self._metrics}


# ---------------------------------------------------------------------------- the test
CALLBACK = {"class_path": "tests.test_protocol_extension.ConstantScoreTest",
            "init_args": {"methods": ["rollout", "random"], "class_setting": "target"}}


def test_a_new_protocol_needs_only_its_metric_and_callback(tmp_path, capsys):
    torch.set_num_threads(1)
    config = tmp_path / "constant.yaml"
    config.write_text(json.dumps({
        "base": str(ROOT / "configs" / "base" / "evaluate.yaml"),
        "trainer": {"logger": False, "callbacks": [CALLBACK]},
        "model": {"classifier": "timm:vit_tiny_patch16_224", "pretrained": False, "methods": ["rollout", "random"],
                  "model_kwargs": {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2,
                                   "num_classes": 4}},
        "data": {"class_path": "datamodules.synthetic_shapes.SyntheticShapesDataModule",
                 "init_args": {"image_size": 32, "test_size": 3, "batch_size": 3}},
    }))
    a = tmp_path / "a"
    evaluate.main(["--config", str(config), "--output_dir", str(a), "--trainer.default_root_dir", str(tmp_path)])
    score, curve = "constant_score/rollout/target/score", "constant_score/rollout/target/curve"
    metrics = json.loads((a / "metrics.json").read_text())
    assert metrics[score] == 0.5 and metrics[curve] == [0.5, 0.5] and "accuracy" in metrics
    meta = json.loads((a / "metrics.meta.json").read_text())["metrics"]
    assert meta[score] == {"higher_is_better": False}
    assert meta[curve] == {"higher_is_better": None, "x": CURVE_X}
    assert meta["accuracy"] == {"higher_is_better": True}
    printed = capsys.readouterr().out
    assert any(line.startswith(score) and line.endswith("(lower is better)") for line in printed.splitlines())

    # compare.py: the direction comes from the run (no table of directions knows this test)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    (b / "metrics.json").write_text(json.dumps(dict(metrics, **{score: 0.25})))
    c = compare.main([str(a), str(b), "--out", str(tmp_path / "out"), "--no-png"])
    table = next(t for t in c.tables if (t.test, t.setting, t.metric) == ("constant_score", "target", "score"))
    assert table.rows == ["rollout", "random"] and table.higher_is_better["rollout"] is False
    assert table.cell("rollout", "b").best and not table.cell("rollout", "a").best
    assert table.cell("rollout", "a").random == 0.5
    assert c.runs[0].curve_x[curve] == CURVE_X
    assert "constant_score / target class / score" in (tmp_path / "out" / "tables.md").read_text()

    # its W&B tag joins the run's tags
    _, tags = run_group_and_tags({"data": {"class_path": "datamodules.synthetic_shapes.SyntheticShapesDataModule"},
                                  "model": {"classifier": "timm:vit_tiny_patch16_224", "methods": ["rollout"]},
                                  "trainer": {"callbacks": [CALLBACK]}})
    assert tags == ["dataset:SyntheticShapes", "model:vit_tiny_patch16_224", "methods:rollout",
                    "constant_score:target"]
