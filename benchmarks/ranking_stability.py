#!/usr/bin/env python
"""How stable is the ranking "method vs random map" across training seeds of the synthetic benchmark's ViT?

    python benchmarks/ranking_stability.py --seeds 0 1 2 --out runs/ranking_stability
    python benchmarks/ranking_stability.py --classifiers a.pt b.pt --out runs/ranking_stability   # no training
    python benchmarks/ranking_stability.py --seeds 0 1 --train-set trainer.max_epochs=30 \
        --eval-set data.init_args.test_size=512 --out runs/epochs30

For every seed it trains a classifier with ``train.py`` (default config ``configs/train/synthetic_vit.yaml``,
``--seed_everything <seed>``, W&B off) and evaluates it with ``evaluate.py`` (default config
``configs/evaluate/synthetic.yaml``, W&B off); ``--classifiers`` evaluates given ``save_classifier`` files
instead. Runs already done (their ``metrics.json`` exists) are reused, so an interrupted study resumes.
It then compares every method with the ``random`` method of the same run:

* perturbation: ``positive/<setting>/auc`` (lower is better) minus random's — "below random" counts runs with a
  negative difference;
* segmentation: ``miou`` minus random's — "above random" counts runs with a positive difference.

The table (runs, count, mean, min and max of the difference) is printed and written to ``<out>/summary.json``
with every run's numbers. On 2 CPU cores one seed of the default config takes about 8 minutes (training
included); the GPU is used where ``accelerator: auto`` finds one.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from evaluation.result_keys import ResultKey

ROOT = Path(__file__).resolve().parent.parent
TRAIN_CONFIG = ROOT / "configs" / "train" / "synthetic_vit.yaml"
EVAL_CONFIG = ROOT / "configs" / "evaluate" / "synthetic.yaml"
REFERENCE = "random"


def _run(cmd: List[str], log: Path) -> None:
    print("$ " + " ".join(cmd), flush=True)
    env = dict(os.environ, WANDB_MODE=os.environ.get("WANDB_MODE", "offline"))
    with open(log, "w") as fh:
        result = subprocess.run(cmd, cwd=str(ROOT), env=env, stdout=fh, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise RuntimeError(f"command failed (exit code {result.returncode}), log: {log}")


def train(seed: int, folder: Path, train_config: Path, extra: Sequence[str]) -> Path:
    classifier = folder / "classifier.pt"
    if not classifier.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, str(ROOT / "train.py"), "--config", str(train_config), "--seed_everything", str(seed),
              "--trainer.logger", "false", "--trainer.default_root_dir", str(folder / "train"),
              "--output", str(classifier), *extra], folder / "train.log")
    return classifier


def evaluate(classifier: Path, folder: Path, eval_config: Path, extra: Sequence[str]) -> Dict[str, object]:
    metrics = folder / "metrics.json"
    if not metrics.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, str(ROOT / "evaluate.py"), "--config", str(eval_config),
              "--model.classifier", str(classifier), "--trainer.logger", "false",
              "--trainer.default_root_dir", str(folder), "--output_dir", str(folder), *extra], folder / "evaluate.log")
    return json.loads(metrics.read_text())


def _methods(metrics: Dict[str, object]) -> List[str]:
    keys = (ResultKey.try_parse(key) for key in metrics)
    return sorted({k.method for k in keys if k is not None and k.test in ("perturbation", "segmentation")})


def compare_with_random(runs: Dict[str, Dict[str, object]], setting: str = "predicted") -> Dict[str, Dict[str, dict]]:
    """Per method, the differences to the ``random`` method of the same run (see the module docstring)."""
    criteria = {  # name -> (metrics.json key of the method "{}", sign of "better than random")
        f"positive_{setting}_auc": (ResultKey("perturbation", "{}", setting, "auc", "positive").format(), -1.0),
        "miou": (ResultKey("segmentation", "{}", metric="miou").format(), 1.0),
    }
    table: Dict[str, Dict[str, dict]] = {}
    for name, metrics in runs.items():
        missing = [p.format(REFERENCE) for p, _ in criteria.values() if p.format(REFERENCE) not in metrics]
        if missing:
            raise KeyError(f"run {name!r} has no {missing}: evaluate the '{REFERENCE}' method too")
    methods = sorted(set().union(*(_methods(m) for m in runs.values())) - {REFERENCE})
    for method in methods:
        table[method] = {}
        for criterion, (pattern, sign) in criteria.items():
            diffs = {run: float(m[pattern.format(method)]) - float(m[pattern.format(REFERENCE)])
                     for run, m in runs.items() if pattern.format(method) in m}
            if not diffs:
                continue
            values = list(diffs.values())
            table[method][criterion] = dict(
                runs=len(values), better=sum(sign * v > 0 for v in values), mean=sum(values) / len(values),
                min=min(values), max=max(values), per_run=diffs)
    return table


def format_table(table: Dict[str, Dict[str, dict]]) -> str:
    lines = [f"{'method':25s} {'criterion':24s} {'better than random':>18s} {'mean diff':>10s} {'min':>8s} {'max':>8s}"]
    for method, rows in table.items():
        for criterion, r in rows.items():
            better = f"{r['better']}/{r['runs']}"
            lines.append(f"{method:25s} {criterion:24s} {better:>18s} {r['mean']:>+10.3f} {r['min']:>+8.3f} "
                         f"{r['max']:>+8.3f}")
    return "\n".join(lines)


def overrides(pairs: Sequence[str]) -> List[str]:
    """``["a.b=1", "c=x"]`` -> ``["--a.b", "1", "--c", "x"]`` (LightningCLI overrides)."""
    out: List[str] = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"override {pair!r} is not KEY=VALUE")
        out += [f"--{key.lstrip('-')}", value]
    return out


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--seeds", type=int, nargs="+", help="train one classifier per seed")
    group.add_argument("--classifiers", type=Path, nargs="+", help="evaluate these classifier files")
    p.add_argument("--out", type=Path, required=True, help="folder of the runs and summary.json")
    p.add_argument("--train-config", type=Path, default=TRAIN_CONFIG)
    p.add_argument("--eval-config", type=Path, default=EVAL_CONFIG)
    p.add_argument("--train-set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="train.py overrides, e.g. trainer.max_epochs=30 (passed as --trainer.max_epochs 30)")
    p.add_argument("--eval-set", nargs="+", default=[], metavar="KEY=VALUE", help="evaluate.py overrides, likewise")
    p.add_argument("--setting", default="predicted", choices=("predicted", "target"))
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    args = parse_args(argv)
    # the subprocesses run in the repository root: paths are taken relative to the caller's folder first
    args.out = args.out.resolve()
    args.train_config, args.eval_config = args.train_config.resolve(), args.eval_config.resolve()
    for path in (args.train_config, args.eval_config):
        if not path.is_file():
            raise SystemExit(f"config file not found: {path}")
    runs: Dict[str, Dict[str, object]] = {}
    if args.seeds is not None:
        for seed in args.seeds:
            folder = args.out / f"seed{seed}"
            classifier = train(seed, folder, args.train_config, overrides(args.train_set))
            runs[f"seed{seed}"] = evaluate(classifier, folder / "evaluate", args.eval_config, overrides(args.eval_set))
    else:
        for i, classifier in enumerate(args.classifiers):
            if not classifier.is_file():
                raise SystemExit(f"classifier file not found: {classifier}")
            classifier = classifier.resolve()
            name = f"{i}-{classifier.stem}"
            runs[name] = evaluate(classifier, args.out / name, args.eval_config, overrides(args.eval_set))
    table = compare_with_random(runs, args.setting)
    print(format_table(table))
    summary = {"runs": runs, "compare_with_random": table, "args": {k: str(v) for k, v in vars(args).items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"summary written to {args.out / 'summary.json'}")
    return summary


if __name__ == "__main__":
    main()
