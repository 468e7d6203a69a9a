"""The map gallery of a run: the maps of a fixed handful of samples, kept in the run folder as ``gallery.npz``.

The samples are the ones whose dataset index is below ``samples`` (:func:`kept`), so every run of a dataset keeps
the same samples and the dashboard can set one sample's maps side by side across runs (seeds). The file
(:func:`write_gallery` / :func:`read_gallery`, plain arrays, read without pickle):

* ``ids`` int64 ``[K]``: the dataset indices, sorted; ``labels`` / ``predicted`` int64 ``[K]``;
* images: ``image`` uint8 ``[K, H, W, 3]`` and ``grid`` int64 ``[2]`` (the model's patch grid, rows x columns);
  texts: ``words`` str ``[K, W]`` (the sample's words, padded with ``""``), ``covered`` bool ``[K, W]``;
* ``map/<method>/<setting>`` float32 ``[K, U]``: each sample's raw map over its units (the patch grid row-major;
  a text's words, a word's score the signed token score of largest magnitude, :mod:`evaluation.words`);
* ``randomised/<method>/<setting>`` float32 ``[K, S, U]`` with ``steps`` str ``[S]``: the sanity checks' maps on
  the model randomised up to each step of the top-down cascade (:mod:`callbacks.sanity`);
* a row a run never filled (a method that failed on a sample) is NaN.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Mapping, Sequence

import numpy as np

GALLERY_FILE = "gallery.npz"
#: the array names that describe the samples rather than a method's maps
SAMPLE_FIELDS = ("ids", "labels", "predicted", "image", "grid", "words", "covered", "steps")
MAP_PREFIXES = ("map/", "randomised/")


def kept(indices: Sequence[int], samples: int) -> np.ndarray:
    """``[B]`` bool: which of a batch's dataset ``indices`` the gallery keeps (index below ``samples``)."""
    return np.asarray(indices, dtype=np.int64) < int(samples)


def check_gallery(arrays: Mapping[str, np.ndarray], where: str = "gallery") -> None:
    """A ``ValueError`` naming the first array that does not fit the layout of the module docstring."""
    if "ids" not in arrays:
        raise ValueError(f"{where}: no 'ids' array (the kept samples' dataset indices)")
    k = int(np.asarray(arrays["ids"]).shape[0])
    for name, value in arrays.items():
        if name in SAMPLE_FIELDS:
            if name not in ("grid", "steps") and np.asarray(value).shape[:1] != (k,):
                raise ValueError(f"{where}: {name!r} has {np.asarray(value).shape[:1]} rows for {k} samples")
            continue
        if not name.startswith(MAP_PREFIXES) or name.count("/") != 2:
            raise ValueError(f"{where}: {name!r} is neither a sample field {SAMPLE_FIELDS} nor "
                             f"'map/<method>/<setting>' / 'randomised/<method>/<setting>'")
        shape = np.asarray(value).shape
        if shape[:1] != (k,) or (name.startswith("randomised/") and len(shape) != 3):
            raise ValueError(f"{where}: {name!r} has shape {shape} for {k} samples")
        if name.startswith("randomised/") and ("steps" not in arrays or shape[1] != len(arrays["steps"])):
            raise ValueError(f"{where}: {name!r} has {shape[1]} steps, the file names "
                             f"{len(arrays.get('steps', []))}")


def write_gallery(arrays: Mapping[str, np.ndarray], path: os.PathLike) -> Path:
    """``arrays`` (checked, :func:`check_gallery`) as ``.npz`` at ``path``, written atomically."""
    check_gallery(arrays, str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **{k: np.asarray(v) for k, v in arrays.items()})
    os.replace(tmp, path)
    return path


def read_gallery(path: os.PathLike) -> Dict[str, np.ndarray]:
    """The arrays of a gallery file (no pickle), checked; a ``ValueError`` naming the file when it is not one."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: corrupt gallery file ({err})") from None
    check_gallery(arrays, str(path))
    return arrays
