"""timm-style registry of attribution methods: ``build_method(name, **options)``."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Type, TypeVar

from .base import AttributionMethod
from .precision import parse_accumulate_dtype

M = TypeVar("M", bound=Type[AttributionMethod])
_REGISTRY: Dict[str, Type[AttributionMethod]] = {}


def register_method(name: str) -> Callable[[M], M]:
    """Class decorator that makes an :class:`AttributionMethod` buildable by ``name``."""

    def decorator(cls: M) -> M:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"attribution method {name!r} is already registered by {_REGISTRY[name].__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def available_methods() -> List[str]:
    """Sorted names of the registered methods."""
    return sorted(_REGISTRY)


def method_class(name: str) -> Type[AttributionMethod]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown attribution method {name!r}; available methods: {', '.join(available_methods())}"
        ) from None


def build_method(name: str, **options: Any) -> AttributionMethod:
    """Instantiate the method registered as ``name`` with keyword ``options``.

    Unknown names raise ``KeyError`` listing every registered method; unknown options raise ``TypeError``
    naming the option and the method. ``accumulate_dtype`` is every method's option (:mod:`methods.precision`).
    """
    cls = method_class(name)
    accumulate = options.pop("accumulate_dtype", cls.accumulate_dtype)
    try:
        method = cls(**options)
    except TypeError as err:
        raise TypeError(f"bad options for attribution method {name!r}: {err}") from None
    try:
        parsed = parse_accumulate_dtype(accumulate)
    except ValueError as err:
        raise ValueError(f"attribution method {name!r}: {err}") from None
    if parsed != cls.accumulate_dtype:   # the class default stays a class attribute (the method's repr unchanged)
        method.accumulate_dtype = parsed
    return method
