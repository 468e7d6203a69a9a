"""Token scores ``[B, N]`` -> scores of the words of the original text.

    batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")   # a fast tokenizer
    scores = build_method("gradcam")(model, batch, target=labels)                  # [B, N]
    result = word_scores(scores, batch, texts, reduction="max")                    # whitespace words
    result[0].words, result[0].spans, result[0].scores                            # one sample
    result.scores, result.mask                                                     # [B, W] for metric code

A text datamodule's batch names each token's word already (``word_ids``, ``datamodules.text_common``):
:func:`word_attribution_from_ids` makes one sample's result from it (the heatmap callbacks), and
:func:`evaluation.words.reductions.document_word_scores` the padded scores of a batch (the rationale test).

**Which words.** ``words="whitespace"`` (default): the whitespace-separated words of each original string, exactly
``text.split()`` (Python's whitespace, Unicode included), with their character spans. ``words="tokenizer"``: the
tokenizer's own pre-tokenized words (for BERT: whitespace, then every punctuation character and every CJK
character is a word of its own), read from the tokenizer run on the whole text without truncation (so it needs
``tokenizer=``); a word's span runs from its first token's first character to its last token's last character.
A **pre-split** sample (a list of words, the batch tokenized with ``is_split_into_words=True``, as ERASER's
whitespace-split documents are) has exactly the given words, in order, even empty ones; its text is the words
joined by one space.

**Which tokens belong to a word.** Never a special token, a padding position or a token of the other text of a
pair (``sequence`` picks the text); never a token whose character span is empty. For strings: a token belongs to
every word its character span overlaps (the tokenizer's ``offset_mapping``; with a standard pre-tokenizer a
token never crosses whitespace, so a token has at most one word). For pre-split samples: the tokenizer's
``word_ids()`` (which index the given list).

**Reductions** over a word's token scores: :mod:`evaluation.words.reductions`. **Uncovered words**: a word none
of whose tokens is in the input (truncation removed them all, or the tokenizer dropped every character of it,
e.g. a word of control characters or an empty word of a pre-split list) is not scored (:class:`WordAttribution`,
:class:`WordAttributions` say how each form marks it).

The alignment reads the batch's per-token offsets, word ids, special-token mask and sequence ids from the fast
tokenizer's encodings (``batch.encodings``, kept by a ``BatchEncoding`` and its ``.to(device)``); a plain mapping
works for strings if it holds ``offset_mapping`` (``return_offsets_mapping=True``) and ``attention_mask``
(better also ``special_tokens_mask``; without it a token with an empty span counts as special).
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .heatmap import text_heatmap_html
from .reductions import check_reduction, reduce_tokens

WORD_DEFINITIONS = ("whitespace", "tokenizer")

_WHITESPACE_WORD = re.compile(r"\S+")  # the same characters as str.split(): both use str.isspace()

Span = Tuple[int, int]
TextInput = Union[str, Sequence[str]]


@dataclass
class WordAttribution:
    """The word scores of one sample.

    * ``text``: the original string (a pre-split sample: its words joined by one space);
    * ``words``: the words, ``words[w] == text[spans[w][0]:spans[w][1]]``;
    * ``spans``: ``(start, end)`` character span of each word in ``text``;
    * ``scores``: ``[W]`` reduced scores, NaN where the word is not covered;
    * ``covered``: ``[W]`` bool, the word has at least one token in the input;
    * ``tokens``: the input positions (indices into ``N``) of each word's tokens;
    * ``reduction``, ``word_definition``: how the scores were made.
    """

    text: str
    words: List[str]
    spans: List[Span]
    scores: Tensor
    covered: Tensor
    tokens: List[List[int]]
    reduction: str = "max"
    word_definition: str = "whitespace"

    @property
    def coverage(self) -> float:
        """Fraction of the words that are scored (1.0 when there are no words)."""
        return float(self.covered.float().mean()) if len(self.words) else 1.0

    def __len__(self) -> int:
        return len(self.words)

    def pairs(self) -> List[Tuple[str, float]]:
        """``[(word, score), ...]`` as Python floats (NaN for uncovered words)."""
        return [(w, float(s)) for w, s in zip(self.words, self.scores.tolist())]

    def _repr_html_(self) -> str:
        return text_heatmap_html(self)


@dataclass
class WordAttributions:
    """Word scores of a batch: the per-sample results and a padded form for metric code.

    * ``samples``: one :class:`WordAttribution` per sample;
    * ``scores``: ``[B, W]`` (``W`` the most words of any sample), 0 where a word is not covered or absent;
    * ``mask``: ``[B, W]`` bool, the word exists and is scored;
    * ``word_mask``: ``[B, W]`` bool, the word exists (scored or not);
    * ``coverage``: ``[B]`` fraction of each sample's words that are scored.
    """

    samples: List[WordAttribution]
    scores: Tensor
    mask: Tensor
    word_mask: Tensor
    coverage: Tensor = field(repr=False)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> WordAttribution:
        return self.samples[index]

    def __iter__(self) -> Iterator[WordAttribution]:
        return iter(self.samples)

    def _repr_html_(self) -> str:
        return text_heatmap_html(self)


# ------------------------------------------------------------------------------------------------ word definitions
def whitespace_words(text: str) -> Tuple[List[str], List[Span]]:
    """The words of ``text.split()`` and their character spans."""
    found = [(m.group(), m.span()) for m in _WHITESPACE_WORD.finditer(text)]
    return [w for w, _ in found], [s for _, s in found]


def presplit_words(words: Sequence[str]) -> Tuple[str, List[Span]]:
    """The text of a pre-split sample (the words joined by one space) and each word's span in it."""
    spans, pos = [], 0
    for w in words:
        if not isinstance(w, str):
            raise TypeError(f"a pre-split sample must be a list of str, got an item of type {type(w).__name__}")
        spans.append((pos, pos + len(w)))
        pos += len(w) + 1
    return " ".join(words), spans


