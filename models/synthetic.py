"""The synthetic benchmark's classifier: a small ViT trained on first use, then cached.

``ensure_synthetic_classifier`` returns the cached classifier file of ``configs/train/synthetic_vit.yaml`` (or of
that config with an overrides file applied), training it on first use with the same code as ``train.py``
(:func:`models.training.fit_and_export`), in this process. ``"synthetic"`` and ``"synthetic:<overrides.yaml>"``
are the specs that :func:`models.loading.load_model` and ``LinearProbe(backbone_checkpoint=...)`` accept.

Cache: ``<cache>/synthetic_vit-<hash>.pt``, where ``<cache>`` is ``$TOKEN_ATTRIBUTIONS_CACHE`` (default
``~/.cache/token_attributions``) and the hash is taken over the *contents* of every config file involved (the
config, the overrides file, and the files they build on with ``base:``) and the caller's extra arguments: the
same model from any checkout, a new one when a file changes.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import random
import sys
import warnings
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Union

PathLike = Union[str, os.PathLike]

CACHE_ENV = "TOKEN_ATTRIBUTIONS_CACHE"
DEFAULT_CACHE = "~/.cache/token_attributions"
REPO_ROOT = Path(__file__).resolve().parent.parent
SYNTHETIC_CONFIG = REPO_ROOT / "configs" / "train" / "synthetic_vit.yaml"

#: environment of a distributed (DDP / torchelastic) process; cleared while the cache trains its model, so that
#: the training is one plain process even when the caller is one rank of several
_DIST_ENV = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
             "MASTER_PORT", "PL_GLOBAL_SEED", "PL_SEED_WORKERS", "PL_TRAINER_GPUS", "TORCHELASTIC_RUN_ID")
#: appended last to the training arguments: one process on one device, whatever the config or caller says
_SINGLE_PROCESS = ("--trainer.devices", "1", "--trainer.num_nodes", "1", "--trainer.strategy", "auto")


def resolve_cache_dir(path: Optional[PathLike] = None) -> Path:
    """``path``, else ``$TOKEN_ATTRIBUTIONS_CACHE``, else ``~/.cache/token_attributions``."""
    return Path(os.path.expanduser(str(path or os.environ.get(CACHE_ENV) or DEFAULT_CACHE)))


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _config_file(path: PathLike) -> Path:
    """``path`` as given if it exists, else relative to the repository (configs are named from the repo root)."""
    path = Path(os.path.expanduser(str(path)))
    if not path.is_file() and not path.is_absolute() and (REPO_ROOT / path).is_file():
        path = REPO_ROOT / path
    if not path.is_file():
        raise FileNotFoundError(f"training config {str(path)!r} not found (needed to train the synthetic ViT)")
    return path.resolve()


def cache_key(config: PathLike, overrides: Optional[PathLike] = None, extra_args: Sequence[str] = ()) -> str:
    """The hash that names a cached synthetic classifier: sha256 (first 10 hex digits) of the contents of the
    config files in the order they apply (``config``'s, then ``overrides``' own ``base:`` files and itself)
    followed by the space-joined ``extra_args``."""
    from cli.config import config_files

    files: List[Path] = list(config_files(_config_file(config)))
    if overrides is not None:
        files += config_files(_config_file(overrides))
    content = b"".join(f.read_bytes() for f in files)  # contents, not paths: the same model from any checkout
    return hashlib.sha256(content + " ".join(extra_args).encode()).hexdigest()[:10]


def ensure_synthetic_classifier(cache_dir: Optional[PathLike] = None, config: PathLike = SYNTHETIC_CONFIG,
                                extra_args: tuple = (), overrides: Optional[PathLike] = None) -> Path:
    """Path of the trained small ViT of the synthetic benchmark, training it on first use.

    The file is ``<cache>/synthetic_vit-<hash>.pt`` (:func:`cache_key`: a changed config, overrides file, base
    file or extra argument trains a new model). Training runs ``train.py``'s code in this process with the
    arguments ``--config <config> [--config <overrides>] <extra_args>``, one process on one device (see
    :func:`train_in_process`), W&B offline unless ``WANDB_MODE`` says otherwise, under a file lock so that
    concurrent callers (e.g. DDP ranks) train once. ``overrides`` is a YAML file of ``train.py`` keys applied
    over ``config`` (e.g. ``configs/train/synthetic_vit_avgpool.yaml``).
    """
    config = _config_file(config)
    overrides = _config_file(overrides) if overrides is not None else None
    digest = cache_key(config, overrides, extra_args)
    root = resolve_cache_dir(cache_dir)
    target = root / f"synthetic_vit-{digest}.pt"
    with _file_lock(root / f".synthetic_vit-{digest}.lock"):
        if target.is_file():
            from models.classifier_file import read_classifier_file

            try:
                read_classifier_file(target)
                return target
            except RuntimeError:
                target.unlink()  # corrupt cache entry: train again
        args = ["--config", str(config), *(["--config", str(overrides)] if overrides is not None else []),
                *extra_args, "--output", str(target),
                "--trainer.default_root_dir", str(root / "runs" / f"synthetic_vit-{digest}")]
        print(f"[token_attributions] training the synthetic benchmark ViT (first use): train.py {' '.join(args)}",
              flush=True)
        train_in_process(args)
        if not target.is_file():
            raise RuntimeError("training the synthetic ViT wrote no classifier file; train.py arguments: "
                               + " ".join(args))
    return target


def train_in_process(args: Sequence[str]) -> Optional[Path]:
    """Run ``train.py`` with ``args`` in this process, as one plain process on one device, and return the
    exported classifier file.

    Safe to call from inside a running program, including one DDP rank: the distributed environment variables
    are cleared, Lightning's rank-zero flag is set to this process and the trainer is forced to one device while
    it trains; afterwards they, ``sys.argv``, the random number generators (Python, numpy, torch, CUDA) and a W&B
    run it started are restored or closed, so the caller continues as if training had run in a subprocess.
    Command-line errors (which jsonargparse reports by exiting) raise ``RuntimeError``; other errors propagate.
    """
    from cli import TrainCLI, check_data_paths
    from models.training import fit_and_export

    args = [*args, *_SINGLE_PROCESS]
    with _as_a_separate_process():
        try:
            cli = TrainCLI(args)
            check_data_paths(cli.datamodule)
            return fit_and_export(cli.trainer, cli.model, cli.datamodule, output=cli.config.get("output"),
                                  concepts=cli.config.get("concepts"))
        except SystemExit as err:  # argument errors: jsonargparse prints them and exits
            if err.code in (0, None):
                return None
            raise RuntimeError(f"training failed (exit code {err.code}); train.py arguments: {' '.join(args)}") from err


@contextlib.contextmanager
def _as_a_separate_process() -> Iterator[None]:
    """Process-wide state that a subprocess would not have shared with its parent, saved and restored."""
    import numpy as np
    import torch
    from lightning_utilities.core.rank_zero import rank_zero_only

    env = {k: os.environ.get(k) for k in (*_DIST_ENV, "WANDB_MODE")}
    argv = list(sys.argv)
    rank = getattr(rank_zero_only, "rank", 0)
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
           torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None)
    cudnn_benchmark = torch.backends.cudnn.benchmark
    wandb = sys.modules.get("wandb")
    run_before = getattr(wandb, "run", None) if wandb is not None else None
    for key in _DIST_ENV:
        os.environ.pop(key, None)
    os.environ.setdefault("WANDB_MODE", "offline")
    sys.argv[1:] = []  # the training arguments are explicit, not the caller's command line
    rank_zero_only.rank = 0
    try:
        with warnings.catch_warnings():
            yield
    finally:
        wandb = sys.modules.get("wandb")
        if wandb is not None and getattr(wandb, "run", None) is not None and wandb.run is not run_before:
            wandb.finish()  # else the caller's WandbLogger would log into the training's run
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        sys.argv[:] = argv
        rank_zero_only.rank = rank
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
        if rng[3] is not None:
            torch.cuda.set_rng_state_all(rng[3])
        torch.backends.cudnn.benchmark = cudnn_benchmark


def resolve_synthetic_spec(spec: str, cache_dir: Optional[PathLike] = None) -> Path:
    """The classifier file that ``"synthetic"`` (the benchmark's default ViT) or ``"synthetic:<overrides.yaml>"``
    (the default config with these ``train.py`` keys changed) names, trained and cached on first use."""
    if spec == "synthetic":
        return ensure_synthetic_classifier(cache_dir)
    if spec.startswith("synthetic:") and spec[len("synthetic:"):]:
        return ensure_synthetic_classifier(cache_dir, overrides=spec[len("synthetic:"):])
    raise ValueError(f"{spec!r} is not 'synthetic' or 'synthetic:<overrides.yaml>'")


def is_synthetic_spec(spec: Optional[str]) -> bool:
    return isinstance(spec, str) and (spec == "synthetic" or spec.startswith("synthetic:"))
