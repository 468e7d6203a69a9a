"""open_clip's ``CLIP`` (``open_clip.model.CLIP``: its own ``VisionTransformer`` and text transformer) behind the
wrappers of :mod:`models.clip`, and what its ``open_clip:`` model source reads.

:class:`models.clip.ZeroShotClassifier` and :class:`models.clip.PromptScorer` take an open_clip ``CLIP`` as they
take a ``transformers.CLIPModel``; the few places where the two libraries differ ask here:

* embeddings: ``clip.encode_image(pixels)`` / ``clip.encode_text(ids)`` (projected, unnormalised);
* the joint width: the text projection's output width;
* the score: ``logit_scale.exp() * cos`` plus ``logit_bias`` when the model has one (SigLIP-style training);
* tokenizers: open_clip's, called as ``tokenizer(texts) -> LongTensor [T, context_length]`` (padded with 0, no
  attention mask; :func:`token_ids`); ``open_clip.get_tokenizer(name)`` builds it;
* the data config: the model's ``preprocess_cfg`` (size, mean, std, interpolation, resize mode) as the keys of a
  timm ``pretrained_cfg`` (:func:`open_clip_pretrained_cfg`).

Offline tokenizers (checked with open_clip 3.3, :func:`tokenizer_problem`): every built-in model whose text config
names no ``hf_tokenizer_name`` (the OpenAI / LAION ``ViT-*``, ``RN*``, ``convnext_*``, ``EVA*``, ``coca_*``,
``MobileCLIP*`` ... names) uses ``SimpleTokenizer``, whose BPE vocabulary ships inside the package: built offline.
A name with an ``hf_tokenizer_name`` (``*-SigLIP*``, ``*xlm-roberta*``, ``nllb-*``, ``mt5-*``, ``roberta-*``,
``ViT-*-quickgelu-*`` with HF text, ...) needs a Hugging Face tokenizer: loaded with ``local_files_only=True``
(it works only when that tokenizer is in the local Hugging Face cache, or in a ``local-dir:`` folder); a SigLIP
name without one would fetch a sentencepiece file from Google storage and is refused.

Model source (:func:`models.clip.load_open_clip_classifier`): ``open_clip:<name>`` is the zero-shot classifier of
the open_clip model ``<name>`` (a built-in or ``open_clip.add_model_config`` name) with weights from the local
file ``model_kwargs["checkpoint"]`` (``.pt``/``.bin``/``.safetensors``, as ``open_clip.create_model(name,
pretrained=<file>)`` reads it; ``pretrained=False``: random weights, no file), or ``open_clip:local-dir:<folder>``
(open_clip's own layout: ``open_clip_config.json`` and the weights, as a hub snapshot holds them). Nothing is
downloaded: pretrained tags and ``hf-hub:`` names are refused, tower weights are never fetched.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple

from torch import Tensor, nn

OPEN_CLIP_PREFIX = "open_clip:"
LOCAL_DIR = "local-dir:"
#: the model_kwargs of an ``open_clip:`` spec besides the prompt options of ``clip:``
OPEN_CLIP_KWARGS = ("checkpoint",)
#: open_clip's resize modes -> timm's crop modes
_CROP_MODES = {"shortest": "center", "squash": "squash", "longest": "border"}


def is_open_clip(model: Any) -> bool:
    """Whether ``model`` is an ``open_clip.model.CLIP`` (never imports open_clip: a model of it means it is
    imported)."""
    module = sys.modules.get("open_clip.model")
    return module is not None and isinstance(model, module.CLIP)


def embedding_dim(clip: nn.Module) -> int:
    """The width of the joint embedding space: the text projection's output width."""
    projection: Any = clip.text_projection
    if projection is None:
        return int(clip.transformer.width)
    if isinstance(projection, nn.Linear):
        return int(projection.out_features)
    return int(projection.shape[1])


