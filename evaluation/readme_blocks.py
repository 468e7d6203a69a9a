"""Generated README blocks: a table that code writes between two HTML-comment markers (the conformance matrix,
the metric catalogue), read back by the tests that keep it true and rewritten by the generator's ``--write``."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


def _block(text: str, start: str, end: str) -> re.Match:
    found = re.search(re.escape(start) + r"\n(.*?)\n?" + re.escape(end), text, flags=re.S)
    if found is None:
        raise ValueError(f"README.md has no {start} ... {end} block")
    return found


def block_text(text: str, start: str, end: str) -> str:
    """What stands between the markers ``start`` and ``end`` of ``text`` (an error naming them when missing)."""
    return _block(text, start, end).group(1)


def write_block(readme: Path, start: str, end: str, table: str) -> None:
    """Replace the block between the markers of the file ``readme`` by ``table``."""
    text = readme.read_text()
    found = _block(text, start, end)
    readme.write_text(text[:found.start()] + start + "\n" + table + "\n" + end + text[found.end():])


def block_cli(description: str, markdown: Callable[[], str], readme: Path, start: str, end: str) -> None:
    """The generator's command line: print the table, or with ``--write`` put it into ``readme``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write", action="store_true", help=f"replace the table in {readme.name}")
    if parser.parse_args().write:
        write_block(readme, start, end, markdown())
    else:
        print(markdown())


@dataclass(frozen=True)
class GeneratedBlock:
    """One generated table of a README: where it stands (``readme``, the markers) and what writes it (``markdown``)."""

    readme: Path
    start: str
    end: str
    markdown: Callable[[], str]

    def readme_table(self, text: str) -> str:
        """The table between the markers of ``text`` (an error when the markers are missing)."""
        return block_text(text, self.start, self.end)

    def main(self, description: str) -> None:
        """The generator's command line (:func:`block_cli`)."""
        block_cli(description, self.markdown, self.readme, self.start, self.end)
