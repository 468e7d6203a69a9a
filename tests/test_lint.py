"""The lint configuration of ``pyproject.toml`` (``[tool.ruff]``) holds for the whole repository."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_check_passes():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], cwd=str(ROOT),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"ruff check found problems:\n{result.stdout[-6000:]}{result.stderr[-2000:]}"
