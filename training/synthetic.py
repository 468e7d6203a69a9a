"""The synthetic benchmark's classifier: a small ViT trained on first use, then cached.

``ensure_synthetic_classifier`` returns the cached classifier file of ``configs/train/synthetic_vit.yaml`` (or of
that config with an overrides file applied), training it on first use with the same code as ``train.py``
(:func:`training.fit.fit_and_export`), in this process. ``"synthetic"`` and ``"synthetic:<overrides.yaml>"`` are
the specs of the source that :mod:`training` registers: :func:`models.sources.load_model` and
``LinearProbe(backbone_checkpoint=...)`` (:func:`models.sources.local_file`) accept them.

Cache: ``<cache>/synthetic_vit-<hash>.pt`` (:mod:`training.cached_training`, shared with ``trained:`` specs).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from training.cached_training import REPO_ROOT, PathLike, ensure_trained_classifier

SYNTHETIC_CONFIG = REPO_ROOT / "configs" / "train" / "synthetic_vit.yaml"


def ensure_synthetic_classifier(cache_dir: Optional[PathLike] = None, config: PathLike = SYNTHETIC_CONFIG,
                                extra_args: tuple = (), overrides: Optional[PathLike] = None) -> Path:
    """Path of the trained small ViT of the synthetic benchmark, training it on first use (module docstring;
    :func:`training.cached_training.ensure_trained_classifier` runs ``train.py --config <config> [--config
    <overrides>] <extra_args>``). ``overrides`` is a YAML file of ``train.py`` keys applied over ``config`` (e.g.
    ``configs/train/synthetic_vit_avgpool.yaml``).
    """
    return ensure_trained_classifier(config, overrides, extra_args=extra_args, cache_dir=cache_dir,
                                     name="synthetic_vit", suffix=".pt", what="the synthetic benchmark ViT")


def resolve_synthetic_spec(spec: str, cache_dir: Optional[PathLike] = None) -> Path:
    """The classifier file that ``"synthetic"`` (the benchmark's default ViT) or ``"synthetic:<overrides.yaml>"``
    (the default config with these ``train.py`` keys changed) names, trained and cached on first use."""
    if spec == "synthetic":
        return ensure_synthetic_classifier(cache_dir)
    if spec.startswith("synthetic:") and spec[len("synthetic:"):]:
        return ensure_synthetic_classifier(cache_dir, overrides=spec[len("synthetic:"):])
    raise ValueError(f"{spec!r} is not 'synthetic' or 'synthetic:<overrides.yaml>'")
