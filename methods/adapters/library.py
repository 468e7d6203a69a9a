"""A family's model classes, looked up in its library when a model is resolved (importing :mod:`methods` loads
no model library), and the refusal an adapter's ``supports`` gives a model of another class."""
from __future__ import annotations

import importlib
from typing import Any, Optional


def library_class(module: str, name: str) -> Optional[type]:
    """``module.name`` (e.g. ``("timm.models.beit", "Beit")``), or ``None`` when the library is not installed or
    this version of it has no such class."""
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:  # pragma: no cover - the libraries are dependencies
        return None


def class_problem(model: Any, module: str, name: str) -> Optional[str]:
    """``None`` if ``model`` is a ``module.name``; else why not, naming the library (the first part of ``module``):
    ``"Foo is not a timm Beit"``, ``"this transformers has no Bar"``, ``"timm is not installed"``."""
    library = module.split(".")[0]
    try:
        model_class = getattr(importlib.import_module(module), name, None)
    except ImportError:  # pragma: no cover - the libraries are dependencies
        return f"{library} is not installed"
    if model_class is None:
        return f"this {library} has no {name}"
    if not isinstance(model, model_class):
        return f"{type(model).__name__} is not a {library} {name}"
    return None
