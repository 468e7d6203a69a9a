"""Composed config files: a config names the files it builds on under ``base:``; they apply before it.

::

    # configs/train/synthetic_vit.yaml
    base: ../base/train.yaml        # a path, or a list of paths, relative to this file's folder
    trainer:
      max_epochs: 12                # keys given here override the base files' values
    model: ...

``--config FILE`` applies, in order, every file that ``FILE`` builds on (depth first: a base file's own bases
come before it, a file reached twice applies once) and then ``FILE`` itself, as if each had been given with its
own ``--config``. Mappings merge key by key, so an experiment file can change one key of a base block (e.g.
``trainer.logger.init_args.name``); lists (e.g. ``trainer.callbacks``) are replaced as a whole. Several
``--config`` options compose in the order given, each with its own bases.

:func:`config_files` gives the same ordered list of files, e.g. to hash everything a config depends on.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Sequence, Union

import yaml
from jsonargparse import ActionConfigFile

BASE_KEY = "base"
PathLike = Union[str, os.PathLike]


def _bases(path: Path) -> List[Path]:
    """The files that the config file ``path`` names under ``base:`` (resolved, in the order given)."""
    try:
        content = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ValueError(f"config file {str(path)!r} is not valid UTF-8 YAML: {err}") from err
    if not isinstance(content, dict) or content.get(BASE_KEY) is None:
        return []
    value = content[BASE_KEY]
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"config file {str(path)!r}: '{BASE_KEY}' must be a path or a list of paths, got {value!r}")
    out = []
    for name in names:
        base = Path(os.path.expanduser(name))
        base = base if base.is_absolute() else path.parent / base
        if not base.is_file():
            raise FileNotFoundError(f"config file {str(path)!r} builds on {name!r}, which does not exist "
                                    f"({str(base)!r}; base paths are relative to the including file)")
        out.append(base.resolve())
    return out


def config_files(path: PathLike) -> List[Path]:
    """``path`` and every file it builds on, in the order they apply (bases first, ``path`` last)."""
    order: List[Path] = []

    def visit(file: Path, chain: Sequence[Path]) -> None:
        if file in chain:
            cycle = " -> ".join(str(p) for p in [*chain, file])
            raise ValueError(f"config files build on each other in a cycle: {cycle}")
        for base in _bases(file):
            visit(base, [*chain, file])
        if file not in order:
            order.append(file)

    visit(Path(os.path.expanduser(str(path))).resolve(), [])
    return order


def _as_file(value) -> Optional[Path]:
    """``value`` as an existing config file, or ``None`` (e.g. a config given inline as a YAML string)."""
    if not isinstance(value, (str, os.PathLike)):
        return None
    try:
        path = Path(os.path.expanduser(str(value)))
        return path if path.is_file() else None
    except (OSError, ValueError):  # e.g. a YAML string too long to be a file name
        return None


class ComposedConfigFile(ActionConfigFile):
    """``--config`` that applies the files a config builds on (``base:``) before the config itself."""

    def __call__(self, parser, cfg, values, option_string=None):
        path = _as_file(values)
        if path is not None:
            for base in config_files(path)[:-1]:
                self.apply_config(parser, cfg, self.dest, str(base))
        self.apply_config(parser, cfg, self.dest, values)
