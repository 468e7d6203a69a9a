"""A family's capability objects: what only some methods need, declared on the adapter as one member each.

An adapter's class body declares each capability as ``name = Capability(build)``: ``build(adapter)`` makes the
capability object (a class taking the adapter, as :class:`~methods.adapters.RuleMap` does, or a factory that
returns ``None`` where the family's model lacks the capability), once per adapter. ``ModelAdapter`` declares every
capability as ``Capability(lacking)``, so reading one on an adapter gives the family's object or ``None``: a method that
needs it checks for ``None`` and refuses by name; nothing is probed with ``getattr``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Generic, Optional, TypeVar, overload

#: the capability object's type (covariant: a family's subclass of the object declared by ``ModelAdapter``)
Obj = TypeVar("Obj", covariant=True)


class Capability(Generic[Obj]):
    """A declared capability: a descriptor that builds ``build(adapter)`` on first read and keeps it per adapter."""

    def __init__(self, build: Callable[[Any], Obj]) -> None:
        self.build = build
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, adapter: None, owner: type) -> "Capability[Obj]": ...

    @overload
    def __get__(self, adapter: object, owner: type) -> Obj: ...

    def __get__(self, adapter: Optional[object], owner: type) -> Any:
        if adapter is None:
            return self
        built: Dict[str, Any] = adapter.__dict__
        if self.name not in built:
            built[self.name] = self.build(adapter)
        return built[self.name]


def lacking(adapter: Any) -> None:
    """The build of a capability the family lacks."""
    return None
