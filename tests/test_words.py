"""Token scores -> words (``evaluation.words.mapping``, ``.reductions``) and text heatmaps (``.heatmap``).

Reductions by hand on small examples; whitespace words equal ``str.split()``; ERASER-style pre-split words
(punctuation, odd characters, empty words) align exactly through the real MiniLM tokenizer; a real sentence goes
through ``gradcam`` on a MiniLM ``BertForSequenceClassification`` into words and HTML; truncation leaves words
uncovered (NaN, ``covered`` False, counted in ``coverage``); every text in the HTML is escaped.
"""
from __future__ import annotations

import math
from html.parser import HTMLParser

import pytest
import torch
from shared_resources import minilm_folder

from evaluation.words import (
    REDUCTIONS,
    TextHeatmap,
    WordAttributions,
    reduce_tokens,
    text_heatmap_html,
    whitespace_words,
    word_attribution_from_ids,
    word_scores,
    write_text_heatmap,
)
from evaluation.words.heatmap import score_color
from methods import build_method

transformers = pytest.importorskip("transformers")

ODD_STRINGS = ["", "   \t\n ", "😀", "\x00\x01 \x7f", "e\u0301\u0301 n\u0303", "東京タワー", "[UNK]", "a\u200bb",
               "x\u00a0y\u3000z\x1cw", "naïve café — “quoted” <b>&amp;</b>"]


@pytest.fixture(scope="module")
def folder():
    return minilm_folder()


@pytest.fixture(scope="module")
def tok(folder):
    return transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


@pytest.fixture(scope="module")
def model(folder):
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()
    return transformers.BertForSequenceClassification.from_pretrained(str(folder), num_labels=2,
                                                                      local_files_only=True).eval()


def _plain_batch(offsets, special=None):
    """One sample as a plain mapping (no encodings): ``offset_mapping``, ``attention_mask`` (0 at ``(-1, -1)``
    entries, which become ``(0, 0)``), ``special_tokens_mask``."""
    att = [[0 if o == (-1, -1) else 1 for o in offsets]]
    offs = [[(0, 0) if o == (-1, -1) else o for o in offsets]]
    batch = {"offset_mapping": torch.tensor(offs), "attention_mask": torch.tensor(att)}
    if special is not None:
        batch["special_tokens_mask"] = torch.tensor([special])
    return batch


# --------------------------------------------------------------------------------------------- reductions by hand
def test_reductions_by_hand():
    text = "ab cd e"                     # words: ab (0,2), cd (3,5), e (6,7)
    # positions: [CLS], a, b, c, d, e, [SEP], pad
    offsets = [(0, 0), (0, 1), (1, 2), (3, 4), (4, 5), (6, 7), (0, 0), (-1, -1)]
    scores = torch.tensor([[9.0, 1.0, -3.0, -2.0, -0.5, 4.0, 9.0, 0.0]])
    batch = _plain_batch(offsets, special=[1, 0, 0, 0, 0, 0, 1, 1])
    expect = {"max": [1.0, -0.5, 4.0], "sum": [-2.0, -2.5, 4.0], "mean": [-1.0, -1.25, 4.0],
              "absmax": [-3.0, -2.0, 4.0]}
    for reduction in REDUCTIONS:
        r = word_scores(scores, batch, [text], reduction=reduction)
        assert r[0].words == ["ab", "cd", "e"] and r[0].spans == [(0, 2), (3, 5), (6, 7)]
        assert r[0].tokens == [[1, 2], [3, 4], [5]]             # [CLS], [SEP] and padding belong to no word
        assert r[0].scores.tolist() == expect[reduction], reduction
        assert r.scores.tolist() == [expect[reduction]] and r.mask.all() and r.coverage.tolist() == [1.0]
    # without special_tokens_mask, a token with an empty span is special
    r = word_scores(scores, _plain_batch(offsets), text, reduction="sum")
    assert r[0].scores.tolist() == expect["sum"]


