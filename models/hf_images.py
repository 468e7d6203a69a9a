"""Hugging Face image classifiers from a local folder (``hf:<folder>``, :func:`models.sources.load_model`).

A folder is an image classifier when every architecture its ``config.json`` names is a ``transformers`` class whose
name ends in ``ForImageClassification`` or ``ForImageClassificationWithTeacher`` (``ViTForImageClassification``,
``DeiTForImageClassificationWithTeacher``, ``Dinov2ForImageClassification``, ...): the model is built as that
class (not through an auto class, which maps a DeiT config to one class whatever the folder holds).

Normalisation: the images an evaluation feeds are normalised with the model's ``mean`` / ``std``
(``evaluation.classifier.Classifier``, through timm's ``resolve_data_config``, which reads
``model.pretrained_cfg``). The loader sets ``model.pretrained_cfg`` from the folder's image processor
(``preprocessor_config.json``: ``image_mean``, ``image_std`` (mean 0 / std 1 with ``do_normalize`` false), the
input size (``crop_size`` when it centre-crops, else ``size``, else the config's ``image_size``), the crop
fraction and the interpolation), or from explicit ``model_kwargs`` ``image_mean`` and ``image_std`` (which win
over the folder's). A folder without either is refused: a silent ImageNet default would evaluate the wrong
inputs.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from torch import nn

IMAGE_CLASSIFIER_SUFFIXES = ("ForImageClassification", "ForImageClassificationWithTeacher")
PREPROCESSOR_CONFIG = "preprocessor_config.json"
#: explicit normalisation, taken out of ``model_kwargs`` before ``from_pretrained``
NORMALISATION_KWARGS = ("image_mean", "image_std")
#: PIL resampling filters of image processors -> timm's interpolation names
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}


def _architectures(source: str) -> List[str]:
    path = Path(source) / "config.json"
    if not path.is_file():
        return []
    try:
        found = json.loads(path.read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [str(a) for a in found]


def image_classifier_architecture(source: str) -> Optional[str]:
    """The ``transformers`` class of the local folder ``source`` when its ``config.json`` names only image
    classifiers (module docstring), else ``None``."""
    names = _architectures(source)
    if names and all(n.endswith(IMAGE_CLASSIFIER_SUFFIXES) for n in names):
        return names[0]
    return None


def _pair(value: Any) -> Optional[tuple]:
    if isinstance(value, dict):
        if "height" in value and "width" in value:
            return int(value["height"]), int(value["width"])
        if "shortest_edge" in value:
            return int(value["shortest_edge"]), int(value["shortest_edge"])
        return None
    if isinstance(value, int):
        return value, value
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return int(value[0]), int(value[1])
    return None


def _three(name: str, value: Any, where: str) -> tuple:
    values = [value] * 3 if isinstance(value, (int, float)) else list(value) if isinstance(value, Sequence) else []
    if len(values) != 3 or not all(isinstance(v, (int, float)) for v in values):
        raise ValueError(f"{where}: {name} must be 3 numbers (one per channel), got {value!r}")
    return tuple(float(v) for v in values)


def image_data_config(source: str, config: Any, mean: Any = None, std: Any = None) -> Dict[str, Any]:
    """The timm-style ``pretrained_cfg`` (``mean``, ``std``, ``input_size``, ``crop_pct``, ``interpolation``) of
    the image classifier folder ``source`` with ``transformers`` config ``config``; explicit ``mean`` / ``std``
    win over the folder's image processor (module docstring)."""
    path = Path(source) / PREPROCESSOR_CONFIG
    processor: Dict[str, Any] = {}
    if path.is_file():
        try:
            processor = json.loads(path.read_text())
        except ValueError as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from err
    if (mean is None) != (std is None):
        raise ValueError("give both model_kwargs image_mean and image_std, or neither")
    if mean is None:
        if not processor:
            raise ValueError(f"Hugging Face image classifier {source!r} has no {PREPROCESSOR_CONFIG} (its image "
                             "processor's normalisation): save the processor with the model, or give the "
                             "normalisation explicitly: model_kwargs={'image_mean': [...], 'image_std': [...]}")
        if processor.get("do_normalize", True):
            if "image_mean" not in processor or "image_std" not in processor:
                raise ValueError(f"{path}: no image_mean / image_std; give model_kwargs image_mean and image_std")
            mean, std = processor["image_mean"], processor["image_std"]
        else:
            mean, std = 0.0, 1.0
    mean, std = _three("image_mean", mean, source), _three("image_std", std, source)
    if min(std) <= 0:
        raise ValueError(f"{source}: image_std must be > 0, got {std}")
    channels = int(getattr(config, "num_channels", 3))
    size = _pair(processor.get("size"))
    crop = _pair(processor.get("crop_size")) if processor.get("do_center_crop") else None
    input_size = crop or size or _pair(getattr(config, "image_size", None))
    cfg: Dict[str, Any] = {"mean": mean, "std": std,
                           "interpolation": _RESAMPLE.get(processor.get("resample"), "bicubic"),
                           "crop_pct": crop[0] / size[0] if crop and size else 1.0}
    if input_size is not None:
        cfg["input_size"] = (channels,) + input_size
    return cfg


def load_hf_image_classifier(source: str, architecture: str, pretrained: bool = True,
                             model_kwargs: Optional[Dict[str, Any]] = None,
                             trust_remote_code: bool = False) -> nn.Module:
    """The ``transformers`` class ``architecture`` from the local folder ``source`` (random weights unless
    ``pretrained``), with ``pretrained_cfg`` from :func:`image_data_config`; eval mode."""
    import transformers
    from transformers import AutoConfig

    model_class = getattr(transformers, architecture, None)
    if model_class is None:
        raise ValueError(f"Hugging Face folder {source!r} names the architecture {architecture!r}, which the installed "
                         f"transformers {transformers.__version__} does not have")
    kwargs = dict(model_kwargs or {})
    mean, std = (kwargs.pop(k, None) for k in NORMALISATION_KWARGS)
    kwargs["trust_remote_code"] = bool(trust_remote_code)
    if pretrained:
        model, info = model_class.from_pretrained(source, local_files_only=True, output_loading_info=True, **kwargs)
    else:
        config = AutoConfig.from_pretrained(source, local_files_only=True, **kwargs)
        model, info = model_class(config), {}
    model.pretrained_cfg = image_data_config(source, model.config, mean, std)
    model.newly_initialized_keys = sorted(info.get("missing_keys", ())) if pretrained else None
    return model.eval()
