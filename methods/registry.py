"""timm-style registry of attribution methods: ``build_method(name, **options)``."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Type, TypeVar

from .base import AttributionMethod
from .precision import parse_accumulate_dtype

M = TypeVar("M", bound=Type[AttributionMethod])
_REGISTRY: Dict[str, Type[AttributionMethod]] = {}
#: the tag of the methods an evaluation runs only when asked for (by name, by tag or with ``methods: all``): the
#: generic baselines whose cost is a multiple of a forward and backward (``methods: null`` leaves them out)
OPT_IN = "opt_in"


def register_method(name: str) -> Callable[[M], M]:
    """Class decorator that makes an :class:`AttributionMethod` buildable by ``name``."""

    def decorator(cls: M) -> M:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"attribution method {name!r} is already registered by {_REGISTRY[name].__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def available_methods(tag: Optional[str] = None, opt_in: bool = True) -> List[str]:
    """Sorted names of the registered methods (as timm's ``list_models``): ``tag``, only those whose class lists
    it in its ``tags`` (e.g. ``"generic_baseline"``, ``"sampling"``); ``opt_in=False``, without the methods tagged
    :data:`OPT_IN` (the set ``methods: null`` evaluates)."""
    return sorted(name for name, cls in _REGISTRY.items()
                  if (tag is None or tag in cls.tags) and (opt_in or OPT_IN not in cls.tags))


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