def test_reduce_tokens_absmax_ties_and_empty_words():
    values = torch.tensor([2.0, -2.0, -1.0, 0.5, -0.25])
    index = torch.tensor([0, 0, 1, 1, 3])
    out = reduce_tokens(values, index, 5, "absmax")
    assert out[:2].tolist() == [2.0, -1.0] and out[3].item() == -0.25   # tie +2/-2 -> +2
    assert math.isnan(out[2]) and math.isnan(out[4])                   # words without tokens
    assert reduce_tokens(values, index, 5, "mean")[1].item() == pytest.approx(-0.25)
    assert torch.isnan(reduce_tokens(torch.zeros(0), torch.zeros(0, dtype=torch.long), 2, "max")).all()
    with pytest.raises(ValueError, match="unknown word reduction"):
        reduce_tokens(values, index, 5, "median")


def test_word_attribution_from_a_batchs_word_ids_by_hand():
    # [CLS] a bb bb [SEP] of a window whose first word is document word 5; word "c" has no token
    scores, word_ids = torch.tensor([9.0, 1.0, -3.0, 2.0, 9.0]), torch.tensor([-1, 5, 6, 6, -1])
    r = word_attribution_from_ids(scores, word_ids, ["a", "bb", "c"], 5, "absmax")
    assert r.text == "a bb c" and r.spans == [(0, 1), (2, 4), (5, 6)] and r.tokens == [[1], [2, 3], []]
    assert r.scores[:2].tolist() == [1.0, -3.0] and math.isnan(r.scores[2]) and r.covered.tolist() == [1, 1, 0]
    assert r.scores.dtype == torch.float64 and r.coverage == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match=r"token 1 points at word 8 outside the sample's 3 words \(offset 5\)"):
        word_attribution_from_ids(scores, torch.tensor([-1, 8, 6, 6, -1]), ["a", "bb", "c"], 5)


def test_whitespace_words_are_str_split_with_spans():
    for text in ODD_STRINGS + ["  lead and trail  ", "tab\tnew\nline\r\nx"]:
        words, spans = whitespace_words(text)
        assert words == text.split()
        assert [text[s:e] for s, e in spans] == words


# --------------------------------------------------------------------------------------------- ERASER pre-split
ERASER_WORDS = ["The", "film", "(", "1999", ")", "was", "n't", "good", "--", "<br", "/>", "crème", "e\u0301",
                "😀", "東京", "\x00", "", "[UNK]", "don't", "a&b", '"q"', "...", "naïve", "Ⅻ", "x²"]


def test_presplit_words_align_exactly_with_word_ids(tok):
    docs = [ERASER_WORDS, ["Short", ",", "doc", "."]]
    batch = tok(docs, is_split_into_words=True, padding=True, return_tensors="pt")
    scores = torch.arange(batch["input_ids"].numel(), dtype=torch.float32).reshape(batch["input_ids"].shape) + 1
    for reduction in REDUCTIONS:
        r = word_scores(scores, batch, docs, reduction=reduction)
        for i, words in enumerate(docs):
            sample = r[i]
            assert sample.words == words and len(sample) == len(words)     # exactly the given words, in order
            assert sample.text == " ".join(words)
            assert [sample.text[s:e] for s, e in sample.spans] == words
            word_ids = batch.word_ids(i)
            for w in range(len(words)):
                expected = [j for j, wid in enumerate(word_ids) if wid == w]
                assert sample.tokens[w] == expected
                if not expected:
                    assert not sample.covered[w] and math.isnan(sample.scores[w])
                    continue
                vals = scores[i, expected]
                want = {"max": vals.max(), "sum": vals.sum(), "mean": vals.mean(), "absmax": vals.max()}[reduction]
                assert sample.scores[w].item() == pytest.approx(want.item())
    first = word_scores(scores, batch, docs)[0]
    uncovered = [w for w, c in zip(first.words, first.covered.tolist()) if not c]
    assert uncovered == ["\x00", ""]                 # the tokenizer drops control characters; the empty word
    assert first.coverage == pytest.approx((len(ERASER_WORDS) - 2) / len(ERASER_WORDS))
    special = {tok.cls_token_id, tok.sep_token_id, tok.pad_token_id}
    ids = batch["input_ids"]
    for i in range(2):
        used = {j for toks in word_scores(scores, batch, docs)[i].tokens for j in toks}
        assert all(int(ids[i, j]) not in special for j in used)


