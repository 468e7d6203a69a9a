"""ERASER rationale metrics (DeYoung et al. 2020) and Chefer et al.'s token-F1 protocol, batched, without Lightning.

PROTOCOLS.md sections 4 and 8. Everything here works on **document words**: ERASER's whitespace tokens of the
flattened document (the tokens its evidence spans index), ``W`` per batch row, padded.

Token scores -> word scores (:func:`document_word_scores`)
--------------------------------------------------------
A word's score is the reduction (``max``, as Chefer's ``scores_per_word_from_scores_per_token``; ``sum``,
``mean``, ``absmax``: the same four as :data:`methods.words.REDUCTIONS`, and the same numbers as
:func:`methods.words.word_scores` on pre-split inputs) of the scores of the input positions whose ``word_ids``
name it. A word with no token in the input (the tail a truncation cut off, a word of characters the tokenizer
deletes) is **uncovered**: its score is 0 and ``covered`` is False.

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

Metrics as ERASER's scorer (``rationale_benchmark/metrics.py``) computes them
---------------------------------------------------------------------------
* token-level P/R/F1 (:func:`instance_prf`, :class:`TokenF1`): ERASER's ``score_hard_rationale_predictions``
  on token-level rationales (its ``token_prf``). ``instance_macro`` (what Chefer reports): per instance
  ``P = |pred & truth| / |pred|`` (0 without predictions), ``R = |pred & truth| / |truth|`` (0 without truth),
  ``F1 = 0 if P == 0 or R == 0 else 2PR / (P + R)``, then the **mean of P, of R and of F1** over the instances
  that have a predicted or a true token (an instance with neither is not one of ERASER's keys). ``instance_micro``:
  summed counts, ``P = sum |pred & truth| / sum |pred|``, ``R = sum |pred & truth| / sum |truth|``, F1 of those
  (NaN where ERASER would divide by zero).
* IOU-F1 (:func:`span_iou_matches`, :class:`SpanIOUF1`): ERASER's ``partial_match_score``. Predicted spans are
  the maximal runs of the hard rationale; a predicted span is a hit when its best IoU (``|p & t| / |p | t|`` over
  token sets) with a true span of the same instance is ``>= threshold`` (0.5). Micro: ``R = hits / true spans``,
  ``P = hits / predicted spans`` summed over instances (0 when a denominator is 0, as ERASER), F1 of those.
  Macro (ERASER's ``macro``, reported as ``iou_f1``; ERASER's scorer prints both): the mean of per-instance
  recall over instances with true spans and the mean of per-instance precision over instances with predicted
  spans, then **F1 of the two means** (unlike the token-level macro F1, which averages per-instance F1s).
  **True spans** are the maximal runs of the word-level truth mask; ERASER uses each evidence span as annotated,
  which is the same whenever no two evidence spans overlap or touch (true of every split of the Movie Reviews
  release: checked in the tests of this module).
* AUPRC (:func:`soft_auprc`, :class:`SoftAUPRC`): ERASER's ``_auprc``: per instance, sklearn's
  ``precision_recall_curve`` of the soft scores of **every document word** (uncovered words score 0) against the
  truth, its area by the trapezoidal rule (``sklearn.metrics.auc(recall, precision)``), averaged over instances.
  The curve has one point per distinct score (ties form one threshold) plus the point ``(recall 0, precision
  1)``. An instance without a true word has no recall (with the scikit-learn ERASER pins, 0.20, recall is 0 / 0 =
  NaN, which makes ERASER's average NaN; recent versions set it to 1 with a warning): it is **left out** of the
  average and counted (``skipped``). Every annotation of the Movie Reviews test split has evidence.

ERASER faithfulness (arithmetic on class probabilities only)
-----------------------------------------------------------
:func:`comprehensiveness`, :func:`sufficiency` (ERASER's ``score_classifications``) and :func:`aopc_drops`
(``_instances_aopc`` over :data:`ERASER_AOPC_BINS`), each ``p(c | full input) - p(c | perturbed input)`` for
the class ``c`` ERASER reads (its ``classification``, the predicted class), and their metric states
(:class:`Comprehensiveness`, :class:`Sufficiency`, :class:`AOPCComprehensiveness`, :class:`AOPCSufficiency`).

Every metric state is a float64 sum reduced with ``sum`` across processes, so one process and N processes that
see every instance once give the same values (up to the order of float64 sums).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor
from torchmetrics import Metric

#: the word reductions (equal to :data:`methods.words.REDUCTIONS`; kept here so this module needs no model code)
REDUCTIONS = ("max", "sum", "mean", "absmax")
#: Chefer's k: the top 5, 10, ..., 80 words
DEFAULT_KS: Tuple[int, ...] = tuple(range(5, 85, 5))
#: ERASER's default ``--aopc_thresholds``: fractions of the tokens removed (or kept)
ERASER_AOPC_BINS: Tuple[float, ...] = (0.01, 0.05, 0.1, 0.2, 0.5)
#: ERASER's default ``--iou_thresholds``
DEFAULT_IOU_THRESHOLD = 0.5

Spans = List[Tuple[int, int]]


# ============================================================================================= token -> word
def document_word_scores(token_scores: Tensor, word_ids: Tensor, word_offset: Optional[Tensor], num_words: Tensor,
                         reduction: str = "max") -> Tuple[Tensor, Tensor]:
    """Token scores -> scores of the document's words, batched (one ``scatter_reduce``, no loop over tokens).

    Args:
        token_scores: ``[B, N]`` scores of the input positions (any float dtype; the result keeps it).
        word_ids: ``[B, N]`` the **document** word index of each position (``datamodules.text_common`` batches
            carry it already shifted by the window's ``word_offset``); ``-1`` at special tokens and padding.
        word_offset: ``[B]`` index of each sample's first word (a window's start; 0 for a whole document), or
            ``None``. Only checked: a word id below it means the ids were not shifted to the document.
        num_words: ``[B]`` number of words of each whole document.
        reduction: ``max`` (Chefer's), ``sum``, ``mean`` or ``absmax`` (the signed score of largest magnitude;
            ``+a`` wins a tie with ``-a``), over the word's tokens.

    Returns:
        ``(scores, covered)``, both ``[B, W]`` with ``W = max(num_words)``: the reduced score of each word (0 where
        the word has no token in the input or lies beyond its document's end) and whether the word has a token.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown word reduction {reduction!r}; choose one of {REDUCTIONS}")
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
    values = token_scores[content]
    empty = torch.zeros(b * width, dtype=token_scores.dtype, device=token_scores.device)

    def scatter(op: str) -> Tensor:
        return empty.clone().scatter_reduce_(0, flat_index, values, reduce=op, include_self=False)

    if reduction == "max":
        flat = scatter("amax")
    elif reduction == "sum":
        flat = scatter("sum")
    elif reduction == "mean":
        flat = scatter("mean")
    else:
        hi, lo = scatter("amax"), scatter("amin")
        flat = torch.where(hi >= -lo, hi, lo)
    covered = torch.zeros(b * width, dtype=torch.bool, device=word_ids.device)
    covered[flat_index] = True
    flat = torch.where(covered, flat, torch.zeros_like(flat))   # include_self=False leaves 0 at uncovered words
    return flat.view(b, width), covered.view(b, width)


def word_mask(num_words: Tensor, width: int) -> Tensor:
    """``[B, width]`` bool: the word exists in its document (index below ``num_words``)."""
    num_words = torch.as_tensor(num_words).long()
    return torch.arange(width, device=num_words.device)[None, :] < num_words[:, None]


# ============================================================================================= hard rationales
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


def mask_from_spans(spans: Sequence[Tuple[int, int]], length: int) -> np.ndarray:
    """``[length]`` bool mask of the union of ``(start, end)`` spans (end exclusive); errors name a bad span."""
    out = np.zeros(int(length), dtype=bool)
    for start, end in spans:
        if not 0 <= int(start) < int(end) <= length:
            raise ValueError(f"span ({start}, {end}) is not a non-empty span of a document of {length} tokens")
        out[int(start):int(end)] = True
    return out


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


# ============================================================================================= per-instance metrics
def instance_prf(tp: Tensor, n_pred: Tensor, n_truth: Tensor) -> Dict[str, Tensor]:
    """ERASER's per-instance token P/R/F1 (``score_hard_rationale_predictions``) from counts (any shape):
    ``{"p", "r", "f1"}`` float64 and ``"included"`` (the instance is one of ERASER's keys: it has a predicted or a
    true token)."""
    tp, n_pred, n_truth = (torch.as_tensor(x).to(torch.float64) for x in (tp, n_pred, n_truth))
    p = torch.where(n_pred > 0, tp / n_pred.clamp(min=1), torch.zeros_like(tp))
    r = torch.where(n_truth > 0, tp / n_truth.clamp(min=1), torch.zeros_like(tp))
    f1 = torch.where((p > 0) & (r > 0), 2 * p * r / (p + r).clamp(min=1e-300), torch.zeros_like(tp))
    return {"p": p, "r": r, "f1": f1, "included": (n_pred > 0) | (n_truth > 0)}


def token_counts(hard: Tensor, truth: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """``hard [B, K, W]`` predicted rationales and ``truth [B, W]`` -> ``(tp, n_pred, n_truth)``, ``[B, K]`` long."""
    if hard.dim() != 3 or truth.dim() != 2 or hard.shape[0] != truth.shape[0] or hard.shape[2] != truth.shape[1]:
        raise ValueError(f"expected hard [B, K, W] and truth [B, W], got {tuple(hard.shape)} and "
                         f"{tuple(truth.shape)}")
    truth = truth.bool()
    tp = (hard & truth[:, None, :]).sum(dim=2)
    n_pred = hard.sum(dim=2)
    n_truth = truth.sum(dim=1, keepdim=True).expand_as(tp)
    return tp, n_pred, n_truth


def span_iou_matches(hard: Tensor, truth: Tensor, threshold: float = DEFAULT_IOU_THRESHOLD
                     ) -> Tuple[Tensor, Tensor, Tensor]:
    """ERASER's ``partial_match_score`` counts per instance and ``k``: ``(hits, n_pred_spans, n_true_spans)``,
    ``[B, K]`` long. Spans are maximal runs (module docstring); a predicted span is a hit when its best IoU with a
    true span is ``>= threshold``."""
    if hard.dim() != 3 or truth.dim() != 2 or hard.shape[0] != truth.shape[0] or hard.shape[2] != truth.shape[1]:
        raise ValueError(f"expected hard [B, K, W] and truth [B, W], got {tuple(hard.shape)} and "
                         f"{tuple(truth.shape)}")
    b, k, w = hard.shape
    ps, pe, pv = batched_runs(hard.reshape(b * k, w))                         # [BK, P]
    ts, te, tv = batched_runs(truth.bool())                                   # [B, T]
    ts, te, tv = (x.repeat_interleave(k, dim=0) for x in (ts, te, tv))         # [BK, T]
    inter = (torch.minimum(pe[:, :, None], te[:, None, :]) - torch.maximum(ps[:, :, None], ts[:, None, :])).clamp(min=0)
    union = (pe - ps)[:, :, None] + (te - ts)[:, None, :] - inter
    iou = inter.to(torch.float64) / union.clamp(min=1).to(torch.float64)
    iou = torch.where(pv[:, :, None] & tv[:, None, :], iou, torch.zeros_like(iou))
    best = iou.max(dim=2).values                                              # 0 when the instance has no true span
    hits = ((best >= threshold) & pv).sum(dim=1)
    return hits.view(b, k), pv.sum(dim=1).view(b, k), tv.sum(dim=1).view(b, k)


def soft_auprc(scores: Tensor, truth: Tensor, valid: Tensor) -> Tensor:
    """ERASER's per-instance AUPRC (``_auprc``: sklearn ``precision_recall_curve`` then ``auc(recall,
    precision)``), batched: ``[B]`` float64, NaN for an instance without a true word.

    ``scores [B, W]`` soft word scores, ``truth [B, W]`` bool, ``valid [B, W]`` the words of the document (each
    row's valid words must come first: words ``0 .. num_words - 1``). Thresholds are the distinct scores; the
    curve starts at (recall 0, precision 1); the area is the trapezoidal rule over consecutive points.
    """
    if not (scores.shape == truth.shape == valid.shape) or scores.dim() != 2:
        raise ValueError(f"expected scores, truth and valid of the same shape [B, W], got {tuple(scores.shape)}, "
                         f"{tuple(truth.shape)}, {tuple(valid.shape)}")
    scores = scores.to(torch.float64)
    valid, truth = valid.bool(), truth.bool() & valid.bool()
    if not torch.isfinite(scores[valid]).all():
        raise ValueError("soft word scores must be finite for the AUPRC")
    b, w = scores.shape
    keyed = scores.masked_fill(~valid, -np.inf)
    order = torch.sort(keyed, dim=1, descending=True, stable=True).indices
    s_sorted = keyed.gather(1, order)
    t_sorted = truth.gather(1, order)
    v_sorted = valid.gather(1, order)                                          # valid words first
    tps = t_sorted.to(torch.float64).cumsum(dim=1)
    predicted = torch.arange(1, w + 1, device=scores.device, dtype=torch.float64)[None, :]
    positives = truth.sum(dim=1, keepdim=True).to(torch.float64)
    precision = tps / predicted
    recall = tps / positives.clamp(min=1)
    nxt_differs = torch.ones_like(v_sorted)
    if w > 1:
        nxt_differs[:, :-1] = (s_sorted[:, 1:] != s_sorted[:, :-1]) | ~v_sorted[:, 1:]
    is_end = v_sorted & nxt_differs                                            # the last word of each tie group
    ends = torch.where(is_end, torch.arange(w, device=scores.device)[None, :], torch.full_like(order, -1))
    prev_end = torch.cat([torch.full((b, 1), -1, device=scores.device, dtype=torch.long),
                          ends.cummax(dim=1).values[:, :-1]], dim=1)
    has_prev = prev_end >= 0
    prev_r = torch.where(has_prev, recall.gather(1, prev_end.clamp(min=0)), torch.zeros_like(recall))
    prev_p = torch.where(has_prev, precision.gather(1, prev_end.clamp(min=0)), torch.ones_like(precision))
    area = torch.where(is_end, (recall - prev_r) * (precision + prev_p) / 2, torch.zeros_like(recall)).sum(dim=1)
    return torch.where(positives[:, 0] > 0, area, torch.full_like(area, float("nan")))


# ============================================================================================= metric states
def _f64(x: Any) -> Tensor:
    return torch.as_tensor(x).detach().to(torch.float64)


def _f1(p: Tensor, r: Tensor) -> Tensor:
    """ERASER's ``_f1``: 0 when either is 0, else the harmonic mean (NaN stays NaN)."""
    out = 2 * p * r / (p + r)
    return torch.where((p == 0) | (r == 0), torch.zeros_like(out), out)


def _ratio(num: Tensor, den: Tensor, empty: float) -> Tensor:
    return torch.where(den > 0, num / den.clamp(min=1e-300), torch.full_like(num, empty))


class TokenF1(Metric):
    """Token-level P/R/F1 per ``k`` as ERASER's ``token_prf`` (module docstring): float64 sums of per-instance
    P, R, F1 and of included instances (``instance_macro``), and of true positives, predicted and true tokens
    (``instance_micro``). ``compute`` gives ``{"p", "r", "f1", "micro_p", "micro_r", "micro_f1"}``, ``[K]`` each."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, num_ks: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_ks = int(num_ks)
        for name in ("sum_p", "sum_r", "sum_f1", "instances", "tp", "n_pred", "n_truth"):
            self.add_state(name, default=torch.zeros(self.num_ks, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, tp: Tensor, n_pred: Tensor, n_truth: Tensor) -> None:
        """Counts ``[B, K]`` of :func:`token_counts`."""
        tp, n_pred, n_truth = _f64(tp), _f64(n_pred), _f64(n_truth)
        if tp.dim() != 2 or tp.shape[1] != self.num_ks or n_pred.shape != tp.shape or n_truth.shape != tp.shape:
            raise ValueError(f"expected counts [B, {self.num_ks}], got {tuple(tp.shape)}, {tuple(n_pred.shape)}, "
                             f"{tuple(n_truth.shape)}")
        prf = instance_prf(tp, n_pred, n_truth)
        inc = prf["included"].to(torch.float64)
        self.sum_p += (prf["p"] * inc).sum(dim=0)
        self.sum_r += (prf["r"] * inc).sum(dim=0)
        self.sum_f1 += (prf["f1"] * inc).sum(dim=0)
        self.instances += inc.sum(dim=0)
        self.tp += tp.sum(dim=0)
        self.n_pred += n_pred.sum(dim=0)
        self.n_truth += n_truth.sum(dim=0)

    def compute(self) -> Dict[str, Tensor]:
        nan = float("nan")
        micro_p = _ratio(self.tp, self.n_pred, nan)
        micro_r = _ratio(self.tp, self.n_truth, nan)
        return {"p": _ratio(self.sum_p, self.instances, nan), "r": _ratio(self.sum_r, self.instances, nan),
                "f1": _ratio(self.sum_f1, self.instances, nan),
                "micro_p": micro_p, "micro_r": micro_r, "micro_f1": _f1(micro_p, micro_r)}


class SpanIOUF1(Metric):
    """IOU-F1 per ``k`` as ERASER's ``partial_match_score`` (module docstring): float64 sums of hits, predicted
    and true spans (micro), of per-instance recall over instances with true spans and of per-instance precision
    over instances with predicted spans (macro). ``compute`` gives ``{"f1", "p", "r", "micro_f1", "micro_p",
    "micro_r"}``, ``[K]`` each (``f1``: ERASER's macro F1)."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, num_ks: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_ks = int(num_ks)
        for name in ("hits", "n_pred", "n_truth", "sum_r", "with_truth", "sum_p", "with_pred"):
            self.add_state(name, default=torch.zeros(self.num_ks, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, hits: Tensor, n_pred: Tensor, n_truth: Tensor) -> None:
        """Counts ``[B, K]`` of :func:`span_iou_matches`."""
        hits, n_pred, n_truth = _f64(hits), _f64(n_pred), _f64(n_truth)
        if hits.dim() != 2 or hits.shape[1] != self.num_ks or n_pred.shape != hits.shape \
                or n_truth.shape != hits.shape:
            raise ValueError(f"expected counts [B, {self.num_ks}], got {tuple(hits.shape)}, {tuple(n_pred.shape)}, "
                             f"{tuple(n_truth.shape)}")
        self.hits += hits.sum(dim=0)
        self.n_pred += n_pred.sum(dim=0)
        self.n_truth += n_truth.sum(dim=0)
        self.sum_r += _ratio(hits, n_truth, 0.0).sum(dim=0)
        self.with_truth += (n_truth > 0).to(torch.float64).sum(dim=0)
        self.sum_p += _ratio(hits, n_pred, 0.0).sum(dim=0)
        self.with_pred += (n_pred > 0).to(torch.float64).sum(dim=0)

    def compute(self) -> Dict[str, Tensor]:
        micro_r, micro_p = _ratio(self.hits, self.n_truth, 0.0), _ratio(self.hits, self.n_pred, 0.0)
        r, p = _ratio(self.sum_r, self.with_truth, 0.0), _ratio(self.sum_p, self.with_pred, 0.0)
        return {"f1": _f1(p, r), "p": p, "r": r, "micro_f1": _f1(micro_p, micro_r), "micro_p": micro_p,
                "micro_r": micro_r}


class SoftAUPRC(Metric):
    """Mean per-instance AUPRC (ERASER's ``_auprc``): float64 sum and count of the instances with a true word, and
    the count of those without (``skipped``, module docstring). ``compute``: the mean (NaN without instances)."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name in ("total", "count", "skipped"):
            self.add_state(name, default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, values: Tensor) -> None:
        """Per-instance AUPRC ``[B]`` of :func:`soft_auprc` (NaN: no true word, skipped)."""
        values = _f64(values).flatten()
        keep = ~torch.isnan(values)
        self.total += values[keep].sum()
        self.count += keep.sum()
        self.skipped += (~keep).sum()

    def compute(self) -> Tensor:
        return self.total / self.count if self.count > 0 else torch.tensor(float("nan"), dtype=torch.float64)


# ============================================================================================= ERASER faithfulness
def _check_probabilities(probs: Tensor, name: str, leading: Tuple[int, ...]) -> Tensor:
    probs = torch.as_tensor(probs)
    if probs.dim() != len(leading) + 1 or tuple(probs.shape[:-1]) != leading:
        raise ValueError(f"expected {name} of shape {list(leading) + ['C']}, got {tuple(probs.shape)}")
    probs = probs.to(torch.float64)
    if ((probs < 0) | (probs > 1)).any() or not torch.allclose(probs.sum(dim=-1), torch.ones((), dtype=probs.dtype),
                                                               atol=1e-3):
        raise ValueError(f"{name} must be class probabilities (each row in [0, 1], summing to 1; ERASER requires "
                         "normalised distributions): pass softmax(logits), not logits")
    return probs


def class_probability_drop(full: Tensor, perturbed: Tensor, classes: Tensor) -> Tensor:
    """``[B]`` float64 ``p(c | full) - p(c | perturbed)`` for each instance's class ``c`` (``classes [B]``), from
    probabilities ``full [B, C]`` and ``perturbed [B, C]``."""
    classes = torch.as_tensor(classes).long()
    if classes.dim() != 1:
        raise ValueError(f"expected classes [B], got shape {tuple(classes.shape)}")
    b = classes.shape[0]
    full = _check_probabilities(full, "full-input probabilities", (b,))
    perturbed = _check_probabilities(perturbed, "perturbed-input probabilities", (b,))
    if perturbed.shape != full.shape:
        raise ValueError(f"full and perturbed probabilities differ in shape: {tuple(full.shape)} vs "
                         f"{tuple(perturbed.shape)}")
    if ((classes < 0) | (classes >= full.shape[1])).any():
        raise ValueError(f"classes must lie in [0, {full.shape[1]}), got {classes.tolist()}")
    idx = classes.to(full.device)[:, None]
    return (full.gather(1, idx) - perturbed.gather(1, idx))[:, 0]


def comprehensiveness(full: Tensor, without_rationale: Tensor, classes: Tensor) -> Tensor:
    """ERASER's comprehensiveness per instance (``score_classifications``): ``p(c | x) - p(c | x without r)``
    (``classification_scores[c] - comprehensiveness_classification_scores[c]``); higher is better. ERASER reads
    ``c`` = the instance's ``classification`` (the predicted class)."""
    return class_probability_drop(full, without_rationale, classes)


def sufficiency(full: Tensor, rationale_only: Tensor, classes: Tensor) -> Tensor:
    """ERASER's sufficiency per instance: ``p(c | x) - p(c | r only)`` (``classification_scores[c] -
    sufficiency_classification_scores[c]``); lower is better (the rationale alone keeps the prediction)."""
    return class_probability_drop(full, rationale_only, classes)


def aopc_drops(full: Tensor, perturbed_by_bin: Tensor, classes: Tensor) -> Tensor:
    """``[B, K]`` ``p(c | x) - p(c | x_k)`` per bin ``k`` (ERASER's ``_instances_aopc``: ``beta_0 - beta_k``), from
    ``full [B, C]`` and ``perturbed_by_bin [B, K, C]`` (the input with the top ``bins[k]`` fraction removed for
    comprehensiveness, or only it kept for sufficiency). Their mean over bins and instances is ERASER's AOPC."""
    perturbed_by_bin = torch.as_tensor(perturbed_by_bin)
    if perturbed_by_bin.dim() != 3:
        raise ValueError(f"expected perturbed_by_bin [B, K, C], got shape {tuple(perturbed_by_bin.shape)}")
    b, k, c = perturbed_by_bin.shape
    full = torch.as_tensor(full)
    if full.dim() != 2 or full.shape[0] != b:
        raise ValueError(f"expected full-input probabilities [B={b}, C], got shape {tuple(full.shape)}")
    flat = perturbed_by_bin.reshape(b * k, c)
    full_rep = full.repeat_interleave(k, dim=0)
    cls = torch.as_tensor(classes).long().repeat_interleave(k)
    return class_probability_drop(full_rep, flat, cls).view(b, k)


class ProbabilityDrop(Metric):
    """Mean of per-instance probability drops (float64 sum and count). Direction: :class:`Comprehensiveness`
    (higher is better), :class:`Sufficiency` (lower is better)."""

    full_state_update = False
    higher_is_better: Optional[bool] = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, drops: Tensor) -> None:
        drops = _f64(drops).flatten()
        if torch.isnan(drops).any():
            raise ValueError("probability drops must not be NaN")
        self.total += drops.sum()
        self.count += drops.numel()

    def compute(self) -> Tensor:
        return self.total / self.count if self.count > 0 else torch.tensor(float("nan"), dtype=torch.float64)


class Comprehensiveness(ProbabilityDrop):
    """ERASER comprehensiveness: removing the rationale should lower the class probability (higher is better)."""

    higher_is_better = True


class Sufficiency(ProbabilityDrop):
    """ERASER sufficiency: the rationale alone should keep the class probability (lower is better)."""

    higher_is_better = False


class AOPC(Metric):
    """ERASER's AOPC: float64 per-bin sums of :func:`aopc_drops` and the instance count. ``compute`` gives
    ``{"aopc": mean over instances and bins, "points": [K] mean per bin}`` (ERASER's ``*_aopc`` and
    ``*_aopc_points``). Direction: :class:`AOPCComprehensiveness`, :class:`AOPCSufficiency`."""

    full_state_update = False
    higher_is_better: Optional[bool] = None

    def __init__(self, num_bins: int = len(ERASER_AOPC_BINS), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_bins = int(num_bins)
        self.add_state("totals", default=torch.zeros(self.num_bins, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, drops: Tensor) -> None:
        """``drops [B, K]`` of :func:`aopc_drops` (every instance has every bin, as ERASER asserts)."""
        drops = _f64(drops)
        if drops.dim() != 2 or drops.shape[1] != self.num_bins:
            raise ValueError(f"expected drops [B, {self.num_bins}], got {tuple(drops.shape)}")
        if torch.isnan(drops).any():
            raise ValueError("AOPC drops must not be NaN (ERASER needs every bin of every instance)")
        self.totals += drops.sum(dim=0)
        self.count += drops.shape[0]

    def compute(self) -> Dict[str, Tensor]:
        if self.count == 0:
            nan = torch.full((self.num_bins,), float("nan"), dtype=torch.float64)
            return {"aopc": nan[0], "points": nan}
        points = self.totals / self.count
        return {"aopc": points.mean(), "points": points}


class AOPCComprehensiveness(AOPC):
    """AOPC of comprehensiveness (higher is better)."""

    higher_is_better = True


class AOPCSufficiency(AOPC):
    """AOPC of sufficiency (lower is better)."""

    higher_is_better = False