def tokenizer_words(text: str, tokenizer) -> Tuple[List[str], List[Span]]:
    """The tokenizer's pre-tokenized words of ``text`` (the whole text, no truncation) and their spans: a word runs
    from its first token's first character to its last token's last character."""
    if not text:
        return [], []
    enc = tokenizer(text, add_special_tokens=False, truncation=False, padding=False, verbose=False)
    encodings = getattr(enc, "encodings", None)
    if not encodings:
        raise ValueError("words='tokenizer' needs a fast tokenizer (one whose output has .encodings)")
    e = encodings[0]
    bounds: dict = {}
    for word, (s, t) in zip(e.word_ids, e.offsets):
        if word is None or t <= s:
            continue
        lo, hi = bounds.get(word, (s, t))
        bounds[word] = (min(lo, s), max(hi, t))
    spans = sorted(bounds.values())
    return [text[s:t] for s, t in spans], spans


# ------------------------------------------------------------------------------------------------ token alignment
@dataclass
class _TokenInfo:
    """What the alignment needs of one sample of the batch."""

    offsets: List[Span]
    content: List[bool]          # a real (not padding, not special) token of the chosen sequence
    word_ids: Optional[List[Optional[int]]]


def _as_list(x) -> list:
    return x.tolist() if hasattr(x, "tolist") else list(x)


