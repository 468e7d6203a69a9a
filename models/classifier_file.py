"""The classifier file: a trained classifier stored as a stock timm ``VisionTransformer``.

File format (``torch.save`` of a dict of plain values and tensors, ``format == "token_attributions.classifier/v1"``,
readable with ``torch.load(weights_only=True)``): ``kwargs`` (the ``VisionTransformer`` constructor arguments, read
off the model's own modules and checked by rebuilding it), ``state_dict``, ``pretrained_cfg`` (``mean``, ``std``,
``input_size``, ...), ``architecture`` (the timm name when known) and free ``metadata`` (e.g. validation metrics;
plain values only, see :func:`models.checkpoint_io.plain`).

``load_classifier`` rebuilds the model, loads the weights strictly, sets ``model.pretrained_cfg`` so that
``timm.data.resolve_data_config({}, model=model)`` gives the saved normalisation, and returns it in eval mode.
Files are read with :func:`models.checkpoint_io.read_checkpoint` (no unpickling unless ``allow_pickle=True``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Union

import torch
from torch import nn

from models.checkpoint_io import plain, read_checkpoint

FORMAT = "token_attributions.classifier/v1"
PathLike = Union[str, os.PathLike]


# ------------------------------------------------------------------------------------------ kwargs
def _act_name(module: nn.Module) -> str:
    from timm.layers.activations import QuickGELU

    if isinstance(module, nn.GELU):
        return "gelu_tanh" if module.approximate == "tanh" else "gelu"
    if isinstance(module, QuickGELU):
        return "quick_gelu"
    raise ValueError(f"unsupported MLP activation {type(module).__name__}")


def vit_constructor_kwargs(model: nn.Module) -> Dict[str, Any]:
    """``VisionTransformer`` keyword arguments that rebuild ``model``'s architecture (not its weights).

    Covers the stock layout (LayerNorm eps 1e-6, ``Attention``/``Mlp`` blocks, learned positional embedding);
    :func:`save_classifier` verifies the result by rebuilding and comparing outputs.
    """
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(model, VisionTransformer):
        raise TypeError(f"expected a timm VisionTransformer, got {type(model).__name__}")
    block = model.blocks[0]
    attn, mlp = block.attn, block.mlp
    pe = model.patch_embed
    norm = model.norm if not isinstance(model.norm, nn.Identity) else model.fc_norm
    if isinstance(norm, nn.LayerNorm) and abs(norm.eps - 1e-6) > 1e-12:
        raise ValueError(f"unsupported LayerNorm eps {norm.eps} (stock timm ViTs use 1e-6)")
    return dict(
        img_size=tuple(int(s) for s in pe.img_size),
        patch_size=tuple(int(s) for s in pe.patch_size),
        in_chans=int(pe.proj.in_channels),
        num_classes=int(model.num_classes),
        global_pool=str(model.global_pool),
        embed_dim=int(model.embed_dim),
        depth=len(model.blocks),
        num_heads=int(attn.num_heads),
        mlp_ratio=float(mlp.fc1.out_features) / float(model.embed_dim),
        qkv_bias=getattr(attn.qkv, "bias", None) is not None if hasattr(attn, "qkv") else True,
        qk_norm=not isinstance(getattr(attn, "q_norm", nn.Identity()), nn.Identity),
        init_values=(float(block.ls1.gamma.flatten()[0]) if hasattr(block.ls1, "gamma") else None),
        class_token=model.cls_token is not None,
        no_embed_class=bool(model.no_embed_class),
        reg_tokens=int(getattr(model, "num_reg_tokens", 0)),
        pre_norm=not isinstance(model.norm_pre, nn.Identity),
        final_norm=not (isinstance(model.norm, nn.Identity) and isinstance(model.fc_norm, nn.Identity)),
        fc_norm=not isinstance(model.fc_norm, nn.Identity),
        dynamic_img_size=bool(getattr(model, "dynamic_img_size", False)),
        act_layer=_act_name(mlp.act),
    )


def _rebuild(kwargs: Dict[str, Any], state_dict: Dict[str, torch.Tensor]) -> nn.Module:
    """The model that ``kwargs`` build with the weights ``state_dict``; built on the ``meta`` device first (no
    memory), so that kwargs whose shapes differ from the weights' (e.g. a huge ``embed_dim``) fail before any
    memory is allocated for them."""
    from timm.models.vision_transformer import VisionTransformer

    blocks = len({key.split(".")[1] for key in state_dict if key.startswith("blocks.")})
    if kwargs.get("depth", 12) != blocks:   # checked first: each block is a module, even on the meta device
        raise ValueError(f"the weights hold {blocks} blocks, its kwargs ask for depth {kwargs.get('depth', 12)}")
    with torch.device("meta"):
        expected = {key: tuple(value.shape) for key, value in VisionTransformer(**kwargs).state_dict().items()}
    given = {key: tuple(value.shape) for key, value in state_dict.items()}
    wrong = [f"{key}: {given.get(key, 'missing')} in the weights, {shape} from the kwargs"
             for key, shape in expected.items() if given.get(key) != shape]
    wrong += [f"{key}: unexpected in the weights" for key in given if key not in expected]
    if wrong:
        raise ValueError(f"the weights do not fit the model its kwargs {kwargs} build ({len(wrong)} tensors; "
                         f"{'; '.join(wrong[:3])})")
    model = VisionTransformer(**kwargs)
    model.load_state_dict(state_dict, strict=True)
    return model.eval()


def _normalisation(model: nn.Module) -> Dict[str, Any]:
    cfg = dict(getattr(model, "pretrained_cfg", None) or {})
    if "mean" not in cfg or "std" not in cfg:
        raise ValueError(
            "the model has no normalisation in model.pretrained_cfg (mean/std); set it before saving, e.g. "
            "model.pretrained_cfg = {**model.pretrained_cfg, 'mean': (...), 'std': (...)}"
        )
    size = model.patch_embed.img_size
    cfg.setdefault("input_size", (3, int(size[0]), int(size[1])))
    keep = {}
    for key, value in cfg.items():  # plain python values only (picklable without timm internals)
        if isinstance(value, (str, int, float, bool, type(None))):
            keep[key] = value
        elif isinstance(value, (tuple, list)) and all(isinstance(v, (str, int, float, bool)) for v in value):
            keep[key] = tuple(value)
    keep["mean"], keep["std"] = tuple(float(v) for v in cfg["mean"]), tuple(float(v) for v in cfg["std"])
    keep["input_size"] = tuple(int(v) for v in cfg["input_size"])
    return keep


# ------------------------------------------------------------------------------------------ API
def save_classifier(model: nn.Module, path: PathLike, **metadata: Any) -> Path:
    """Store a timm ``VisionTransformer`` classifier (constructor kwargs, weights, normalisation, ``metadata``)
    at ``path`` (written atomically). Raises if the model cannot be rebuilt exactly from stock kwargs, or if
    ``metadata`` holds values other than plain data (``Path`` and numpy scalars are converted)."""
    metadata = plain(dict(metadata), "metadata")
    kwargs = vit_constructor_kwargs(model)
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    cfg = _normalisation(model)
    # verify: the rebuilt model computes the same logits
    try:
        rebuilt = _rebuild(kwargs, state)
    except Exception as err:
        raise ValueError(f"cannot rebuild this model from stock VisionTransformer kwargs {kwargs}: {err}") from err
    h, w = kwargs["img_size"]
    x = torch.randn(2, kwargs["in_chans"], h, w, generator=torch.Generator().manual_seed(0))
    was_training = model.training
    param = next(model.parameters())
    with torch.no_grad():
        model.eval()
        ref = model(x.to(param.device, param.dtype)).float().cpu()
        model.train(was_training)
        out = rebuilt.to(param.dtype)(x.to(param.dtype)).float()
    if not torch.allclose(ref, out, rtol=1e-4, atol=1e-4 * max(1.0, ref.abs().max().item())):
        raise ValueError(
            f"the model is not a stock timm VisionTransformer that its kwargs {kwargs} rebuild "
            f"(max logit difference {float((ref - out).abs().max()):.3g})"
        )
    path = Path(os.path.expanduser(str(path)))
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "architecture": cfg.get("architecture"),
        "kwargs": kwargs,
        "state_dict": state,
        "pretrained_cfg": cfg,
        "metadata": metadata,
    }
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


def read_classifier_file(path: PathLike, allow_pickle: bool = False) -> Dict[str, Any]:
    """The raw payload of a classifier file, validated; errors name the file. ``allow_pickle``: see
    :func:`models.checkpoint_io.read_checkpoint` (files written by :func:`save_classifier` never need it)."""
    path = Path(os.path.expanduser(str(path)))
    payload = read_checkpoint(path, allow_pickle=allow_pickle, what="classifier file")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise RuntimeError(
            f"classifier file {str(path)!r} is not a {FORMAT} file (written by save_classifier); "
            f"got {type(payload).__name__} with keys {sorted(payload)[:8] if isinstance(payload, dict) else '-'}"
        )
    missing = [k for k in ("kwargs", "state_dict", "pretrained_cfg") if k not in payload]
    if missing:
        raise RuntimeError(f"classifier file {str(path)!r} lacks {missing}")
    kinds = {"kwargs": dict, "state_dict": dict, "pretrained_cfg": dict}
    wrong = [f"{key} is a {type(payload[key]).__name__}" for key, kind in kinds.items()
             if not isinstance(payload[key], kind)]
    wrong += [f"state_dict[{key!r}] is a {type(value).__name__}" for key, value in payload["state_dict"].items()
              if not isinstance(value, torch.Tensor)][:3] if isinstance(payload["state_dict"], dict) else []
    if wrong:
        raise RuntimeError(f"classifier file {str(path)!r}: {'; '.join(wrong)} (expected dicts, tensors as weights)")
    return payload


def load_classifier(path: PathLike, allow_pickle: bool = False) -> nn.Module:
    """The stock timm ``VisionTransformer`` saved at ``path``, in eval mode, on CPU, with ``pretrained_cfg``
    mean/std/input_size set (``timm.data.resolve_data_config({}, model=model)`` returns them)."""
    payload = read_classifier_file(path, allow_pickle=allow_pickle)
    try:
        model = _rebuild(payload["kwargs"], payload["state_dict"])
    except Exception as err:
        raise RuntimeError(f"classifier file {str(path)!r} does not rebuild: {err}") from err
    cfg = dict(payload["pretrained_cfg"])
    model.pretrained_cfg = cfg
    model.default_cfg = cfg  # older timm name of the same dict
    model.classifier_metadata = dict(payload.get("metadata", {}))
    return model.eval()
