"""Text heatmaps of word scores (:mod:`evaluation.words.mapping`) as HTML, for notebooks and evaluation callbacks.

    result = word_scores(scores, batch, texts)                       # evaluation.words
    html = text_heatmap_html(result, labels=labels, predictions=preds, class_names=["neg", "pos"])
    write_text_heatmap("heatmaps.html", {"gradcam": r1, "rollout": r2}, titles=ids)   # one row per method
    TextHeatmap({"gradcam": r1, "rollout": r2})                      # a notebook cell displays it

Each example (one text) is a block: an optional title, label and prediction, then one row per method with the
words of the text coloured by their scores over the text's own characters (the characters between words are
shown uncoloured, so the original text reads as it was written). Colours diverge at 0: white at 0, red for
positive scores, blue for negative ones, full colour at ``|score| >= scale``. ``scale="row"`` (default): each row
by its own largest absolute score; ``"example"``: the largest absolute score of all rows of an example (methods
compared on one scale); a number: that scale everywhere. A word that is not scored (no token in the input, e.g.
truncated) is grey with a dotted underline. Hovering a word shows its score. Every piece of text (words, titles,
labels, method names) is HTML-escaped; control and bidirectional formatting characters are shown as escapes
(``\\x00``, ``\\u202e``).
"""
from __future__ import annotations

import html as _html
import math
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple, Union, runtime_checkable

from torch import Tensor


@runtime_checkable
class WordRow(Protocol):
    """What a heatmap reads of one text's scores: the fields of :class:`evaluation.words.mapping.WordAttribution`
    (that module imports this one for its ``_repr_html_``, so results are recognised here by their fields). A
    batch (:class:`~evaluation.words.mapping.WordAttributions`) is anything with a list of them as ``samples``."""

    text: str
    words: List[str]
    spans: List[Tuple[int, int]]
    scores: Tensor
    covered: Tensor
    reduction: str
    coverage: float


#: what :func:`text_heatmap_html` draws: a row, a batch (``samples``: a list of rows) or a mapping of method names
#: to rows, batches or lists of rows
Results = Any

POSITIVE = (178, 24, 43)    # red (ColorBrewer RdBu end)
NEGATIVE = (33, 102, 172)   # blue (ColorBrewer RdBu end)
WHITE = (255, 255, 255)

STYLE = """
.ta-heatmap{font-family:-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,"Liberation Sans","DejaVu Sans",
  "Noto Sans","Noto Sans CJK SC","Microsoft YaHei","WenQuanYi Micro Hei","Apple Color Emoji","Segoe UI Emoji",
  "Noto Color Emoji",sans-serif;
  font-size:15px;line-height:1.9;color:#222;max-width:1100px}
.ta-heatmap .ta-legend{display:flex;align-items:center;gap:10px;margin:4px 0 12px 0;font-size:12px;color:#444;
  flex-wrap:wrap}
.ta-heatmap .ta-bar{width:220px;height:12px;border:1px solid #bbb;border-radius:2px}
.ta-heatmap .ta-bar-labels{display:flex;justify-content:space-between;width:222px;font-size:11px}
.ta-heatmap .ta-example{border:1px solid #ddd;border-radius:6px;padding:8px 12px;margin:0 0 12px 0}
.ta-heatmap .ta-header{font-size:13px;color:#333;margin-bottom:4px;display:flex;gap:16px;flex-wrap:wrap}
.ta-heatmap .ta-title{font-weight:600}
.ta-heatmap .ta-wrong{color:#b2182b;font-weight:600}
.ta-heatmap .ta-right{color:#1a7f37;font-weight:600}
.ta-heatmap table{border-collapse:collapse;width:100%}
.ta-heatmap th.ta-method{text-align:left;vertical-align:top;font-weight:600;font-size:12px;padding:6px 12px 6px 0;
  white-space:nowrap;color:#333;width:1%}
.ta-heatmap .ta-scale{display:block;font-weight:400;color:#777;font-size:11px}
.ta-heatmap td.ta-text{padding:4px 0;white-space:pre-wrap;word-break:break-word;border-top:1px solid #f0f0f0}
.ta-heatmap tr:first-child td.ta-text{border-top:none}
.ta-heatmap .ta-w{border-radius:3px;padding:1px 1px}
.ta-heatmap .ta-uncovered{color:#999;text-decoration:underline dotted #999}
.ta-heatmap .ta-empty{color:#999;font-style:italic}
"""


# ------------------------------------------------------------------------------------------------ pieces
#: bidirectional formatting characters: shown as escapes so that a word cannot reorder the text after it
_BIDI = frozenset([0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)])


