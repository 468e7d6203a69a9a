"""methods/cpu_memory.py: with ``retain_freed_memory`` a large tensor freed and allocated again can reuse the
process's pages (no fresh page faults); without it glibc maps fresh pages every time. Run in subprocesses: the
setting is process-wide."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, resource, torch
from methods.cpu_memory import retain_freed_memory
applied = retain_freed_memory()
def faults():
    t = torch.empty(16 * 2**20)          # 64 MiB of float32, above glibc's largest mmap threshold
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t.fill_(1.0)                         # touch every page
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    del t
    return after - before
faults()
print(json.dumps({"applied": applied, "faults": [faults() for _ in range(4)]}))
"""


def run(env_value=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TOKEN_ATTRIBUTIONS_RETAIN_FREED_MEMORY", None)
    if env_value is not None:
        env["TOKEN_ATTRIBUTIONS_RETAIN_FREED_MEMORY"] = env_value
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="glibc's mallopt only")
def test_freed_memory_is_reused_without_fresh_page_faults():
    pages = 64 * 2**20 // os.sysconf("SC_PAGE_SIZE")
    retained = run()
    assert retained["applied"] is True
    # pages are reused (a small allocation left at the old spot can make the next large one extend the heap
    # instead: fewer faults than the default, not none)
    assert min(retained["faults"]) < pages // 10, retained
    default = run("0")
    assert default["applied"] is False
    assert min(default["faults"]) > pages // 2, default         # glibc's default: fresh pages every time