def image_features(clip: nn.Module, pixel_values: Tensor) -> Tensor:
    """Projected, unnormalised image embeddings ``[B, D]`` (``encode_image``)."""
    return clip.encode_image(pixel_values)


def text_features(clip: nn.Module, input_ids: Tensor) -> Tensor:
    """Projected, unnormalised text embeddings ``[T, D]`` (``encode_text``: the EOS token)."""
    return clip.encode_text(input_ids)


def context_length(clip: nn.Module) -> int:
    return int(clip.positional_embedding.shape[0])


def token_ids(clip: nn.Module, tokenizer: Callable, texts: Sequence[str]) -> Tensor:
    """``tokenizer(texts)`` as open_clip's tokenizers return it (a ``LongTensor [T, context_length]``; a mapping
    with ``input_ids`` is accepted), checked against the model's context length."""
    ids = tokenizer(list(texts))
    if isinstance(ids, Mapping):
        ids = ids["input_ids"]
    if not isinstance(ids, Tensor) or ids.dim() != 2:
        raise ValueError(f"an open_clip tokenizer returns token ids [T, context_length], got "
                         f"{type(ids).__name__}")
    if ids.shape[1] != context_length(clip):
        raise ValueError(f"the tokenizer pads to {ids.shape[1]} positions but the open_clip model's context_length "
                         f"is {context_length(clip)}: build it with open_clip.get_tokenizer(name) or "
                         "context_length=...")
    return ids


def logit_bias(clip: nn.Module) -> Optional[Tensor]:
    """The model's ``logit_bias`` (``None``: none)."""
    return getattr(clip, "logit_bias", None)


def open_clip_pretrained_cfg(clip: nn.Module, num_classes: Optional[int] = None) -> dict:
    """The keys of a timm ``pretrained_cfg`` that ``timm.data.resolve_data_config`` reads, from the model's own
    ``preprocess_cfg`` (``open_clip.get_model_preprocess_cfg``): ``input_size`` from ``size``, ``mean``, ``std``,
    ``interpolation``; open_clip resizes the shorter side and centre-crops (``resize_mode="shortest"``,
    ``crop_pct = 1``; ``"squash"`` / ``"longest"``: timm's ``squash`` / ``border``)."""
    from open_clip import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD, get_model_preprocess_cfg

    cfg = dict(get_model_preprocess_cfg(clip))
    size = cfg.get("size", clip.visual.image_size)
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    out = {"input_size": (3, int(height), int(width)), "interpolation": cfg.get("interpolation", "bicubic"),
           "crop_pct": 1.0, "crop_mode": _CROP_MODES.get(cfg.get("resize_mode", "shortest"), "center"),
           "mean": tuple(float(v) for v in cfg.get("mean", OPENAI_DATASET_MEAN)),
           "std": tuple(float(v) for v in cfg.get("std", OPENAI_DATASET_STD))}
    if num_classes is not None:
        out["num_classes"] = int(num_classes)
    return out


# ------------------------------------------------------------------------------------------ open_clip: specs
def is_open_clip_spec(spec: Any) -> bool:
    return isinstance(spec, str) and spec.startswith(OPEN_CLIP_PREFIX)


def open_clip_name(spec: str) -> str:
    """The model name of ``open_clip:<name>`` (``local-dir:<folder>`` with ``~`` expanded); ``hf-hub:`` names and
    an empty name are errors."""
    if not is_open_clip_spec(spec) or not spec[len(OPEN_CLIP_PREFIX):]:
        raise ValueError(f"{spec!r} is not 'open_clip:<model name>' or 'open_clip:local-dir:<folder>'")
    name = spec[len(OPEN_CLIP_PREFIX):]
    if name.startswith("hf-hub:"):
        raise ValueError(f"{spec!r}: hf-hub: names are downloaded; give a built-in name with a local checkpoint "
                         "(model_kwargs.checkpoint) or open_clip:local-dir:<folder> of a downloaded snapshot")
    if name.startswith(LOCAL_DIR):
        folder = os.path.expanduser(name[len(LOCAL_DIR):])
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"open_clip folder {folder!r} (from {spec!r}) does not exist (expected "
                                    "open_clip_config.json and a weights file)")
        return LOCAL_DIR + folder
    return name


