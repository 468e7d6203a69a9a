"""Building a timm ViT backbone: by timm name, with pretrained weights from the hub cache or a local file.

Errors for unreachable weights name the model and the ways to provide them (``backbone_checkpoint``, a populated
Hugging Face cache, or ``pretrained=False``). A ``backbone_checkpoint`` is a path or a spec of a registered source of
files (:func:`models.sources.local_file`: ``synthetic``, ``trained:<config.yaml>``). Local files are read with
:func:`models.checkpoint_io.read_checkpoint`: tensors and plain values only, unless ``allow_pickle=True``.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional

import torch
from torch import nn

from models.checkpoint_io import read_checkpoint
from models.sources import local_file

_WRAPPER_KEYS = ("state_dict", "model", "teacher", "student", "module")
_PREFIXES = ("module.", "backbone.", "model.", "_orig_mod.")


def read_state_dict(path: str, allow_pickle: bool = False) -> Dict[str, torch.Tensor]:
    """Tensors of a checkpoint file (plain state_dict, Lightning ``.ckpt``, DINO ``teacher`` dict, timm or
    safetensors file), with wrapper prefixes (``module.``, ``backbone.``, ``model.``) removed. ``allow_pickle``:
    see :func:`models.checkpoint_io.read_checkpoint` (only for trusted files that hold Python objects)."""
    path = os.path.expanduser(str(path))
    obj: Any = read_checkpoint(path, allow_pickle=allow_pickle, what="backbone checkpoint")
    for _ in range(3):
        if isinstance(obj, Mapping) and not any(isinstance(v, torch.Tensor) for v in obj.values()):
            inner = next((obj[k] for k in _WRAPPER_KEYS if k in obj and isinstance(obj[k], Mapping)), None)
            if inner is None:
                break
            obj = inner
    if not isinstance(obj, Mapping) or not any(isinstance(v, torch.Tensor) for v in obj.values()):
        found = list(obj)[:10] if isinstance(obj, Mapping) else type(obj).__name__
        raise RuntimeError(f"backbone checkpoint {path!r} holds no state_dict (keys: {found})")
    state = {}
    for key, value in obj.items():
        if not isinstance(value, torch.Tensor):
            continue
        for prefix in _PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix):]
        state[key] = value
    return state


def create_backbone(
    name: str,
    pretrained: bool = False,
    backbone_checkpoint: Optional[str] = None,
    allow_pickle: bool = False,
    **kwargs: Any,
) -> nn.Module:
    """``timm.create_model(name, num_classes=0, **kwargs)`` with weights from ``backbone_checkpoint`` (a local file
    or a spec that names one, :func:`models.sources.local_file`, preferred; read without unpickling unless
    ``allow_pickle``) or from the timm / Hugging Face hub when ``pretrained`` (fails clearly offline)."""
    import timm

    if backbone_checkpoint is not None:  # e.g. "synthetic": the cached classifier file (trained on first use)
        backbone_checkpoint = local_file(backbone_checkpoint)

    try:
        if backbone_checkpoint is None and pretrained:
            model = timm.create_model(name, pretrained=True, num_classes=0, **kwargs)
        else:
            model = timm.create_model(name, pretrained=False, num_classes=0, **kwargs)
    except RuntimeError as err:
        if "Unknown model" in str(err):
            raise ValueError(f"unknown timm model {name!r}: {err}") from None
        raise
    except Exception as err:  # hub unreachable, not cached, ...
        if backbone_checkpoint is None and pretrained:
            raise RuntimeError(
                f"could not get the pretrained weights of timm model {name!r} ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}). Without network access, provide them as a "
                f"local file: --model.backbone_checkpoint /path/to/weights.pth (a state_dict, DINO or Lightning "
                f"checkpoint), or put them in the Hugging Face cache (HF_HOME), or train from scratch with "
                f"--model.pretrained false."
            ) from err
        raise
    if backbone_checkpoint is not None:
        state = read_state_dict(backbone_checkpoint, allow_pickle=allow_pickle)
        state = {k: v for k, v in state.items() if not k.startswith(("head.", "fc.", "classifier."))}
        own = model.state_dict()
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        shape_bad = [k for k in own if k in state and state[k].shape != own[k].shape]
        if missing or shape_bad:
            raise RuntimeError(
                f"checkpoint {backbone_checkpoint!r} does not fit timm model {name!r}: "
                f"missing {missing[:8]}{'...' if len(missing) > 8 else ''}, "
                f"wrong shapes {[(k, tuple(state[k].shape), tuple(own[k].shape)) for k in shape_bad[:4]]}"
            )
        model.load_state_dict({k: state[k] for k in own}, strict=True)
        if unexpected:
            model._ta_unused_checkpoint_keys = unexpected  # kept for inspection; e.g. DINO projection heads
    return model
