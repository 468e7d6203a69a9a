"""The type check: mypy on the files ``[tool.mypy]`` in ``pyproject.toml`` names (``methods/``) reports nothing."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_reports_no_errors(monkeypatch):
    api = pytest.importorskip("mypy.api", reason="mypy is not installed (pip install -e .[test])")
    monkeypatch.chdir(ROOT)   # the configured paths are relative to the repository root
    stdout, stderr, status = api.run(["--config-file", str(ROOT / "pyproject.toml")])
    assert status == 0, f"mypy found errors:\n{stdout}{stderr}"
    assert "Success: no issues found" in stdout, stdout + stderr