def test_presplit_needs_encodings_and_matching_words(tok):
    batch = tok([ERASER_WORDS], is_split_into_words=True, return_tensors="pt")
    scores = torch.ones(batch["input_ids"].shape)
    with pytest.raises(ValueError, match="do not match"):
        word_scores(scores, batch, [ERASER_WORDS[:3]])
    with pytest.raises(ValueError, match="encodings"):
        word_scores(scores, {**batch, "offset_mapping": torch.zeros(*scores.shape, 2, dtype=torch.long)},
                    [ERASER_WORDS])
    with pytest.raises(ValueError, match="pre-split"):
        word_scores(scores, batch, [ERASER_WORDS], words="tokenizer", tokenizer=tok)


# --------------------------------------------------------------------------------------------- strings, real tokenizer
def test_odd_strings_never_crash_and_both_word_definitions(tok):
    batch = tok(ODD_STRINGS, padding=True, return_tensors="pt", return_offsets_mapping=True)
    scores = torch.randn(batch["input_ids"].shape) * batch["attention_mask"]
    for words in ("whitespace", "tokenizer"):
        for reduction in REDUCTIONS:
            r = word_scores(scores, batch, ODD_STRINGS, words=words, reduction=reduction, tokenizer=tok)
            assert len(r) == len(ODD_STRINGS) and r.scores.shape[0] == len(ODD_STRINGS)
            assert torch.isfinite(r.scores).all() and (r.scores[~r.mask] == 0).all()
            for text, sample in zip(ODD_STRINGS, r):
                assert [text[s:e] for s, e in sample.spans] == sample.words
                assert torch.isnan(sample.scores[~sample.covered]).all()
                assert torch.isfinite(sample.scores[sample.covered]).all()
    ws = word_scores(scores, batch, ODD_STRINGS)
    assert len(ws[0]) == 0 and len(ws[1]) == 0 and ws.coverage[0] == 1.0      # empty, only whitespace
    assert ws[2].covered.all()                                                # the emoji: [UNK], scored
    assert ws[8].words == ["x", "y", "z", "w"]                                 # NBSP, ideographic space, \x1c
    tw = word_scores(scores, batch, ODD_STRINGS, words="tokenizer", tokenizer=tok)
    assert tw[5].words == ["東", "京", "タワー"] or len(tw[5].words) >= 2        # CJK characters are words
    assert "<" in tw[9].words and "&" in tw[9].words                           # punctuation is split off
    # the plain-mapping path (offset_mapping + attention_mask) gives the same words and scores for strings
    plain = word_scores(scores, dict(batch), ODD_STRINGS)
    for a, b in zip(ws, plain):
        assert a.words == b.words and a.tokens == b.tokens
    with pytest.raises(ValueError, match="tokenizer="):
        word_scores(scores, batch, ODD_STRINGS, words="tokenizer")


def test_truncation_leaves_words_uncovered(tok):
    text = " ".join(f"w{i}" for i in range(12))          # 12 words; "w3" -> "w", "##3"
    batch = tok([text, "short one"], padding=True, truncation=True, max_length=8, return_tensors="pt")
    scores = torch.rand(batch["input_ids"].shape) + 0.1
    for words in ("whitespace", "tokenizer"):
        r = word_scores(scores, batch, [text, "short one"], words=words, tokenizer=tok)
        sample = r[0]
        assert len(sample) == 12                         # truncated words are still reported
        covered = sample.covered.tolist()
        n = sum(covered)
        assert covered == [True] * n + [False] * (12 - n) and 0 < n < 12
        assert torch.isnan(sample.scores[n:]).all() and torch.isfinite(sample.scores[:n]).all()
        assert sample.coverage == pytest.approx(n / 12) and r.coverage.tolist() == [pytest.approx(n / 12), 1.0]
        assert r.mask[0].tolist() == covered and r.word_mask[0].all()
        assert (r.scores[0, n:] == 0).all()
        assert r.word_mask[1].tolist() == [True, True] + [False] * 10 and r.scores.shape == (2, 12)
    tok_left = transformers.AutoTokenizer.from_pretrained(tok.name_or_path, local_files_only=True,
                                                          truncation_side="left")
    batch = tok_left([text], truncation=True, max_length=8, return_tensors="pt")
    sample = word_scores(torch.ones(batch["input_ids"].shape), batch, text)[0]
    assert not sample.covered[0] and sample.covered[-1]                      # the first words are lost


