"""The model's classes against the data's: a model evaluated on a dataset of other classes gives numbers that mean
nothing (a 20-class model on 2-class SST-2 scores accuracy 0.5 and AUCs), so the evaluation compares the two class
sets before the first batch.

* The model names its classes when it can: a zero-shot classifier its ``classnames`` (the prompt set), a
  Hugging Face classifier its ``config.id2label``; a timm classifier or classifier file gives only its count.
* The data names its classes in ``datamodule.classes`` (or ``classnames``).
* Names are compared in order, case-insensitively (``NEGATIVE`` = ``negative``). A different count is an error; so
  are different names, unless ``class_map`` (``{data class name: model class name}``) says how the data's classes
  are called by the model: the labels are then translated to the model's indices (:func:`label_translation`).
  Generic names (``LABEL_0``, ``LABEL_1``, ...: a Hugging Face config without names) are not compared (a warning
  says so); the count still is.
"""
from __future__ import annotations

import re
from typing import Any, List, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

GENERIC_NAME = re.compile(r"LABEL_\d+")


def model_class_names(model: nn.Module) -> Optional[List[str]]:
    """The model's class names in index order, or ``None`` when it names none."""
    names = getattr(model, "classnames", None)
    if names:
        return [str(n) for n in names]
    id2label = getattr(getattr(model, "config", None), "id2label", None)
    if isinstance(id2label, Mapping) and id2label:
        return [str(id2label[i]) for i in sorted(id2label, key=int)]
    return None


def model_num_classes(model: nn.Module) -> Optional[int]:
    """The number of the model's outputs, where the model says it."""
    for value in (getattr(model, "num_classes", None), getattr(getattr(model, "config", None), "num_labels", None)):
        if isinstance(value, int):
            return value
    return None


def data_class_names(datamodule: Any) -> Optional[List[str]]:
    names = getattr(datamodule, "classes", None) or getattr(datamodule, "classnames", None)
    return [str(n) for n in names] if names else None


def _shown(names: Sequence[str], most: int = 12) -> str:
    head = ", ".join(repr(n) for n in names[:most])
    return f"[{head}{', ...' if len(names) > most else ''}] ({len(names)} classes)"


def is_generic(names: Sequence[str]) -> bool:
    return all(GENERIC_NAME.fullmatch(n) for n in names)


def label_translation(model_names: Optional[Sequence[str]], model_count: Optional[int],
                      data_names: Optional[Sequence[str]], class_map: Optional[Mapping[str, str]] = None,
                      warn=None) -> Optional[Tensor]:
    """Check the two class sets (module docstring); ``None`` when labels stay as they are, else the ``[C_data]``
    index of each data class among the model's classes (from ``class_map``). Errors name both lists."""
    if data_names is None:
        if class_map:
            raise ValueError("model.class_map is given but the datamodule names no classes to map")
        return None
    count = len(model_names) if model_names is not None else model_count
    if class_map:
        if model_names is None or is_generic(model_names):
            raise ValueError("model.class_map maps the data's class names to the model's, but the model names no "
                             "classes (no id2label names or prompt set)")
        unknown = sorted(set(class_map) - set(data_names))
        if unknown:
            raise ValueError(f"model.class_map names {unknown}, which are not classes of the data {_shown(data_names)}")
        folded = {n.casefold(): i for i, n in enumerate(model_names)}
        missing = [class_map.get(d, d) for d in data_names if class_map.get(d, d).casefold() not in folded]
        if missing:
            raise ValueError(f"model.class_map: the model has no class {missing}; the model's classes are "
                             f"{_shown(model_names)}")
        return torch.tensor([folded[class_map.get(d, d).casefold()] for d in data_names])
    if count is not None and count != len(data_names):
        model_text = _shown(model_names) if model_names is not None else f"{count} classes"
        raise ValueError(f"the model has {model_text} but the data has {_shown(data_names)}: evaluate a model "
                         "trained on these classes")
    if model_names is None:
        return None
    if is_generic(model_names):
        if warn is not None:
            warn(f"the model's classes have generic names ({_shown(model_names)}); they are assumed to be the "
                 f"data's {_shown(data_names)} in this order")
        return None
    if [n.casefold() for n in model_names] != [n.casefold() for n in data_names]:
        raise ValueError(f"the model's classes {_shown(model_names)} are not the data's {_shown(data_names)} (in "
                         "order); if they are the same classes under other names or in another order, say how the "
                         "model calls each data class: --model.class_map '{<data class>: <model class>, ...}'")
    return None
