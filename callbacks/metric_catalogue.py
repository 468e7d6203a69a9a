"""The README's metric list, written from the ``metric_cards`` of every evaluation callback class in
``callbacks/`` (:class:`evaluation.metric_cards.MetricCard`), so the description cannot drift from the code.

``python -m callbacks.metric_catalogue`` prints the table; ``--write`` replaces it in ``README.md`` between the
``metric-catalogue`` markers. ``tests/test_metric_catalogue.py`` checks that the README holds the current table.
Every module of the package is imported and every :class:`~callbacks.base.EvaluationCallback` subclass defined
there with a non-empty ``metric_cards`` contributes one row per card, ordered by result-key prefix and class.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import List, Tuple, Type

from evaluation.metric_cards import MetricCard
from evaluation.readme_blocks import GeneratedBlock

from .base import EvaluationCallback

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- metric-catalogue:start -->", "<!-- metric-catalogue:end -->"
PACKAGE = Path(__file__).resolve().parent.name      # "callbacks", also when run as __main__
DIRECTIONS = {True: "higher", False: "lower", None: "none"}


def catalogue_classes() -> List[Type[EvaluationCallback]]:
    """Every callback class of the package that declares metric cards, ordered by prefix and class name."""
    package = importlib.import_module(PACKAGE)
    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{PACKAGE}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (issubclass(cls, EvaluationCallback) and cls.__module__ == module.__name__
                    and tuple(getattr(cls, "metric_cards", ()) or ())):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return sorted(found.values(), key=lambda c: (prefix_of(c), c.__module__, c.__qualname__))


def prefix_of(cls: Type[EvaluationCallback]) -> str:
    """The test part of a class's result keys: its ``PREFIX`` (or default ``NAME``) attribute, else its module's
    ``PREFIX``; a class that declares none is refused (its keys could not be named in the table)."""
    module = importlib.import_module(cls.__module__)
    prefix = getattr(cls, "PREFIX", None) or getattr(cls, "NAME", None) or getattr(module, "PREFIX", None)
    if not prefix:
        raise TypeError(f"{cls.__module__}.{cls.__qualname__} declares metric cards but no PREFIX or NAME: the "
                        "catalogue cannot name its result keys")
    return str(prefix)


def rows() -> List[Tuple[Type[EvaluationCallback], MetricCard]]:
    """``(callback class, card)`` for every card, in the table's order."""
    return [(cls, card) for cls in catalogue_classes() for card in cls.metric_cards]


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """The table: one row per metric card."""
    lines = ["| key (test/…/metric) | definition | reference | cost / sample | better | modalities | callback |",
             "|---|---|---|---|---|---|---|"]
    for cls, card in rows():
        prefix = prefix_of(cls)
        lines.append(f"| `{prefix}/…/{card.name}` | {_cell(card.definition)} | "
                     f"{_cell(card.reference)} | {_cell(card.cost)} | {DIRECTIONS[card.higher_is_better]} | "
                     f"{', '.join(card.modalities)} | `{cls.__module__}.{cls.__qualname__}` |")
    return "\n".join(lines)


BLOCK = GeneratedBlock(README, START, END, markdown)
readme_table = BLOCK.readme_table


if __name__ == "__main__":
    BLOCK.main(__doc__.splitlines()[0])