def _token_info(batch, n_samples: int, length: int, sequence: int) -> List[_TokenInfo]:
    encodings = getattr(batch, "encodings", None)
    if encodings:
        if len(encodings) != n_samples:
            raise ValueError(f"the batch holds {len(encodings)} samples but the scores {n_samples}")
        out = []
        for e in encodings:
            if len(e.ids) != length:
                raise ValueError(f"the batch's sequences have {len(e.ids)} positions but the scores {length}")
            content = [bool(a) and not sp and sid == sequence
                       for a, sp, sid in zip(e.attention_mask, e.special_tokens_mask, e.sequence_ids)]
            out.append(_TokenInfo(list(e.offsets), content, list(e.word_ids)))
        return out
    if not isinstance(batch, Mapping) or "offset_mapping" not in batch:
        raise ValueError("cannot align tokens to words: pass the BatchEncoding a fast tokenizer returned (it keeps "
                         ".encodings), or a mapping with 'offset_mapping' (return_offsets_mapping=True)")
    offsets = _as_list(batch["offset_mapping"])
    if len(offsets) != n_samples or any(len(o) != length for o in offsets):
        raise ValueError("the batch's offset_mapping does not have the shape of the scores")
    attention = _as_list(batch["attention_mask"]) if "attention_mask" in batch else None
    special = _as_list(batch["special_tokens_mask"]) if "special_tokens_mask" in batch else None
    types = _as_list(batch["token_type_ids"]) if "token_type_ids" in batch else None
    if types is None and sequence != 0:
        raise ValueError("sequence != 0 needs the batch's encodings or its token_type_ids")
    out = []
    for i in range(n_samples):
        offs = [(int(s), int(t)) for s, t in offsets[i]]
        content = []
        for j, (s, t) in enumerate(offs):
            ok = attention is None or bool(attention[i][j])
            ok = ok and (not special[i][j] if special is not None else t > s)
            ok = ok and (types is None or int(types[i][j]) == sequence)
            content.append(ok)
        out.append(_TokenInfo(offs, content, None))
    return out


def _tokens_by_overlap(info: _TokenInfo, spans: List[Span], text: str) -> List[List[int]]:
    starts = [s for s, _ in spans]
    ends = [t for _, t in spans]
    tokens: List[List[int]] = [[] for _ in spans]
    for j, ((s, t), ok) in enumerate(zip(info.offsets, info.content)):
        if not ok or t <= s:
            continue
        if t > len(text):
            raise ValueError(f"a token spans characters {s}:{t} of a text of {len(text)} characters: the texts do "
                             f"not match the batch (a pre-split batch needs its lists of words)")
        w = bisect.bisect_right(ends, s)          # the first word that ends after the token starts
        while w < len(spans) and starts[w] < t:
            tokens[w].append(j)
            w += 1
    return tokens


def _tokens_by_word_ids(info: _TokenInfo, n_words: int) -> List[List[int]]:
    if info.word_ids is None:
        raise ValueError("a pre-split sample needs the batch's encodings (the BatchEncoding of a fast tokenizer "
                         "called with is_split_into_words=True) for its word ids")
    tokens: List[List[int]] = [[] for _ in range(n_words)]
    for j, (word, ok, (s, t)) in enumerate(zip(info.word_ids, info.content, info.offsets)):
        if not ok or word is None or t <= s:
            continue
        if word >= n_words:
            raise ValueError(f"a token belongs to word {word} of a sample of {n_words} words: the word lists do "
                             f"not match the batch")
        tokens[word].append(j)
    return tokens