def test_pair_inputs_pick_one_text(tok):
    questions, docs = ["is it good?"], ["It is very good ."]
    batch = tok(questions, docs, return_tensors="pt")
    scores = torch.arange(batch["input_ids"].shape[1], dtype=torch.float32)[None]
    r = word_scores(scores, batch, docs, sequence=1)
    assert r[0].words == docs[0].split() and r[0].covered.all()
    seq = batch.sequence_ids(0)
    assert all(seq[j] == 1 for toks in r[0].tokens for j in toks)
    q = word_scores(scores, batch, questions, sequence=0)
    assert all(seq[j] == 0 for toks in q[0].tokens for j in toks) and q[0].words == ["is", "it", "good?"]


# --------------------------------------------------------------------------------------------- end to end
class _TextOf(HTMLParser):
    """The text content of every ``td.ta-text`` cell, and every tag seen."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.cells, self.tags, self._in = [], [], 0

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "td" and ("class", "ta-text") in attrs:
            self.cells.append("")
            self._in = 1
        elif self._in:
            self._in += 1

    def handle_endtag(self, tag):
        if self._in:
            self._in -= 1

    def handle_data(self, data):
        if self._in:
            self.cells[-1] += data


def test_gradcam_on_minilm_to_words_and_html(tok, model, tmp_path):
    texts = ["A surprisingly moving film, with <script>alert('x')</script> & \"sharp\" writing — crème brûlée 😀!",
             "Dull."]
    batch = tok(texts, padding=True, truncation=True, return_tensors="pt", return_offsets_mapping=True)
    labels = torch.tensor([1, 0])
    scores = build_method("gradcam")(model, batch, target=labels)              # offset_mapping is ignored
    assert scores.shape == batch["input_ids"].shape
    r = word_scores(scores, batch, texts, reduction="max")
    assert isinstance(r, WordAttributions) and r.scores.shape == (2, len(texts[0].split()))
    for i, text in enumerate(texts):
        sample = r[i]
        assert sample.words == text.split() and sample.covered.all() and sample.coverage == 1.0
        assert torch.isfinite(sample.scores).all()
        for w, toks in enumerate(sample.tokens):
            assert toks and sample.scores[w] == scores[i, toks].max()
        used = {j for toks in sample.tokens for j in toks}
        content = batch["attention_mask"][i].bool() & ~torch.isin(
            batch["input_ids"][i], torch.tensor([tok.cls_token_id, tok.sep_token_id]))
        assert used == set(torch.nonzero(content).flatten().tolist())        # every content token, nothing else
    rollout = word_scores(build_method("rollout")(model, batch), batch, texts)
    page = write_text_heatmap(tmp_path / "sub" / "heat.html", {"gradcam": r, "rollout": rollout},
                              titles=["first <i>", "second"], labels=labels, predictions=[1, 1],
                              class_names=["neg", "pos"])
    content = page.read_text(encoding="utf-8")
    assert content.startswith("<!DOCTYPE html>") and '<meta charset="utf-8">' in content
    assert "http" not in content and "src=" not in content and "<script" not in content   # self-contained, inert
    parser = _TextOf()
    parser.feed(content)
    assert parser.cells == [texts[0], texts[0], texts[1], texts[1]]          # the text reads as written, per row
    assert "script" not in parser.tags and "i" not in parser.tags
    assert "&lt;script&gt;" in content and "first &lt;i&gt;" in content and "&amp;" in content
    assert content.count('class="ta-example"') == 2 and content.count('class="ta-method"') == 4
    assert "prediction: <b>pos</b>" in content and "\u2717" in content        # second example mispredicted


# --------------------------------------------------------------------------------------------- rendering
def _one(text, values, covered=None):
    words, spans = whitespace_words(text)
    offsets = [(0, 0)] + spans + [(0, 0)]
    scores = torch.tensor([[0.0] + list(values) + [0.0]])
    batch = _plain_batch(offsets, special=[1] + [0] * len(spans) + [1])
    return word_scores(scores, batch, text)


def test_escaping_of_words_titles_and_attributes():
    text = "<script>alert(\"x\")</script> & 'single' \"double\" a<b>c \x00\x07\ud83d \u202eevil"
    r = _one(text, [1.0, -1.0, 0.5, 0.2, 0.1, 0.0, 0.3])
    out = text_heatmap_html(r, titles=['t"><img onerror=x>'], labels=["<l>"], predictions=["&p"])
    assert "<script" not in out and "<img" not in out and "<b>c" not in out
    assert "&lt;script&gt;" in out and "&amp;" in out and "&#x27;single&#x27;" in out and "&quot;double&quot;" in out
    assert "t&quot;&gt;&lt;img onerror=x&gt;" in out and "&lt;l&gt;" in out and "&amp;p" in out
    assert "\x00" not in out and "\u202e" not in out                            # control and bidi characters
    assert "\\x00\\x07" in out and "\\u202eevil" in out                              # shown as escapes
    parser = _TextOf()
    parser.feed(out)
    shown = text.replace("\x00", "\\x00").replace("\x07", "\\x07").replace("\ud83d", "\ufffd")
    shown = shown.replace("\u202e", "\\u202e")
    assert parser.cells == [shown]
    assert set(parser.tags) <= {"style", "div", "span", "table", "tr", "th", "td", "b"}


def test_colours_scales_legend_and_notebook_display(tmp_path):
    assert score_color(0.0, 1.0) == (255, 255, 255)
    assert score_color(1.0, 1.0) == (178, 24, 43) and score_color(5.0, 1.0) == (178, 24, 43)     # red, clipped
    assert score_color(-1.0, 1.0) == (33, 102, 172) and score_color(-0.5, 1.0)[2] > score_color(-0.5, 1.0)[0]
    assert score_color(float("nan"), 1.0) == (255, 255, 255)
    r = _one("good bad meh", [2.0, -1.0, 0.0])
    row = text_heatmap_html(r)                                                 # per row: 2.0 is full red
    assert "rgb(178,24,43)" in row and "rgb(144,178,214)" in row and "\u00b12" in row
    fixed = text_heatmap_html(r, scale=4.0)                                    # a given scale: 2.0 is half red
    assert "background-color:rgb(178,24,43)" not in fixed and "rgb(216,140,149)" in fixed and "\u22124" in fixed
    assert 'class="ta-legend"' in row and 'class="ta-legend"' not in text_heatmap_html(r, legend=False)
    both = text_heatmap_html({"a": r, "b": _one("good bad meh", [0.5, 0.0, 0.0])}, scale="example")
    assert both.count("\u00b12<") == 2                                         # one scale for the example
    with pytest.raises(ValueError, match="not on the same text"):
        text_heatmap_html({"a": r, "b": _one("other text here", [1.0, 1.0, 1.0])})
    with pytest.raises(ValueError, match="scale"):
        text_heatmap_html(r, scale=0)
    assert r._repr_html_() == text_heatmap_html(r) and r[0]._repr_html_().count('class="ta-method"') == 1
    heat = TextHeatmap({"m": r}, titles=["x"])
    assert heat._repr_html_() == str(heat) and "ta-heatmap" in heat.html
    saved = heat.save(tmp_path / "h.html").read_text(encoding="utf-8")
    assert saved.startswith("<!DOCTYPE html>") and heat.html in saved


def test_uncovered_words_and_empty_texts_render(tok):
    text = " ".join(f"w{i}" for i in range(12))
    texts = [text, "", "   "]
    batch = tok(texts, padding=True, truncation=True, max_length=8, return_tensors="pt")
    r = word_scores(torch.ones(batch["input_ids"].shape), batch, texts)
    out = text_heatmap_html(r)
    n_uncovered = int((~r[0].covered).sum())
    assert out.count("ta-w ta-uncovered") == n_uncovered + 1                       # + the legend's swatch
    assert "% of words scored" in out and out.count("(empty text)") == 2