def _visible(text: str) -> str:
    """``text`` with control characters (C0 other than tab, newline and carriage return, DEL, C1) as ``\\xNN``,
    bidirectional formatting characters as ``\\uNNNN`` (plain ASCII: every font shows it) and lone surrogates as
    U+FFFD, so the page is valid HTML, can be written as UTF-8 and shows what the text holds."""
    out = []
    for ch in text:
        o = ord(ch)
        if (o < 0x20 and ch not in "\t\n\r") or 0x7F <= o <= 0x9F:
            out.append(f"\\x{o:02x}")
        elif o in _BIDI:
            out.append(f"\\u{o:04x}")
        elif 0xD800 <= o <= 0xDFFF:
            out.append("\ufffd")
        else:
            out.append(ch)
    return "".join(out)


def escape(text) -> str:
    """HTML-escape ``str(text)`` (``&``, ``<``, ``>``, both quotes) after :func:`_visible`."""
    return _html.escape(_visible(str(text)), quote=True)


def score_color(score: float, scale: float) -> tuple:
    """``(r, g, b)`` of ``score`` on the diverging map: white at 0, :data:`POSITIVE` at ``+scale`` and beyond,
    :data:`NEGATIVE` at ``-scale`` and beyond."""
    if math.isnan(score):
        return WHITE
    t = 0.0 if scale <= 0 else min(abs(score) / scale, 1.0)
    end = POSITIVE if score > 0 else NEGATIVE
    return tuple(int(round(w + (e - w) * t)) for w, e in zip(WHITE, end))


def _fmt(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.3g}"


def _max_abs(row: WordRow) -> float:
    vals = [abs(v) for v in row.scores.tolist() if math.isfinite(v)]
    return max(vals, default=0.0)


def _row_html(row: WordRow, scale: float) -> str:
    """The text of ``row`` with each word in a coloured span."""
    text, pieces, pos = row.text, [], 0
    if not text.strip():
        return '<span class="ta-empty">(empty text)</span>'
    scores = row.scores.tolist()
    covered = row.covered.tolist()
    for (s, t), word, score, cov in sorted(zip(row.spans, row.words, scores, covered), key=lambda x: x[0]):
        if s < pos or t <= s:
            continue                               # an empty or overlapping word: nothing more to colour
        pieces.append(escape(text[pos:s]))
        if not cov:
            pieces.append(f'<span class="ta-w ta-uncovered" title="{escape(word)}: not scored (no token in the '
                          f'input)">{escape(text[s:t])}</span>')
        else:
            r, g, b = score_color(score, scale)
            fg = "#fff" if (0 if scale <= 0 else min(abs(score) / scale, 1.0)) > 0.55 else "#111"
            pieces.append(f'<span class="ta-w" style="background-color:rgb({r},{g},{b});color:{fg}" '
                          f'title="{escape(word)}: {_fmt(score)}">{escape(text[s:t])}</span>')
        pos = t
    pieces.append(escape(text[pos:]))
    return "".join(pieces)


def _gradient() -> str:
    neg, pos = (f"rgb({r},{g},{b})" for r, g, b in (NEGATIVE, POSITIVE))
    return f"linear-gradient(to right,{neg},rgb(255,255,255),{pos})"


def legend_html(scale: Union[str, float] = "row", unscored: bool = True, where: str = "under the method's name") -> str:
    """The colour bar with its end values, what the scale is (each row's or example's ``s`` shown ``where``), and
    (``unscored``) the swatch of unscored words."""
    if isinstance(scale, str):
        lo, hi = "\u2212s", "+s"
        note = (f"s: the largest |score| of each row (shown {where})" if scale == "row"
                else f"s: the largest |score| of each example (shown {where})")
    else:
        lo, hi = f"\u2212{_fmt(float(scale))}", f"+{_fmt(float(scale))}"
        note = "one scale for every row"
    return (f'<div class="ta-legend"><div><div class="ta-bar" style="background:{_gradient()}"></div>'
            f'<div class="ta-bar-labels"><span>{escape(lo)}</span><span>0</span><span>{escape(hi)}</span></div>'
            f'</div><div>blue: negative, red: positive; {escape(note)}</div>'
            + ('<div><span class="ta-w ta-uncovered">word</span> not scored (no token in the input)</div>'
               if unscored else "") + '</div>')


# ------------------------------------------------------------------------------------------------ structure
def _rows_by_example(results: Results) -> List[Dict[str, WordRow]]:
    """``[{method: WordRow}]`` per example from any accepted form of ``results``."""
    if isinstance(results, WordRow):
        return [{f"scores ({results.reduction})": results}]
    if hasattr(results, "samples"):
        return [{f"scores ({s.reduction})": s} for s in results.samples]
    if not isinstance(results, Mapping):
        raise TypeError("results must be a WordAttribution, a WordAttributions or a mapping of method names to them")
    per_method = {str(name): ([r] if isinstance(r, WordRow) else list(r.samples) if hasattr(r, "samples")
                              else list(r))
                  for name, r in results.items()}
    sizes = {len(v) for v in per_method.values()}
    if len(sizes) > 1:
        raise ValueError(f"the methods hold different numbers of examples: "
                         f"{ {k: len(v) for k, v in per_method.items()} }")
    n = sizes.pop() if sizes else 0
    examples = []
    for i in range(n):
        rows = {name: samples[i] for name, samples in per_method.items()}
        texts = {r.text for r in rows.values()}
        if len(texts) > 1:
            raise ValueError(f"example {i}: the methods' results are not on the same text")
        examples.append(rows)
    return examples


