"""A fake ``evaluate.py`` run folder for the tests of the scripts that read runs (``benchmarks/``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional


def write_run(folder: Path, values: Dict[str, object], directions: Dict[str, Optional[bool]]) -> str:
    """``folder`` with ``metrics.json`` (``values``) and ``metrics.meta.json`` (each key's ``higher_is_better`` from
    ``directions``, ``None`` where absent); returns its path as a string."""
    folder.mkdir()
    (folder / "metrics.json").write_text(json.dumps(values))
    meta = {"metrics": {k: {"higher_is_better": directions.get(k)} for k in values}}
    (folder / "metrics.meta.json").write_text(json.dumps(meta))
    return str(folder)
