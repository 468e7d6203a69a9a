"""``python compare.py sweep``: rerun one evaluation config over seeds into sibling run folders, then compare them.

    python compare.py sweep CONFIG --seeds 0 1 2 [--out DIR] [--no-png] [-- EVALUATE ARGS ...]

For each seed ``s`` the sweep writes ``DIR/seed<s>/sweep.yaml``: the config with its ``base:`` paths made absolute,
``seed_everything: s`` and, on every callback whose class takes them, the tie seed (``tie_seed``: the random order
among equal scores) and the noise stream (``seed``: e.g. ROAD's imputation noise, the sanity checks' randomiser)
set to ``s``; the data (its own ``data.init_args.seed``: which samples are drawn) stays as configured, so the runs
differ only in seeds. It runs ``evaluate.py --config DIR/seed<s>/sweep.yaml --output_dir DIR/seed<s>`` (plus the
arguments after ``--``), one after the other, skipping a seed whose folder already holds ``metrics.json``, then
``compare.py`` over the folders into ``DIR/compare`` (the stability table is ``DIR/compare/meta.md``).
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml

#: the init arguments of a callback that a sweep sets to the seed: the tie order and the noise stream
SEED_ARGUMENTS = ("tie_seed", "seed")
ROOT = Path(__file__).resolve().parent.parent


def _takes(class_path: str) -> List[str]:
    """The :data:`SEED_ARGUMENTS` that the callback class ``class_path`` accepts (none when it cannot be found)."""
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return []
    parameters = set()
    for klass in inspect.getmro(cls):   # a subclass passes **kwargs on to its base's __init__
        if "__init__" in vars(klass):
            parameters |= set(inspect.signature(klass.__init__).parameters)
    return [p for p in SEED_ARGUMENTS if p in parameters]


def seeded_config(path: os.PathLike, seed: int) -> Dict[str, Any]:
    """The config at ``path`` for ``seed`` (module docstring)."""
    path = Path(path).resolve()
    config = yaml.safe_load(path.read_text())
    if not isinstance(config, dict):
        raise ValueError(f"{path}: not a config (expected a mapping of keys)")
    base = config.get("base")
    if base is not None:
        names = [base] if isinstance(base, str) else list(base)
        config["base"] = [str((path.parent / os.path.expanduser(n)).resolve()) for n in names]
    config["seed_everything"] = int(seed)
    callbacks = (config.get("trainer") or {}).get("callbacks")
    for item in callbacks if isinstance(callbacks, list) else []:
        if isinstance(item, dict) and "class_path" in item:
            args = item.setdefault("init_args", {}) or {}
            item["init_args"] = args
            for name in _takes(str(item["class_path"])):
                args[name] = int(seed)
    return config


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compare.py sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="an evaluate.py config file")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="the seeds (default 0 1 2)")
    p.add_argument("--out", default=None, help="the sweep folder (default outputs/sweep/<config name>)")
    p.add_argument("--no-png", action="store_true", help="skip the comparison's matplotlib PNGs")
    return p


def sweep(args: Sequence[str]) -> List[Path]:
    """Run the sweep (module docstring); the run folders, in seed order."""
    args = list(args)
    extra = args[args.index("--") + 1:] if "--" in args else []
    ns = parser().parse_args(args[: args.index("--")] if "--" in args else args)
    config = Path(ns.config)
    if not config.is_file():
        raise SystemExit(f"error: {config}: no such config file")
    if len(set(ns.seeds)) != len(ns.seeds):
        raise SystemExit(f"error: --seeds must differ, got {ns.seeds}")
    out = Path(ns.out) if ns.out else Path("outputs") / "sweep" / config.stem
    folders = []
    for seed in ns.seeds:
        folder = out / f"seed{seed}"
        folders.append(folder)
        if (folder / "metrics.json").is_file():
            print(f"seed {seed}: {folder / 'metrics.json'} exists, kept")
            continue
        folder.mkdir(parents=True, exist_ok=True)
        seeded = folder / "sweep.yaml"
        seeded.write_text(yaml.safe_dump(seeded_config(config, seed), sort_keys=False))
        command = [sys.executable, str(ROOT / "evaluate.py"), "--config", str(seeded), "--output_dir", str(folder),
                   *extra]
        print(f"seed {seed}: {' '.join(command)}", flush=True)
        result = subprocess.run(command, cwd=str(ROOT))
        if result.returncode != 0:
            raise SystemExit(f"error: the evaluation of seed {seed} failed (exit {result.returncode}); its folder: "
                             f"{folder}")
    return folders


def compare_args(folders: Sequence[Path], out: Path, no_png: bool, title: Optional[str] = None) -> List[str]:
    """``compare.py`` arguments over the sweep's run folders."""
    return ([str(f) for f in folders] + ["--out", str(out / "compare"), "--title", title or f"seed sweep {out.name}"]
            + (["--no-png"] if no_png else []))