def _pick(values: Optional[Sequence], i: int):
    if values is None:
        return None
    v = values[i]
    return v.item() if hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1 else v


def _class_name(value, class_names: Optional[Sequence[str]]):
    if class_names is not None and isinstance(value, int) and 0 <= value < len(class_names):
        return class_names[value]
    return value


def text_heatmap_html(
    results: Results,
    *,
    titles: Optional[Sequence] = None,
    labels: Optional[Sequence] = None,
    predictions: Optional[Sequence] = None,
    class_names: Optional[Sequence[str]] = None,
    scale: Union[str, float] = "row",
    legend: bool = True,
) -> str:
    """An HTML fragment (with its own ``<style>``) of ``results``: a ``WordAttribution`` (one example), a
    ``WordAttributions`` (one example per sample) or a mapping of method names to either or to a list of
    ``WordAttribution`` (one row per method, the examples aligned by index and on the same texts); the classes of
    :mod:`evaluation.words.mapping`.

    ``titles``, ``labels``, ``predictions``: optional per-example values (integers are named by
    ``class_names``); ``scale``: ``"row"``, ``"example"`` or a positive number (see the module docstring).
    """
    if not (scale in ("row", "example") if isinstance(scale, str)
            else isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be 'row', 'example' or a positive number, got {scale!r}")
    examples = _rows_by_example(results)
    for name, values in (("titles", titles), ("labels", labels), ("predictions", predictions)):
        if values is not None and len(values) != len(examples):
            raise ValueError(f"{len(values)} {name} for {len(examples)} examples")
    parts = [f"<style>{STYLE}</style>", '<div class="ta-heatmap">']
    if legend:
        parts.append(legend_html(scale))
    for i, rows in enumerate(examples):
        header = []
        title = _pick(titles, i)
        if title is not None:
            header.append(f'<span class="ta-title">{escape(title)}</span>')
        label = _class_name(_pick(labels, i), class_names)
        pred = _class_name(_pick(predictions, i), class_names)
        if label is not None:
            header.append(f"<span>label: <b>{escape(label)}</b></span>")
        if pred is not None:
            mark = ""
            if label is not None:
                mark = (' <span class="ta-right">\u2713</span>' if pred == label
                        else ' <span class="ta-wrong">\u2717</span>')
            header.append(f"<span>prediction: <b>{escape(pred)}</b>{mark}</span>")
        parts.append('<div class="ta-example">')
        if header:
            parts.append(f'<div class="ta-header">{"".join(header)}</div>')
        example_scale = max((_max_abs(r) for r in rows.values()), default=0.0)
        parts.append("<table>")
        for name, row in rows.items():
            if isinstance(scale, str):
                s = example_scale if scale == "example" else _max_abs(row)
            else:
                s = float(scale)
            coverage = "" if row.coverage >= 1.0 else f", {100 * row.coverage:.0f}% of words scored"
            parts.append(f'<tr><th class="ta-method">{escape(name)}<span class="ta-scale">'
                         f'\u00b1{escape(_fmt(s))}{escape(coverage)}</span></th>'
                         f'<td class="ta-text">{_row_html(row, s if s > 0 else 1.0)}</td></tr>')
        parts.append("</table></div>")
    parts.append("</div>")
    return "".join(parts)


def page_html(fragment: str, page_title: str = "Token attributions") -> str:
    """A self-contained HTML document around a fragment of :func:`text_heatmap_html`."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(page_title)}</title>'
            f'</head><body style="margin:16px">\n'
            f'<h2 style="font-family:Arial,Liberation Sans,DejaVu Sans,sans-serif;font-size:18px">'
            f'{escape(page_title)}</h2>\n{fragment}\n</body></html>\n')


def write_text_heatmap(path: Union[str, Path], results: Results, *, page_title: str = "Token attributions",
                       **options) -> Path:
    """Write :func:`text_heatmap_html` of ``results`` (``options`` are its keywords) as a self-contained UTF-8
    HTML file at ``path`` (its folder is created); returns the path."""
    return TextHeatmap(results, **options).save(path, page_title)


class TextHeatmap:
    """A rendered heatmap that a notebook cell displays (``_repr_html_``); ``str()`` is its HTML fragment and
    :meth:`save` writes a self-contained page. Arguments: those of :func:`text_heatmap_html`."""

    def __init__(self, results: Results, **options) -> None:
        self.html = text_heatmap_html(results, **options)

    def _repr_html_(self) -> str:
        return self.html

    def __str__(self) -> str:
        return self.html

    def save(self, path: Union[str, Path], page_title: str = "Token attributions") -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page_html(self.html, page_title), encoding="utf-8")
        return path