def _model_config(name: str) -> Optional[dict]:
    import json

    from open_clip import get_model_config

    if name.startswith(LOCAL_DIR):
        path = os.path.join(name[len(LOCAL_DIR):], "open_clip_config.json")
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("model_cfg")
    return get_model_config(name)


def tokenizer_problem(name: str) -> Optional[str]:
    """Why ``open_clip.get_tokenizer(name)`` cannot be built offline (``None``: it can, possibly from the local
    Hugging Face cache; see the module docstring)."""
    config = _model_config(name)
    if config is None:
        return f"no open_clip model config {name!r} (open_clip.list_models() names the built-in ones)"
    text = config.get("text_cfg", {})
    if not text.get("hf_tokenizer_name") and "siglip" in name.lower() and not name.startswith(LOCAL_DIR):
        return (f"open_clip model {name!r} uses SigLipTokenizer, which fetches its sentencepiece vocabulary from "
                "Google storage (refused: nothing is downloaded)")
    return None


def load_open_clip(name: str, checkpoint: Optional[str], pretrained: bool = True) -> Tuple[nn.Module, Callable]:
    """``(CLIP, tokenizer)`` of the open_clip model ``name`` (:func:`open_clip_name`'s answer), eval mode, local
    files only: weights from ``checkpoint`` (a file) or the ``local-dir:`` folder; ``pretrained=False`` random
    weights (the folder's config, no file read). Tower weights (timm, Hugging Face) are never fetched."""
    import open_clip

    local = name.startswith(LOCAL_DIR)
    if checkpoint is not None:
        if local:
            raise ValueError("a local-dir: folder holds its own weights; model_kwargs.checkpoint is for built-in names")
        checkpoint = os.path.expanduser(str(checkpoint))
        if pretrained and not os.path.isfile(checkpoint):
            raise FileNotFoundError(f"open_clip checkpoint {checkpoint!r} (model_kwargs.checkpoint) does not exist")
    elif pretrained and not local:
        raise ValueError(f"open_clip model {name!r}: real weights come from a local file, model_kwargs.checkpoint "
                         "(nothing is downloaded; pretrained=False builds random weights)")
    problem = tokenizer_problem(name)
    if problem is not None:
        raise ValueError(problem)
    kwargs = dict(pretrained_image=False, pretrained_text=False, load_weights=bool(pretrained))
    try:
        clip = open_clip.create_model(name, pretrained=checkpoint if pretrained and not local else None, **kwargs)
    except (OSError, RuntimeError, ValueError, KeyError) as err:
        raise ValueError(f"cannot create open_clip model {name!r} from local files (checkpoint={checkpoint!r}, "
                         f"pretrained={pretrained}): {err}") from err
    if not is_open_clip(clip):
        raise ValueError(f"open_clip model {name!r} is a {type(clip).__name__}; the zero-shot wrappers take "
                         "open_clip.model.CLIP (its own vision and text transformers)")
    text = (_model_config(name) or {}).get("text_cfg", {})
    tokenizer_kwargs = {"local_files_only": True} if text.get("hf_tokenizer_name") else {}
    try:
        tokenizer = open_clip.get_tokenizer(name, **tokenizer_kwargs)
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot build the tokenizer of open_clip model {name!r} offline: {err}") from err
    return clip.eval(), tokenizer


def check_checkpoint_kwargs(kwargs: Mapping[str, Any], allowed: Sequence[str], spec: str) -> None:
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"unknown model_kwargs {unknown} for {spec!r}; an open_clip: spec takes {list(allowed)}")
