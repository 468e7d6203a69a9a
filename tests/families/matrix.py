"""The README's conformance matrix, written from the rows of :mod:`tests.families`.

``python -m tests.families.matrix`` prints the table; ``--write`` replaces it in ``README.md`` between the
``conformance-matrix`` markers. ``tests/test_method_contract.py`` checks that the README holds the current table
and that every cell is true: a mark runs the whole contract, a footnote is the reason the method raises.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

from evaluation.readme_blocks import GeneratedBlock
from methods import available_methods

from . import FAMILIES

README = Path(__file__).resolve().parents[2] / "README.md"
START, END = "<!-- conformance-matrix:start -->", "<!-- conformance-matrix:end -->"


def markdown() -> str:
    """One row per family of the matrix, one column per registered method: ``✓`` (the contract holds) or a
    footnote number (the method is not defined there; the footnote says why)."""
    methods = available_methods()
    notes: Dict[str, int] = {}
    lines: List[str] = [
        "| row | adapter | " + " | ".join(f"`{m}`" for m in methods) + " |",
        "|---|---|" + "---|" * len(methods),
    ]
    for family in FAMILIES:
        cells = []
        for method in methods:
            reason = family.undefined.get(method)
            cells.append("✓" if reason is None else f"({notes.setdefault(reason, len(notes) + 1)})")
        lines.append(f"| `{family.name}` | {family.adapter.family} | " + " | ".join(cells) + " |")
    if notes:
        lines.append("")
        lines += [f"({number}) {reason}" for reason, number in notes.items()]
    return "\n".join(lines)


BLOCK = GeneratedBlock(README, START, END, markdown)
readme_table = BLOCK.readme_table


if __name__ == "__main__":
    BLOCK.main(__doc__.splitlines()[0])
