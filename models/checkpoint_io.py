"""The one way this codebase reads torch files: tensors and plain Python containers, never arbitrary objects.

``read_checkpoint(path)`` reads ``.safetensors`` files with safetensors and every other file with
``torch.load(..., weights_only=True)``: dicts, lists, tuples, strings, numbers and tensors only, so that opening
a checkpoint cannot run code. A file that can only be read by unpickling (it holds other Python objects, e.g. an
old-style file or a whole pickled model) raises :class:`PickledCheckpointError`, which names the file and the
explicit opt-in: ``allow_pickle=True`` (on the command line ``--model.allow_pickle true``). That opt-in is the only
path that calls ``torch.load(..., weights_only=False)``; use it for files you trust.

``plain(value)`` turns metadata into what ``weights_only`` loading accepts (``Path`` -> ``str``, numpy scalars ->
numbers, mappings -> ``dict``), so the files this codebase writes (classifier files, concept files) read back
without the opt-in.

Exports of ``train.py`` (Hugging Face folders of the text and CLIP modules) are written with
``cpu_float32_state_dict`` into ``fresh_export_folder``.
"""
from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path, PurePath
from typing import Any, Dict, Mapping, Union

import torch

PathLike = Union[str, os.PathLike]
OPT_IN = "allow_pickle=True (command line: --model.allow_pickle true)"


class PickledCheckpointError(RuntimeError):
    """A torch file that only unpickling (``weights_only=False``, i.e. running code from the file) can read."""


def read_checkpoint(path: PathLike, allow_pickle: bool = False, what: str = "checkpoint") -> Any:
    """The contents of the torch (or safetensors) file at ``path``, on CPU.

    ``what`` names the kind of file in error messages (e.g. ``"classifier file"``). Raises
    ``FileNotFoundError`` (missing), :class:`PickledCheckpointError` (needs unpickling and ``allow_pickle`` is
    False) or ``RuntimeError`` (corrupt or not a torch file); every message names the file.
    """
    path = Path(os.path.expanduser(str(path)))
    if not path.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except Exception as err:
            raise RuntimeError(f"{what} {str(path)!r} is corrupt or not a safetensors file: {err}") from err
    if allow_pickle:  # the explicit opt-in: trusted files only
        try:
            return torch.load(path, map_location="cpu", weights_only=False)
        except Exception as err:
            raise RuntimeError(f"{what} {str(path)!r} is corrupt or not a torch file: {err}") from err
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if not _needs_unpickling(err):
            raise RuntimeError(f"{what} {str(path)!r} is corrupt or not a torch file: {err}") from err
        raise PickledCheckpointError(
            f"{what} {str(path)!r} holds Python objects that only unpickling can read (torch.load with "
            f"weights_only=False, which can run code stored in the file): {_first_line(err)}. If you trust this "
            f"file, load it with {OPT_IN}; better, save it again as tensors and plain values (a state_dict)."
        ) from err
    except Exception as err:
        raise RuntimeError(f"{what} {str(path)!r} is corrupt or not a torch file: {err}") from err


def _needs_unpickling(err: Exception) -> bool:
    """True when ``weights_only=True`` refused a Python object (a class or function the file names), as opposed
    to bytes that are no torch file at all (torch reports those as an unsupported pickle operand)."""
    text = str(err)
    return "GLOBAL" in text or "add_safe_globals" in text or "allowlisted" in text


def _first_line(err: Exception) -> str:
    """The sentence of torch's message that names the refused object."""
    for line in str(err).splitlines():
        line = line.strip()
        for marker in ("Unsupported global: ", "Trying to load unsupported GLOBAL", "Can only create new object"):
            if marker in line:
                return line[line.index(marker):].split(". ")[0].replace("Unsupported global: ", "")
    return type(err).__name__


def plain(value: Any, where: str = "value") -> Any:
    """``value`` as plain data that ``torch.load(weights_only=True)`` reads: ``None``, ``bool``, ``int``,
    ``float``, ``str``, tensors (moved to CPU), and ``dict``/``list``/``tuple`` of these. ``Path`` becomes ``str``,
    numpy scalars and arrays become numbers and tensors; anything else raises ``TypeError`` naming ``where``."""
    if value is None:
        return None
    for kind in (bool, int, float, str):  # subclasses too (numpy.float64, IntEnum, ...): stored as the plain type
        if isinstance(value, kind):
            return kind(value) if kind is not str else str.__str__(value)
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k) if isinstance(k, PurePath) else k: plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if isinstance(value, tuple) else items
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        np = None
    if np is not None and isinstance(value, np.generic):
        return value.item()
    if np is not None and isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    raise TypeError(f"{where} is a {type(value).__name__}: files of this codebase hold plain values only "
                    "(None, bool, int, float, str, tensors, and dicts, lists and tuples of these)")


# ------------------------------------------------------------------------------------------ exports
def fresh_export_folder(folder: PathLike, marker: str, owner: str) -> Path:
    """``folder`` (``~`` expanded), created empty for an export that writes ``marker`` into it: an empty folder or
    an earlier export (it holds ``marker``) is replaced; any other existing path is refused with an error naming
    it and ``owner`` (the exporting class)."""
    folder = Path(os.path.expanduser(str(folder)))
    if folder.exists():
        if folder.is_dir() and (not any(folder.iterdir()) or (folder / marker).is_file()):
            shutil.rmtree(folder)
        else:
            raise FileExistsError(f"export path {str(folder)!r} exists and is not an earlier {owner} export (no "
                                  f"{marker}); choose another --output")
    folder.mkdir(parents=True)
    return folder


def cpu_float32_state_dict(module: Any) -> Dict[str, Any]:
    """``module.state_dict()`` detached on the CPU, floating tensors as contiguous float32 (what an export
    stores whatever the training precision and device)."""
    return {k: v.detach().float().cpu().contiguous() if v.is_floating_point() else v.detach().cpu()
            for k, v in module.state_dict().items()}
