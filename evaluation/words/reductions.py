"""Token scores -> word scores: the one reduction every word score of the project goes through.

:func:`reduce_tokens` reduces the scores of the tokens of each word, given the word of every token:

* ``max`` (what Chefer et al.'s Transformer-Explainability code does for ERASER: its
  ``scores_per_word_from_scores_per_token``), ``sum``, ``mean``;
* ``absmax``: the signed score of largest magnitude; a tie between ``+a`` and ``-a`` gives ``+a``.

A word without a token is NaN there. The callers differ only in how they find each token's word:
:func:`evaluation.words.mapping.word_scores` (the tokenizer's offsets or word ids, per sample),
:func:`evaluation.words.mapping.word_attribution_from_ids` (a text batch's ``word_ids``, one sample) and
:func:`document_word_scores` (a text batch's ``word_ids``, batched over the documents: ERASER's whitespace
tokens of the flattened document, the words its evidence spans index), so the same tokens give the same numbers.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

REDUCTIONS = ("max", "sum", "mean", "absmax")


def check_reduction(reduction: str) -> str:
    """``reduction`` if it is one of :data:`REDUCTIONS` (an error naming them otherwise)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown word reduction {reduction!r}; choose one of {REDUCTIONS}")
    return reduction


def reduce_tokens(values: Tensor, word_index: Tensor, n_words: int, reduction: str = "max") -> Tensor:
    """``[n_words]``: ``values[k]`` (token scores) reduced per word ``word_index[k]`` (one ``scatter_reduce``);
    NaN for a word without tokens. ``reduction`` is one of :data:`REDUCTIONS`; an integer ``values`` is reduced
    in the default float dtype, a float one in its own."""
    check_reduction(reduction)
    dtype = values.dtype if values.dtype.is_floating_point else torch.get_default_dtype()
    values = values.to(dtype)
    empty = torch.full((n_words,), math.nan, dtype=dtype, device=values.device)
    if values.numel() == 0:
        return empty

    def scatter(op: str) -> Tensor:
        return empty.clone().scatter_reduce_(0, word_index, values, reduce=op, include_self=False)

    if reduction != "absmax":
        return scatter("amax" if reduction == "max" else reduction)
    hi, lo = scatter("amax"), scatter("amin")
    return torch.where(hi >= -lo, hi, lo)      # NaN (no tokens) compares False and stays NaN via lo


def document_word_scores(token_scores: Tensor, word_ids: Tensor, word_offset: Optional[Tensor], num_words: Tensor,
                         reduction: str = "max") -> Tuple[Tensor, Tensor]:
    """Token scores -> scores of the document's words, batched (one :func:`reduce_tokens`, no loop over tokens).

    Args:
        token_scores: ``[B, N]`` scores of the input positions (any float dtype; the result keeps it).
        word_ids: ``[B, N]`` the **document** word index of each position (``datamodules.text_common`` batches
            carry it already shifted by the window's ``word_offset``); ``-1`` at special tokens and padding.
        word_offset: ``[B]`` index of each sample's first word (a window's start; 0 for a whole document), or
            ``None``. Only checked: a word id below it means the ids were not shifted to the document.
        num_words: ``[B]`` number of words of each whole document.
        reduction: one of :data:`REDUCTIONS`, over the word's tokens.

    Returns:
        ``(scores, covered)``, both ``[B, W]`` with ``W = max(num_words)``: the reduced score of each word (0 where
        the word has no token in the input, e.g. the tail a truncation cut off, or lies beyond its document's end)
        and whether the word has a token. The same numbers as :func:`evaluation.words.mapping.word_scores` on
        pre-split inputs.
    """
    check_reduction(reduction)
    token_scores, word_ids = torch.as_tensor(token_scores), torch.as_tensor(word_ids)
    if token_scores.dim() != 2 or word_ids.shape != token_scores.shape:
        raise ValueError(f"expected token_scores and word_ids of the same shape [B, N], got "
                         f"{tuple(token_scores.shape)} and {tuple(word_ids.shape)}")
    b, n = token_scores.shape
    num_words = torch.as_tensor(num_words, device=word_ids.device).long()
    if num_words.shape != (b,):
        raise ValueError(f"expected num_words [B={b}], got shape {tuple(num_words.shape)}")
    if (num_words < 0).any():
        raise ValueError(f"num_words must be >= 0, got {num_words.tolist()}")
    if not token_scores.dtype.is_floating_point:
        token_scores = token_scores.to(torch.get_default_dtype())
    word_ids = word_ids.long()
    content = word_ids >= 0
    bad = content & (word_ids >= num_words[:, None])
    if bad.any():
        i = int(bad.any(dim=1).nonzero()[0])
        raise ValueError(f"word_ids of sample {i} reach word {int(word_ids[i].max())} but its document has "
                         f"{int(num_words[i])} words")
    if word_offset is not None:
        word_offset = torch.as_tensor(word_offset, device=word_ids.device).long()
        if word_offset.shape != (b,):
            raise ValueError(f"expected word_offset [B={b}], got shape {tuple(word_offset.shape)}")
        below = content & (word_ids < word_offset[:, None])
        if below.any():
            i = int(below.any(dim=1).nonzero()[0])
            raise ValueError(f"sample {i} has word ids below its word_offset {int(word_offset[i])}: word_ids must "
                             "be document word indices (the window's index + word_offset)")
    if torch.isnan(token_scores[content]).any():
        raise ValueError("token_scores are NaN at some content position (a token with a word id)")

    width = int(num_words.max()) if b else 0
    flat_index = (torch.arange(b, device=word_ids.device)[:, None] * width + word_ids.clamp(min=0))[content]
    flat = reduce_tokens(token_scores[content], flat_index, b * width, reduction)
    covered = torch.zeros(b * width, dtype=torch.bool, device=word_ids.device)
    covered[flat_index] = True
    flat = torch.where(covered, flat, torch.zeros_like(flat))
    return flat.view(b, width), covered.view(b, width)


def word_mask(num_words: Tensor, width: int) -> Tensor:
    """``[B, width]`` bool: the word exists in its document (index below ``num_words``)."""
    num_words = torch.as_tensor(num_words).long()
    return torch.arange(width, device=num_words.device)[None, :] < num_words[:, None]