# ------------------------------------------------------------------------------------------------ main entry
def word_scores(
    scores: Tensor,
    batch,
    texts: Union[TextInput, Sequence[TextInput]],
    *,
    words: str = "whitespace",
    reduction: str = "max",
    tokenizer=None,
    sequence: int = 0,
) -> WordAttributions:
    """Map token scores ``[B, N]`` (a method's output on ``batch``) to the words of ``texts``.

    ``batch``: what the fast tokenizer returned for ``texts`` (see the module docstring); ``texts``: the ``B``
    original strings, or ``B`` lists of words for a batch tokenized with ``is_split_into_words=True`` (a bare
    string is a batch of one; one pre-split sample is ``[words]``); ``words``: ``"whitespace"`` or
    ``"tokenizer"`` (needs ``tokenizer``; not for pre-split samples, whose words are given); ``reduction``: one of
    :data:`~evaluation.words.reductions.REDUCTIONS`; ``sequence``: which text of a pair ``texts`` are (0: the
    first, 1: the second).

    Returns a :class:`WordAttributions` (per-sample results and the padded ``[B, W]`` form), on the scores'
    device, in their dtype.
    """
    if words not in WORD_DEFINITIONS:
        raise ValueError(f"unknown word definition {words!r}; choose one of {WORD_DEFINITIONS}")
    check_reduction(reduction)
    scores = torch.as_tensor(scores)
    if scores.dim() != 2:
        raise ValueError(f"expected token scores [B, N], got shape {tuple(scores.shape)}")
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    n_samples, length = scores.shape
    if len(texts) != n_samples:
        raise ValueError(f"{len(texts)} texts for {n_samples} samples of scores")
    infos = _token_info(batch, n_samples, length, sequence)
    if not scores.dtype.is_floating_point:
        scores = scores.to(torch.get_default_dtype())

    samples: List[WordAttribution] = []
    for i, (item, info) in enumerate(zip(texts, infos)):
        if isinstance(item, str):
            text = item
            if words == "whitespace":
                word_list, spans = whitespace_words(text)
            else:
                if tokenizer is None:
                    raise ValueError("words='tokenizer' needs tokenizer= (the tokenizer that made the batch)")
                word_list, spans = tokenizer_words(text, tokenizer)
            tokens = _tokens_by_overlap(info, spans, text)
            definition = words
        elif isinstance(item, (list, tuple)):
            if words != "whitespace":
                raise ValueError("a pre-split sample has the words it was given: use words='whitespace' (the default)")
            word_list = list(item)
            text, spans = presplit_words(word_list)
            tokens = _tokens_by_word_ids(info, len(word_list))
            definition = "given"
        else:
            raise TypeError(f"texts[{i}] must be a str or a list of str, got {type(item).__name__}")
        word_index = torch.tensor([w for w, toks in enumerate(tokens) for _ in toks], dtype=torch.long,
                                  device=scores.device)
        positions = torch.tensor([j for toks in tokens for j in toks], dtype=torch.long, device=scores.device)
        reduced = reduce_tokens(scores[i, positions], word_index, len(word_list), reduction)
        covered = torch.tensor([bool(t) for t in tokens], dtype=torch.bool, device=scores.device)
        samples.append(WordAttribution(text=text, words=word_list, spans=list(spans), scores=reduced,
                                       covered=covered, tokens=tokens, reduction=reduction,
                                       word_definition=definition))
    return _pad(samples, scores)


def word_attribution_from_ids(token_scores: Tensor, word_ids: Tensor, words: Sequence[str], word_offset: int = 0,
                              reduction: str = "max") -> WordAttribution:
    """The :class:`WordAttribution` (float64, on the CPU) of one sample of a text batch (``datamodules.text_common``)
    whose tokens name their words: ``token_scores`` ``[N]``, ``word_ids`` ``[N]`` (document word index per
    position, -1 at special tokens and padding), ``words`` the sample's words (document words ``word_offset,
    word_offset + 1, ...``; its text is them joined by one space)."""
    check_reduction(reduction)
    positions = (word_ids >= 0).nonzero().flatten().cpu()
    index = word_ids.long().cpu()[positions] - int(word_offset)
    outside = (index < 0) | (index >= len(words))
    if outside.any():
        j = int(outside.nonzero()[0])
        raise ValueError(f"token {int(positions[j])} points at word {int(index[j]) + word_offset} outside the "
                         f"sample's {len(words)} words (offset {word_offset})")
    tokens: List[List[int]] = [[] for _ in words]
    for position, w in zip(positions.tolist(), index.tolist()):
        tokens[w].append(position)
    scores = reduce_tokens(token_scores.detach().double().cpu()[positions], index, len(words), reduction)
    text, spans = presplit_words(list(words))
    return WordAttribution(text=text, words=list(words), spans=spans, scores=scores, covered=~torch.isnan(scores),
                           tokens=tokens, reduction=reduction, word_definition="whitespace")


def _pad(samples: List[WordAttribution], scores: Tensor) -> WordAttributions:
    width = max((len(s) for s in samples), default=0)
    padded = torch.zeros(len(samples), width, dtype=scores.dtype, device=scores.device)
    mask = torch.zeros(len(samples), width, dtype=torch.bool, device=scores.device)
    word_mask = torch.zeros_like(mask)
    for i, s in enumerate(samples):
        n = len(s)
        word_mask[i, :n] = True
        mask[i, :n] = s.covered
        padded[i, :n] = torch.where(s.covered, s.scores, torch.zeros_like(s.scores))
    coverage = torch.tensor([s.coverage for s in samples], dtype=torch.float64)
    return WordAttributions(samples=samples, scores=padded, mask=mask, word_mask=word_mask, coverage=coverage)
