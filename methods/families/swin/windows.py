"""Swin's (shifted) windows as token-space maps: which grid position each window entry is, and the expansion of
a block's windowed attention ``[B * nW, H, a, a]`` (``a`` = window area) to its stage's full ``[B, H, N, N]`` map.

Liu et al. 2021, "Swin Transformer", Sec. 3.2: a block partitions the ``rows x cols`` grid into ``nW`` windows of
``w x w`` tokens, after a cyclic shift of the grid by ``(-s, -s)`` in every other block (SW-MSA, ``s = w / 2``);
attention runs inside each window (with a mask between the wrapped-around regions of a shifted window). Entry
``p`` of window ``k`` is the grid position :attr:`WindowGeometry.index` ``[k, p]`` (row-major, the shift undone),
so the full map is block-diagonal up to that permutation and 0 between windows; its rows still sum to 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch
from torch import Tensor


@dataclass(frozen=True)
class WindowGeometry:
    """The windows of one block: ``grid`` (rows, cols) of its stage, square ``window`` side and ``shift``."""

    grid: Tuple[int, int]
    window: int
    shift: int

    @property
    def num_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    def problem(self) -> str:
        """Why the windows do not tile the grid exactly (``""``: they do); Swin pads such grids."""
        rows, cols = self.grid
        if rows % self.window or cols % self.window:
            return f"a {rows}x{cols} token grid is not a multiple of the {self.window}x{self.window} window"
        return ""

    def index(self, device: torch.device) -> Tensor:
        """``[nW, w * w]``: the row-major grid position of each window entry, windows in the model's order (window
        rows, then window columns, as ``window_partition``), the cyclic shift undone."""
        rows, cols = self.grid
        w = self.window
        ids = torch.arange(rows * cols, device=device).reshape(rows, cols)
        if self.shift:
            ids = torch.roll(ids, shifts=(-self.shift, -self.shift), dims=(0, 1))
        return ids.reshape(rows // w, w, cols // w, w).permute(0, 2, 1, 3).reshape(-1, w * w)

    def flat_pairs(self, device: torch.device) -> Tensor:
        """``[nW * a * a]``: the position ``i * N + j`` in a flattened ``N x N`` map of each window entry
        ``(k, p, q)``, window-major."""
        index = self.index(device)
        return (index[:, :, None] * self.num_tokens + index[:, None, :]).flatten()

    def expand(self, windows: Tensor) -> Tensor:
        """``[B * nW, H, a, a]`` -> ``[B, H, N, N]``: each window's map at its positions, 0 elsewhere
        (differentiable; :meth:`gather` is its inverse, exactly)."""
        pairs = self.flat_pairs(windows.device)
        count, area = pairs.numel() // (self.window ** 4), self.window ** 2
        heads = windows.shape[1]
        batch = windows.shape[0] // count
        blocks = windows.reshape(batch, count, heads, area, area).transpose(1, 2).reshape(batch, heads, -1)
        full = windows.new_zeros(batch, heads, self.num_tokens * self.num_tokens)
        full = full.index_put((torch.arange(batch, device=windows.device)[:, None, None],
                               torch.arange(heads, device=windows.device)[None, :, None], pairs[None, None]), blocks)
        return full.reshape(batch, heads, self.num_tokens, self.num_tokens)

    def gather(self, full: Tensor) -> Tensor:
        """``[B, H, N, N]`` -> ``[B * nW, H, a, a]``: the entries of each window, in the model's order."""
        pairs = self.flat_pairs(full.device)
        batch, heads = full.shape[:2]
        area = self.window ** 2
        blocks = full.reshape(batch, heads, -1)[:, :, pairs].reshape(batch, heads, -1, area, area)
        return blocks.transpose(1, 2).reshape(-1, heads, area, area)

    def tokens(self, windows: Tensor) -> Tensor:
        """Per-window tokens ``[B * nW, a, D]`` -> ``[B, N, D]`` at their grid positions (row-major)."""
        index = self.index(windows.device).flatten()
        batch = windows.shape[0] * windows.shape[1] // index.numel()
        flat = windows.reshape(batch, index.numel(), windows.shape[-1])
        out = windows.new_zeros(batch, self.num_tokens, windows.shape[-1])
        return out.index_copy(1, index, flat)
