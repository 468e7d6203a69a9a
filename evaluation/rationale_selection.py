"""Hard rationales of word scores and their spans (ERASER, DeYoung et al. 2020; Chefer et al.'s token-F1 protocol),
batched, on **document words** (ERASER's whitespace tokens of the flattened document, ``W`` per batch row, padded;
their scores: :func:`evaluation.words.document_word_scores`). PROTOCOLS.md sections 4 and 8.

Hard rationales (:func:`top_k_masks`)
-------------------------------------
For each ``k`` (default :data:`DEFAULT_KS` = 5, 10, ..., 80, Chefer's protocol) the hard rationale is the ``k``
covered words of highest score. Conventions, named:

* **ties**: a stable descending sort, so among equal scores the word with the smaller index comes first (Chefer
  uses ``torch.topk``, whose order among ties is unspecified);
* **uncovered words never enter a hard rationale**: Chefer's word list holds only the words of the input, so a
  ``k`` larger than the number of covered words gives all covered words (his ``topk`` would raise). Their
  evidence still counts against recall: the truth is the whole document's;
* **one top-k per k**: the rationale at ``k`` is the top ``k`` only. Chefer's script never resets its list of
  predicted spans between ``k``, so its file for ``k`` holds the concatenation of the top-5, top-10, ..., top-k
  lists: the same *set* of tokens when his ``topk`` orders ties consistently (token P/R/F1 are set-based, so
  unaffected), but with duplicated one-token spans;
* **spans are maximal runs**: Chefer writes every chosen word as its own one-token span, so ERASER's IOU-F1 of
  his files compares single words with multi-word evidence (near 0); here a hard rationale's spans are its
  maximal runs of consecutive words (token P/R/F1 are the same either way).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

#: Chefer's k: the top 5, 10, ..., 80 words
DEFAULT_KS: Tuple[int, ...] = tuple(range(5, 85, 5))

Spans = List[Tuple[int, int]]


def check_ks(ks: Sequence[int]) -> Tuple[int, ...]:
    """``ks`` as a tuple of strictly increasing positive ints (an error naming them otherwise)."""
    out = tuple(int(k) for k in ks)
    if not out or any(k < 1 for k in out) or any(a >= b for a, b in zip(out, out[1:])) \
            or any(int(k) != k for k in ks):
        raise ValueError(f"ks must be strictly increasing positive integers, got {list(ks)}")
    return out


def word_ranking(scores: Tensor, covered: Tensor) -> Tensor:
    """``[B, W]`` rank of every word (0 = first): covered words by descending score, ties by smaller word index
    (stable sort), then every uncovered word (by index)."""
    if scores.shape != covered.shape or scores.dim() != 2:
        raise ValueError(f"expected scores and covered of the same shape [B, W], got {tuple(scores.shape)} and "
                         f"{tuple(covered.shape)}")
    if torch.isnan(scores[covered]).any():
        raise ValueError("word scores are NaN at a covered word")
    by_score = torch.sort(scores, dim=1, descending=True, stable=True).indices
    by_cover = torch.sort(covered.gather(1, by_score).to(torch.int8), dim=1, descending=True, stable=True).indices
    order = by_score.gather(1, by_cover)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order).contiguous())
    return ranks


def top_k_masks(scores: Tensor, covered: Tensor, ks: Sequence[int]) -> Tensor:
    """``[B, K, W]`` bool: the hard rationale of every ``k``, the ``min(k, covered words)`` covered words of highest
    score (ties: smaller word index first; uncovered words never chosen; module docstring)."""
    ks_t = torch.as_tensor(check_ks(ks), device=scores.device)
    ranks = word_ranking(scores, covered)
    limit = torch.minimum(ks_t[None, :], covered.sum(dim=1, keepdim=True))     # [B, K]
    return ranks[:, None, :] < limit[:, :, None]


# ============================================================================================= spans
def spans_from_mask(mask: Sequence[bool]) -> Spans:
    """The maximal runs of True in a 1-D mask as ``[(start, end), ...]`` (end exclusive, ERASER's convention)."""
    m = np.asarray(mask, dtype=bool).reshape(-1)
    edges = np.diff(np.concatenate([[0], m.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return [(int(s), int(e)) for s, e in zip(starts, ends)]


def batched_runs(mask: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Maximal runs of True of every row of ``mask [R, W]``: ``(starts, ends, valid)``, ``[R, M]`` each (``M``:
    the most runs of a row, at least 1), end exclusive; ``valid`` marks the real runs (row order kept)."""
    if mask.dim() != 2:
        raise ValueError(f"expected a mask [R, W], got shape {tuple(mask.shape)}")
    mask = mask.bool()
    r, w = mask.shape
    pad = torch.zeros(r, 1, dtype=torch.bool, device=mask.device)
    prev = torch.cat([pad, mask[:, :-1]], dim=1)
    nxt = torch.cat([mask[:, 1:], pad], dim=1)
    start_flag, end_flag = mask & ~prev, mask & ~nxt
    counts = start_flag.sum(dim=1)
    m = max(int(counts.max()) if r else 0, 1)
    starts = torch.zeros(r, m, dtype=torch.long, device=mask.device)
    ends = torch.zeros(r, m, dtype=torch.long, device=mask.device)
    for flag, out, shift in ((start_flag, starts, 0), (end_flag, ends, 1)):
        rows, cols = flag.nonzero(as_tuple=True)
        slots = (flag.cumsum(dim=1) - 1)[rows, cols]
        out[rows, slots] = cols + shift
    valid = torch.arange(m, device=mask.device)[None, :] < counts[:, None]
    return starts, ends, valid

