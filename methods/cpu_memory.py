"""Keep the memory a CPU process frees for its next allocations (glibc's ``mallopt``).

Attribution methods allocate many tensors of the attention maps' size (``[B, H, N, N]``: 50 MB at batch 16, 12
heads, 256 positions, float32). glibc serves every allocation above its mmap threshold (at most 32 MB) with a fresh
``mmap`` and unmaps it on ``free``, so each such tensor starts on pages the kernel must fault in and zero again.
On the 2-core development machine Transformer Attribution on BERT-base (batch 16, 256 positions) took 2,233 ms per
sequence with glibc's defaults and 1,536 ms with this setting (``benchmarks/methods.py``, 2026-11-24;
benchmarks/README.md).

:func:`retain_freed_memory` turns that off for the calling process: no allocation is served by ``mmap``
(``M_MMAP_MAX = 0``, everything comes from the heap) and freed heap memory is never returned to the system
(``M_TRIM_THRESHOLD`` = ``SIZE_MAX``). The cost is that the resident memory stays near the run's peak. It
changes no numbers. ``evaluate.py``, ``train.py`` and ``benchmarks/methods.py`` call it on start (the
environment variable ``TOKEN_ATTRIBUTIONS_RETAIN_FREED_MEMORY=0`` keeps glibc's defaults); a library user can
call it once. A no-op returning ``False`` outside glibc (macOS, musl, Windows).
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys

#: ``mallopt`` parameters of glibc's ``malloc.h``
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
#: the environment variable that, set to ``0``, makes :func:`retain_freed_memory` a no-op
ENV = "TOKEN_ATTRIBUTIONS_RETAIN_FREED_MEMORY"
_TRIM_THRESHOLD = -1   # glibc reads it as size_t: SIZE_MAX, never trim


def retain_freed_memory() -> bool:
    """Serve every allocation from the heap and keep freed memory in the process (module docstring). Returns
    whether the setting was applied (glibc only; ``False`` when ``$TOKEN_ATTRIBUTIONS_RETAIN_FREED_MEMORY`` is
    ``0``)."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
