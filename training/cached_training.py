"""Classifiers trained on first use, in this process, with ``train.py``'s code, then cached.

``ensure_trained_classifier(config, overrides, extra_args)`` returns what ``train.py --config <config> [--config
<overrides> ...] <extra_args>`` exports (:func:`training.fit.fit_and_export`): a Hugging Face folder
(``save_pretrained``: text classifiers) or a timm classifier file (``save_classifier``: image probes and ViTs),
training it the first time it is asked for. :mod:`training.synthetic` (the synthetic benchmark's ViT) and the
``trained:<config.yaml>`` source of :func:`models.sources.load_model` (registered by :mod:`training`) are built
on it.

Spec: ``"trained:<config.yaml>"``, or ``"trained:<config.yaml>+<overrides.yaml>[+...]"`` for ``train.py`` keys
changed by further files (applied in order, e.g. a data path: ``data: {init_args: {path: /data/movies.tar.gz}}``).
Config paths are tried as given (relative to the current directory), then relative to the repository; relative
paths *inside* a config (e.g. a data path) are read by ``train.py`` relative to the current directory.

Cache: entries ``<cache>/<config stem>-<hash>`` under :func:`models.sources.resolve_cache_dir`, one per hash of
the *contents* of every config file involved and the extra arguments (:func:`cache_key`): the same model from any
checkout, a new one when a file changes. Data files are not hashed: a changed dataset at the same path needs the
cache entry removed (or ``$TOKEN_ATTRIBUTIONS_CACHE`` changed). Concurrent callers (e.g. DDP ranks) train once
(:func:`ensure_trained_classifier`).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import random
import shutil
import sys
import warnings
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Union

import numpy as np
import torch
from lightning_utilities.core.rank_zero import rank_zero_only

from cli import TrainCLI, check_data_paths, config_files
from models.classifier_file import read_classifier_file
from models.sources import cache_lock, resolve_cache_dir
from training import fit

PathLike = Union[str, os.PathLike]

REPO_ROOT = Path(__file__).resolve().parent.parent
TRAINED_PREFIX = "trained:"

#: environment of a distributed (DDP / torchelastic) process; cleared while the cache trains its model, so that
#: the training is one plain process even when the caller is one rank of several
_DIST_ENV = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
             "MASTER_PORT", "PL_GLOBAL_SEED", "PL_SEED_WORKERS", "PL_TRAINER_GPUS", "TORCHELASTIC_RUN_ID")
#: appended last to the training arguments: one process on one device, whatever the config or caller says
_SINGLE_PROCESS = ("--trainer.devices", "1", "--trainer.num_nodes", "1", "--trainer.strategy", "auto")


def config_file(path: PathLike) -> Path:
    """``path`` as given if it exists, else relative to the repository (configs are named from the repo root)."""
    path = Path(os.path.expanduser(str(path)))
    if not path.is_file() and not path.is_absolute() and (REPO_ROOT / path).is_file():
        path = REPO_ROOT / path
    if not path.is_file():
        raise FileNotFoundError(f"training config {str(path)!r} not found (needed to train the classifier on first "
                                f"use; a path relative to the current directory or to {str(REPO_ROOT)!r})")
    return path.resolve()


def _as_list(overrides: Union[None, PathLike, Sequence[PathLike]]) -> List[PathLike]:
    if overrides is None:
        return []
    if isinstance(overrides, (str, os.PathLike)):
        return [overrides]
    return list(overrides)


def cache_key(config: PathLike, overrides: Union[None, PathLike, Sequence[PathLike]] = None,
              extra_args: Sequence[str] = ()) -> str:
    """The hash that names a cached classifier: sha256 (first 10 hex digits) of the contents of the config files
    in the order they apply (``config``'s ``base:`` files and itself, then each overrides file's ``base:`` files
    and itself) followed by the space-joined ``extra_args``."""
    files: List[Path] = []
    for path in [config, *_as_list(overrides)]:
        files += config_files(config_file(path))
    content = b"".join(f.read_bytes() for f in files)  # contents, not paths: the same model from any checkout
    return hashlib.sha256(content + " ".join(extra_args).encode()).hexdigest()[:10]


def _is_complete(path: Path) -> bool:
    """Whether a cache entry is a whole export: a Hugging Face folder with its config and weights, or a
    classifier file that reads back."""
    if path.is_dir():
        weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
        return (path / "config.json").is_file() and any((path / name).is_file() for name in weights)
    if path.is_file():
        try:
            read_classifier_file(path)
            return True
        except RuntimeError:
            return False
    return False


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def ensure_trained_classifier(config: PathLike, overrides: Union[None, PathLike, Sequence[PathLike]] = None,
                              extra_args: Sequence[str] = (), cache_dir: Optional[PathLike] = None,
                              name: Optional[str] = None, suffix: str = "", what: Optional[str] = None) -> Path:
    """Path of the classifier that ``train.py`` exports with ``config`` (then ``overrides``, then ``extra_args``),
    training it on first use.

    The entry is ``<cache>/<name>-<hash><suffix>`` (``name`` defaults to the config's stem; :func:`cache_key`:
    a changed config, overrides file, base file or extra argument trains a new model): a folder for a Hugging
    Face export, a file for a timm classifier. Training runs ``train.py``'s code in this process with the
    arguments ``--config <config> [--config <overrides> ...] <extra_args> --output <temporary name>``, one process
    on one device (:func:`train_in_process`), W&B offline unless ``WANDB_MODE`` says otherwise, its run folder
    under ``<cache>/runs/<name>-<hash>``, under a file lock so that concurrent callers train once; the export is
    then renamed into place. An incomplete entry (an interrupted copy by hand, a corrupt file) is trained again.
    ``what`` names the model in the messages.
    """
    config = config_file(config)
    overrides = [config_file(path) for path in _as_list(overrides)]
    digest = cache_key(config, overrides, extra_args)
    entry = f"{name or config.stem}-{digest}"
    what = what or f"the classifier of {config.name}"
    root = resolve_cache_dir(cache_dir)
    target = root / f"{entry}{suffix}"
    with cache_lock(root / f".{entry}.lock"):
        if _is_complete(target):
            return target
        _remove(target)
        partial = root / f".{entry}.partial{suffix}"
        _remove(partial)
        args = ["--config", str(config), *[a for path in overrides for a in ("--config", str(path))],
                *extra_args, "--output", str(partial), "--trainer.default_root_dir", str(root / "runs" / entry)]
        print(f"[token_attributions] training {what} (first use): train.py {' '.join(args)}", flush=True)
        exported = train_in_process(args)
        if exported is None or Path(exported).resolve() != partial.resolve() or not _is_complete(partial):
            raise RuntimeError(f"training {what} exported nothing at {str(partial)!r} (got {exported}); train.py "
                               "arguments: " + " ".join(args))
        os.replace(partial, target)
    return target


def train_in_process(args: Sequence[str]) -> Optional[Path]:
    """Run ``train.py`` with ``args`` in this process, as one plain process on one device, and return what it
    exported (a classifier file or a Hugging Face folder).

    Safe to call from inside a running program, including one DDP rank: the distributed environment variables
    are cleared, Lightning's rank-zero flag is set to this process and the trainer is forced to one device while
    it trains; afterwards they, ``sys.argv``, the random number generators (Python, numpy, torch, CUDA) and a W&B
    run it started are restored or closed, so the caller continues as if training had run in a subprocess.
    Command-line errors (which jsonargparse reports by exiting) raise ``RuntimeError``; other errors propagate.
    """
    args = [*args, *_SINGLE_PROCESS]
    with _as_a_separate_process():
        try:
            cli = TrainCLI(args)
            check_data_paths(cli.datamodule)
            return fit.fit_and_export(cli.trainer, cli.model, cli.datamodule, output=cli.config.get("output"),
                                  concepts=cli.config.get("concepts"), test=cli.config.get("test", False))
        except SystemExit as err:  # argument errors: jsonargparse prints them and exits
            if err.code in (0, None):
                return None
            detail = err.code if isinstance(err.code, str) else f"exit code {err.code}"
            raise RuntimeError(f"training failed ({detail}); train.py arguments: {' '.join(args)}") from err


@contextlib.contextmanager
def _as_a_separate_process() -> Iterator[None]:
    """Process-wide state that a subprocess would not have shared with its parent, saved and restored."""
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


# ------------------------------------------------------------------------------------------ trained:<config>
def parse_trained_spec(spec: str) -> List[str]:
    """The config files of ``trained:<config.yaml>[+<overrides.yaml>...]``, in the order they apply. A whole
    path that names an existing file is one config even if it contains ``+``."""
    if not spec.startswith(TRAINED_PREFIX) or not spec[len(TRAINED_PREFIX):]:
        raise ValueError(f"{spec!r} is not 'trained:<config.yaml>' or 'trained:<config.yaml>+<overrides.yaml>'")
    body = spec[len(TRAINED_PREFIX):]
    whole = Path(os.path.expanduser(body))
    if whole.is_file() or (not whole.is_absolute() and (REPO_ROOT / whole).is_file()):
        return [body]
    parts = body.split("+")
    if not all(parts):
        raise ValueError(f"{spec!r}: empty config name between '+' (expected trained:<config.yaml>+<overrides.yaml>)")
    return parts


def resolve_trained_spec(spec: str, cache_dir: Optional[PathLike] = None) -> Path:
    """The export (Hugging Face folder or classifier file) that ``trained:<config.yaml>[+<overrides.yaml>...]``
    names, trained and cached on first use (:func:`ensure_trained_classifier`)."""
    config, *overrides = parse_trained_spec(spec)
    return ensure_trained_classifier(config, overrides, cache_dir=cache_dir, what=f"'{spec}'")
