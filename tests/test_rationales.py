"""Document word scores (``evaluation.words``), ERASER hard rationales and metrics (``evaluation.rationale_selection``,
``evaluation.rationale_metrics``), the ERASER JSONL export (``evaluation.eraser_export``) and the ``RationaleTest``
callback (``callbacks.rationale``).

The metrics are checked against hand-worked examples and against a direct, set-based transcription of ERASER's
definitions written here (token P/R/F1 instance macro and micro, IOU-F1 partial match), the AUPRC against
scikit-learn's ``precision_recall_curve`` + ``auc`` (what ERASER calls); word scores against
``evaluation.words.word_scores`` and ``word_attribution_from_ids`` through the real MiniLM tokenizer; batched
against per-sample; metric states merged from halves; the callback, driven by hand-built outputs and batches,
against an independent computation from its own JSONL export; sliding windows against their max; one process
against two (gloo).
"""
from __future__ import annotations

import json
import math
import pickle
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List

import numpy as np
import pytest
import torch
from shared_resources import MOVIES, minilm_folder

from callbacks.rationale import RationaleTest
from callbacks.reporter import ResultsReporter
from evaluation.eraser_export import check_eraser_rows, eraser_row, write_eraser_jsonl
from evaluation.rationale_metrics import SoftAUPRC, SpanIOUF1, TokenF1, soft_auprc, span_iou_matches, token_counts
from evaluation.rationale_selection import batched_runs, spans_from_mask, top_k_masks
from evaluation.words import REDUCTIONS, document_word_scores, word_attribution_from_ids, word_mask, word_scores
from tests.gloo import gloo_group, run_on_two_processes


# =============================================================================== ERASER, transcribed independently
def _f1(p, r):
    return 0.0 if p == 0 or r == 0 else 2 * p * r / (p + r)


def eraser_token_prf(truth: Dict[str, set], pred: Dict[str, set]) -> dict:
    """ERASER's score_hard_rationale_predictions on token sets keyed by instance."""
    all_truth = {(k, t) for k, ts in truth.items() for t in ts}
    all_pred = {(k, t) for k, ts in pred.items() for t in ts}
    micro_p = len(all_truth & all_pred) / len(all_pred)
    micro_r = len(all_truth & all_pred) / len(all_truth)
    keys = {k for k, v in truth.items() if v} | {k for k, v in pred.items() if v}
    ps, rs, fs = [], [], []
    for k in keys:
        t, p = truth.get(k, set()), pred.get(k, set())
        prec = len(t & p) / len(p) if p else 0
        rec = len(t & p) / len(t) if t else 0
        ps.append(prec)
        rs.append(rec)
        fs.append(_f1(prec, rec))
    return {"micro_f1": _f1(micro_p, micro_r), "micro_p": micro_p, "micro_r": micro_r,
            "p": sum(ps) / len(ps), "r": sum(rs) / len(rs), "f1": sum(fs) / len(fs)}


def eraser_iou_f1(truth: Dict[str, list], pred: Dict[str, list], threshold=0.5) -> dict:
    """ERASER's partial_match_score on spans keyed by instance (span lists, end exclusive)."""
    tps = {}
    for k in set(truth) | set(pred):
        hits = 0
        for ps, pe in pred.get(k, []):
            best = 0.0
            for ts, te in truth.get(k, []):
                a, b = set(range(ps, pe)), set(range(ts, te))
                best = max(best, len(a & b) / len(a | b))
            hits += best >= threshold
        tps[k] = hits
    n_truth = {k: len(v) for k, v in truth.items() if v}
    n_pred = {k: len(v) for k, v in pred.items() if v}
    micro_r = sum(tps.values()) / sum(n_truth.values()) if sum(n_truth.values()) else 0
    micro_p = sum(tps.values()) / sum(n_pred.values()) if sum(n_pred.values()) else 0
    macro_r = np.mean([tps[k] / n for k, n in n_truth.items()]) if n_truth else 0
    macro_p = np.mean([tps[k] / n for k, n in n_pred.items()]) if n_pred else 0
    return {"micro_f1": _f1(micro_r, micro_p), "f1": _f1(macro_r, macro_p)}


def sklearn_auprc(truth, scores):
    from sklearn.metrics import auc, precision_recall_curve

    precision, recall, _ = precision_recall_curve([int(t) for t in truth], list(scores))
    return auc(recall, precision)


def top_k_by_hand(scores, covered, k):
    """Covered words by descending score, ties by smaller index; the first k."""
    ranked = sorted((i for i in range(len(scores)) if covered[i]), key=lambda i: (-scores[i], i))
    return set(ranked[:k])


def read_jsonl(path, document_lengths=None) -> List[dict]:
    """The instances of an ERASER results file, checked against ERASER's schema (what its scorer loads)."""
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    check_eraser_rows(rows, document_lengths, where=str(path))
    return rows


def hard_spans(row) -> List[tuple]:
    """The ``(start_token, end_token)`` hard spans of an instance's only document."""
    (rationale,) = row["rationales"]
    return [(s["start_token"], s["end_token"]) for s in rationale.get("hard_rationale_predictions", [])]


def mask_from_spans(spans, length: int) -> np.ndarray:
    """``[length]`` bool mask of the union of ``(start, end)`` spans (end exclusive)."""
    out = np.zeros(length, dtype=bool)
    for start, end in spans:
        assert 0 <= start < end <= length, (start, end)
        out[start:end] = True
    return out


# =============================================================================== word scores
def test_document_word_scores_by_hand():
    # sample 0: [CLS] w0 w1 w1 w3 [SEP] pad ; w2 has no token (deleted characters), w4 is truncated
    # sample 1: a window starting at word 2 of a 4-word document: [CLS] w2 w2 w3 [SEP] pad pad
    scores = torch.tensor([[9.0, 1.0, -3.0, 2.0, 0.5, 9.0, 9.0],
                           [9.0, -1.0, -4.0, 0.25, 9.0, 9.0, 9.0]])
    word_ids = torch.tensor([[-1, 0, 1, 1, 3, -1, -1], [-1, 2, 2, 3, -1, -1, -1]])
    num_words, offset = torch.tensor([5, 4]), torch.tensor([0, 2])
    expected = {"max": [[1.0, 2.0, 0.0, 0.5, 0.0], [0.0, 0.0, -1.0, 0.25, 0.0]],
                "sum": [[1.0, -1.0, 0.0, 0.5, 0.0], [0.0, 0.0, -5.0, 0.25, 0.0]],
                "mean": [[1.0, -0.5, 0.0, 0.5, 0.0], [0.0, 0.0, -2.5, 0.25, 0.0]],
                "absmax": [[1.0, -3.0, 0.0, 0.5, 0.0], [0.0, 0.0, -4.0, 0.25, 0.0]]}
    for reduction, want in expected.items():
        out, covered = document_word_scores(scores, word_ids, offset, num_words, reduction)
        assert out.tolist() == want, reduction
        assert covered.tolist() == [[True, True, False, True, False], [False, False, True, True, False]]
    # absmax: +a beats -a on a tie
    out, _ = document_word_scores(torch.tensor([[2.0, -2.0]]), torch.tensor([[0, 0]]), None, torch.tensor([1]),
                                  "absmax")
    assert out.tolist() == [[2.0]]


def test_document_word_scores_errors_name_the_input():
    s, w, n = torch.zeros(1, 3), torch.tensor([[-1, 0, 1]]), torch.tensor([2])
    with pytest.raises(ValueError, match="same shape"):
        document_word_scores(torch.zeros(1, 4), w, None, n)
    with pytest.raises(ValueError, match="num_words"):
        document_word_scores(s, w, None, torch.tensor([2, 2]))
    with pytest.raises(ValueError, match="reach word 1 but its document has 1 words"):
        document_word_scores(s, w, None, torch.tensor([1]))
    with pytest.raises(ValueError, match="below its word_offset"):
        document_word_scores(s, w, torch.tensor([1]), n)
    with pytest.raises(ValueError, match="NaN"):
        document_word_scores(torch.tensor([[0.0, math.nan, 0.0]]), w, None, n)
    with pytest.raises(ValueError, match="unknown word reduction"):
        document_word_scores(s, w, None, n, "median")


def _minilm_tokenizer():
    folder = minilm_folder()
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def test_the_three_token_to_word_paths_give_the_same_numbers_on_presplit_inputs():
    """document_word_scores (the rationale test), word_scores (offsets / word ids of a BatchEncoding, notebooks) and
    word_attribution_from_ids (the heatmap callbacks) share one reduction: bit-identical scores."""
    tok = _minilm_tokenizer()
    docs = [["the", "film", "'s", "unbelievably", "over-the-top", "plot", ",", "naïve", "\x00\x01", "ends", "."],
            ["a", "[UNK]", "東京タワー", "rocks"],
            ["short", "but", "sweeeeeeet", "and", "truncated", "here", "and", "there", "too"]]
    enc = tok(docs, is_split_into_words=True, padding=True, truncation=True, max_length=16, return_tensors="pt",
              return_special_tokens_mask=True)
    b, n = enc["input_ids"].shape
    word_ids = torch.tensor([[-1 if w is None else w for w in enc.word_ids(i)] for i in range(b)])
    num_words = torch.tensor([len(d) for d in docs])
    scores = torch.randn(b, n, generator=torch.Generator().manual_seed(0)) * (enc["attention_mask"] > 0)
    for reduction in REDUCTIONS:
        ours, covered = document_word_scores(scores, word_ids, torch.zeros(b, dtype=torch.long), num_words,
                                             reduction)
        ref = word_scores(scores, enc, docs, reduction=reduction)
        assert torch.equal(covered, ref.mask) and torch.equal(ours, ref.scores), reduction
        ours64, _ = document_word_scores(scores.double(), word_ids, None, num_words, reduction)
        for i, doc in enumerate(docs):
            shift = 5 * i                                                   # a window's document word ids
            one = word_attribution_from_ids(scores[i], torch.where(word_ids[i] >= 0, word_ids[i] + shift, -1), doc,
                                            shift, reduction)
            assert one.words == doc and one.text == " ".join(doc) and one.scores.dtype == torch.float64
            assert torch.equal(one.covered, covered[i, :len(doc)])
            assert torch.equal(one.scores.nan_to_num(0.0), ours64[i, :len(doc)]), (reduction, i)
            assert one.tokens == ref[i].tokens
    assert not covered[0, 8] and not covered[2, -1]     # deleted characters; the truncated tail


# =============================================================================== hard rationales and spans
def test_top_k_ties_by_index_and_uncovered_words_never_chosen():
    scores = torch.tensor([[0.0, 0.5, 0.5, 0.0, 0.9, 0.0, 0.0]])
    covered = torch.tensor([[True, True, True, True, True, False, False]])
    masks = top_k_masks(scores, covered, [1, 2, 4, 6])
    chosen = [set(torch.nonzero(m).flatten().tolist()) for m in masks[0]]
    assert chosen == [{4}, {1, 4}, {0, 1, 2, 4}, {0, 1, 2, 3, 4}]       # k=6 > 5 covered: all covered words
    # a negative covered score still ranks before an uncovered word (unclamped maps)
    masks = top_k_masks(torch.tensor([[-1.0, 0.0]]), torch.tensor([[True, False]]), [1])
    assert masks[0, 0].tolist() == [True, False]
    with pytest.raises(ValueError, match="strictly increasing"):
        top_k_masks(scores, covered, [5, 5])


def test_top_k_matches_a_sort_by_hand_on_random_maps():
    gen = torch.Generator().manual_seed(1)
    scores = torch.randint(0, 4, (6, 30), generator=gen).to(torch.float64)      # many ties
    covered = torch.rand(6, 30, generator=gen) > 0.2
    ks = [1, 3, 7, 30]
    masks = top_k_masks(scores, covered, ks)
    for b in range(6):
        for j, k in enumerate(ks):
            want = top_k_by_hand(scores[b].tolist(), covered[b].tolist(), k)
            assert set(torch.nonzero(masks[b, j]).flatten().tolist()) == want


def test_span_arithmetic():
    assert spans_from_mask([]) == []
    assert spans_from_mask([0, 0]) == []
    assert spans_from_mask([1, 1, 0, 1, 0, 0, 1, 1, 1]) == [(0, 2), (3, 4), (6, 9)]
    assert spans_from_mask([1]) == [(0, 1)]
    rng = np.random.default_rng(0)
    for _ in range(50):
        mask = rng.random(int(rng.integers(0, 20))) > 0.5
        spans = spans_from_mask(mask)
        assert np.array_equal(mask_from_spans(spans, len(mask)), mask)
        assert all(e2 < s2 for (_, e2), (s2, _) in zip(spans, spans[1:])) or len(spans) < 2  # maximal: gaps
        assert sum(e - s for s, e in spans) == mask.sum()
    masks = torch.from_numpy(rng.random((7, 13)) > 0.4)
    starts, ends, valid = batched_runs(masks)
    for r in range(7):
        got = [(int(s), int(e)) for s, e, v in zip(starts[r], ends[r], valid[r]) if v]
        assert got == spans_from_mask(masks[r].numpy())


# =============================================================================== token P/R/F1, IOU-F1, AUPRC
HAND_SCORES = torch.tensor([[0.1, 0.9, 0.8, 0.0, 0.7, 0.2, 0.3, 0.05],
                            [0.5, 0.4, 0.3, 0.2, 0.1, 0.0, 0.0, 0.0]], dtype=torch.float64)
HAND_TRUTH = torch.tensor([[0, 1, 1, 1, 0, 0, 1, 0], [0] * 8], dtype=torch.bool)
HAND_NUM_WORDS = torch.tensor([8, 5])


def test_token_and_iou_f1_on_a_hand_worked_example():
    covered = word_mask(HAND_NUM_WORDS, 8)
    hard = top_k_masks(HAND_SCORES, covered, [2, 4])
    assert torch.nonzero(hard[0, 1]).flatten().tolist() == [1, 2, 4, 6]
    token = TokenF1(2)
    token.update(*token_counts(hard, HAND_TRUTH))
    out = token.compute()
    # doc A: k=2 P=1 R=.5 F1=2/3; k=4 P=R=F1=.75. doc B (no evidence): P=R=F1=0, counted (it has predictions)
    torch.testing.assert_close(out["f1"], torch.tensor([1 / 3, 0.375], dtype=torch.float64))
    torch.testing.assert_close(out["p"], torch.tensor([0.5, 0.375], dtype=torch.float64))
    torch.testing.assert_close(out["r"], torch.tensor([0.25, 0.375], dtype=torch.float64))
    # micro: k=2 tp 2 / pred 4 / truth 4; k=4 tp 3 / pred 8 / truth 4 -> P .375, R .75
    torch.testing.assert_close(out["micro_f1"], torch.tensor([0.5, 0.5], dtype=torch.float64))
    iou = SpanIOUF1(2)
    iou.update(*span_iou_matches(hard, HAND_TRUTH, 0.5))
    out = iou.compute()
    # true spans of A: [1,4) [6,7). k=2: [1,3) hits (IoU 2/3). k=4: [1,3) hit, [4,5) miss, [6,7) hit. B: 1 span, 0 hits
    torch.testing.assert_close(out["micro_f1"], torch.tensor([0.5, 2 / 3], dtype=torch.float64))
    torch.testing.assert_close(out["f1"], torch.tensor([0.5, 0.5], dtype=torch.float64))
    # IoU 2/3 fails a 0.7 threshold
    hits, _, _ = span_iou_matches(hard, HAND_TRUTH, 0.7)
    assert hits.tolist() == [[0, 1], [0, 0]]


def test_auprc_on_a_hand_worked_example_and_against_sklearn():
    valid = word_mask(HAND_NUM_WORDS, 8)
    values = soft_auprc(HAND_SCORES, HAND_TRUTH, valid)
    # points (r, p): (0,1) (.25,1) (.5,1) (.5,2/3) (.75,3/4) ... (.75,3/7) (1,1/2)
    assert values[0].item() == pytest.approx(0.5 + 17 / 96 + 13 / 112, abs=1e-12)
    assert values[0].item() == pytest.approx(sklearn_auprc(HAND_TRUTH[0], HAND_SCORES[0]), abs=1e-12)
    assert math.isnan(values[1].item())                                 # no true word: left out
    metric = SoftAUPRC()
    metric.update(values)
    assert metric.compute().item() == pytest.approx(values[0].item()) and metric.skipped.item() == 1
    rng = np.random.default_rng(3)
    for trial in range(30):
        n = int(rng.integers(1, 25))
        scores = rng.integers(0, 5, n).astype(np.float64) if trial % 2 else rng.random(n)   # ties, or none
        truth = rng.random(n) > 0.6
        truth[int(rng.integers(0, n))] = True
        pad = int(rng.integers(0, 4))
        got = soft_auprc(torch.from_numpy(np.concatenate([scores, np.full(pad, 7.0)]))[None],
                         torch.from_numpy(np.concatenate([truth, np.ones(pad, bool)]))[None],
                         word_mask(torch.tensor([n]), n + pad))
        assert got.item() == pytest.approx(sklearn_auprc(truth, scores), abs=1e-12)
    # every score equal: one threshold, area (1 + P/N) / 2
    assert soft_auprc(torch.zeros(1, 4), torch.tensor([[1, 0, 0, 0]]), torch.ones(1, 4)).item() == 0.625


def _random_instances(seed: int, b: int = 9, w: int = 40):
    gen = torch.Generator().manual_seed(seed)
    num_words = torch.randint(1, w + 1, (b,), generator=gen)
    valid = word_mask(num_words, w)
    scores = torch.randint(0, 6, (b, w), generator=gen).to(torch.float64) * valid
    covered = (torch.rand(b, w, generator=gen) > 0.15) & valid
    truth = (torch.rand(b, w, generator=gen) > 0.7) & valid
    truth[0] = False                                                   # an annotation without evidence
    return scores, covered, truth, num_words, valid


def test_metrics_equal_erasers_definitions_on_random_instances():
    ks = [1, 4, 10, 25]
    scores, covered, truth, num_words, valid = _random_instances(0)
    hard = top_k_masks(scores, covered, ks)
    token, iou = TokenF1(len(ks)), SpanIOUF1(len(ks))
    token.update(*token_counts(hard, truth))
    iou.update(*span_iou_matches(hard, truth))
    t_out, i_out = token.compute(), iou.compute()
    for j, k in enumerate(ks):
        t_sets = {f"a{b}": set(torch.nonzero(truth[b]).flatten().tolist()) for b in range(len(truth))}
        p_sets = {f"a{b}": top_k_by_hand(scores[b].tolist(), covered[b].tolist(), k) for b in range(len(truth))}
        want = eraser_token_prf(t_sets, p_sets)
        for name in ("f1", "p", "r", "micro_f1", "micro_p", "micro_r"):
            assert t_out[name][j].item() == pytest.approx(want[name], abs=1e-12), (k, name)
        t_spans = {key: spans_from_mask([i in s for i in range(40)]) for key, s in t_sets.items()}
        p_spans = {key: spans_from_mask([i in s for i in range(40)]) for key, s in p_sets.items()}
        want = eraser_iou_f1(t_spans, p_spans, 0.5)
        assert i_out["f1"][j].item() == pytest.approx(want["f1"], abs=1e-12)
        assert i_out["micro_f1"][j].item() == pytest.approx(want["micro_f1"], abs=1e-12)


def test_batched_equals_per_sample_with_padding():
    ks = [2, 5, 11]
    scores, covered, truth, num_words, valid = _random_instances(1)
    hard = top_k_masks(scores, covered, ks)
    counts = token_counts(hard, truth)
    matches = span_iou_matches(hard, truth)
    auprc = soft_auprc(scores, truth, valid)
    for b in range(len(scores)):
        n = int(num_words[b])
        one = top_k_masks(scores[b:b + 1, :n], covered[b:b + 1, :n], ks)
        assert torch.equal(one, hard[b:b + 1, :, :n]) and not hard[b, :, n:].any()
        for batched, single in zip(counts, token_counts(one, truth[b:b + 1, :n])):
            assert torch.equal(batched[b:b + 1], single)
        for batched, single in zip(matches, span_iou_matches(one, truth[b:b + 1, :n])):
            assert torch.equal(batched[b:b + 1], single)
        single = soft_auprc(scores[b:b + 1, :n], truth[b:b + 1, :n], valid[b:b + 1, :n])
        assert torch.equal(single.isnan(), auprc[b:b + 1].isnan())
        assert single.nan_to_num().item() == pytest.approx(auprc[b].nan_to_num().item(), abs=1e-15)


def test_metric_states_merge_like_one_update():
    ks = [1, 3, 8]
    scores, covered, truth, num_words, valid = _random_instances(2, b=11)
    hard = top_k_masks(scores, covered, ks)
    inputs = {TokenF1: token_counts(hard, truth), SpanIOUF1: span_iou_matches(hard, truth)}
    for cls, args in inputs.items():
        whole, first, second = cls(len(ks)), cls(len(ks)), cls(len(ks))
        whole.update(*args)
        first.update(*(a[:4] for a in args))
        second.update(*(a[4:] for a in args))
        first.merge_state(second)
        for key, value in whole.compute().items():
            torch.testing.assert_close(first.compute()[key], value, rtol=0, atol=1e-12)
    values = soft_auprc(scores, truth, valid)
    whole, first, second = SoftAUPRC(), SoftAUPRC(), SoftAUPRC()
    whole.update(values)
    first.update(values[:5])
    second.update(values[5:])
    first.merge_state(second)
    assert first.compute().item() == pytest.approx(whole.compute().item(), abs=1e-12)
    assert first.skipped.item() == whole.skipped.item() == int((truth.sum(dim=1) == 0).sum()) >= 1
    for metric in (TokenF1(1), SpanIOUF1(1), SoftAUPRC()):
        assert all(getattr(metric, name).dtype == torch.float64 for name in metric._defaults)
        assert all(fx is not None for fx in metric._reductions.values())


# =============================================================================== ERASER JSONL
def test_eraser_jsonl_round_trip_schema_and_errors(tmp_path):
    rows = [eraser_row("b.txt", "b.txt", hard_mask=[0, 1, 1, 0, 1], soft_scores=np.array([0.1, 0.5, 0.5, 0, 0.25]),
                       classification="POS", classification_scores={"NEG": 0.25, "POS": 0.75}),
            eraser_row("a.txt", "a.txt", hard_mask=[0, 0, 1], soft_scores=[0.0, 1.0, 2.0],
                       classification="NEG", classification_scores={"NEG": 0.5, "POS": 0.5})]
    assert rows[0]["rationales"][0]["hard_rationale_predictions"] == [{"start_token": 1, "end_token": 3},
                                                                       {"start_token": 4, "end_token": 5}]
    path = write_eraser_jsonl(rows, tmp_path / "r.jsonl", {"a.txt": 3, "b.txt": 5})
    lines = path.read_text().splitlines()
    assert [json.loads(line)["annotation_id"] for line in lines] == ["a.txt", "b.txt"]     # sorted
    assert lines[0] == json.dumps(json.loads(lines[0]), sort_keys=True)
    back = read_jsonl(path, {"a.txt": 3, "b.txt": 5})
    assert back == sorted(rows, key=lambda r: r["annotation_id"])
    assert hard_spans(back[1]) == [(1, 3), (4, 5)]
    assert set(back[1]) == {"annotation_id", "rationales", "classification", "classification_scores"}
    assert set(back[1]["rationales"][0]) == {"docid", "hard_rationale_predictions", "soft_rationale_predictions"}

    def bad(mutate, match, lengths=None):
        broken = json.loads(json.dumps(rows))
        mutate(broken)
        with pytest.raises(ValueError, match=match):
            check_eraser_rows(broken, lengths)

    hard = "hard_rationale_predictions"
    bad(lambda r: r[0]["rationales"][0][hard].append({"start_token": 2, "end_token": 4}), "overlap")
    bad(lambda r: None, "outside the document", {"a.txt": 2, "b.txt": 5})
    bad(lambda r: r[0]["rationales"][0].update(soft_rationale_predictions=[0.1]), "has 1 values", {"a.txt": 3,
                                                                                                     "b.txt": 5})
    bad(lambda r: r[1].update(annotation_id="b.txt"), "more than once")
    bad(lambda r: r[0].pop("classification_scores"), "must be given together")
    bad(lambda r: r[0].update(classification="MAYBE"), "no entry for the classification")
    bad(lambda r: r[0].update(classification_scores={"NEG": 2.0, "POS": 0.75}), "normalised")
    bad(lambda r: r[0].update(comprehensiveness_classification_scores={"NEG": 0.1, "POS": 0.9}), "all or none")
    bad(lambda r: r[0]["rationales"][0].pop("soft_rationale_predictions"), "all or none")
    bad(lambda r: r[0]["rationales"][0][hard].append({"start_token": 1.0, "end_token": 2}), "start_token: int")


@pytest.mark.skipif(not MOVIES.is_file(), reason="needs ../shared/data/eraser_movies")
def test_movie_reviews_evidence_spans_never_overlap_or_touch(tmp_path):
    """Runs of the union mask are ERASER's evidence spans on this release (the IOU-F1 truth convention)."""
    import tarfile

    with tarfile.open(MOVIES) as archive:
        for member in archive.getmembers():
            if not member.name.endswith(("train.jsonl", "val.jsonl", "test.jsonl")):
                continue
            for line in archive.extractfile(member).read().decode().splitlines():
                spans = sorted({(ev["start_token"], ev["end_token"])
                                for group in json.loads(line)["evidences"] for ev in group})
                assert all(e1 < s2 for (_, e1), (s2, _) in zip(spans, spans[1:])), member.name


# =============================================================================== the callback
METHODS = ("attention", "saliency")


def make_samples(seed: int, n_docs: int = 7, windows_doc: bool = True) -> List[dict]:
    """Hand-built samples: documents of random length, a random token -> word map (sub-words, words without a
    token, a truncated tail), random evidence; optionally one document in two overlapping windows."""
    rng = random.Random(seed)
    samples = []
    for d in range(n_docs):
        n_words = rng.randint(8 if windows_doc and d == 2 else 3, 30)
        rationale = [rng.random() < 0.3 for _ in range(n_words)]
        if d == 1:
            rationale = [False] * n_words                              # an annotation without evidence
        if windows_doc and d == 2:
            cut = n_words // 2
            spans = [(0, cut + 2), (cut - 1, n_words)]                  # overlapping windows, words cut-1 .. cut+1
        else:
            spans = [(0, n_words if d % 3 else max(1, n_words - 4))]      # every third document truncated
        for start, end in spans:
            ids = [-1]
            for w in range(start, end):
                ids += [w] * (0 if rng.random() < 0.08 else rng.randint(1, 3))
            ids.append(-1)
            samples.append({"word_ids": ids, "num_words": n_words, "word_offset": start, "rationale": rationale,
                            "label": d % 2, "docid": f"doc{d:02d}.txt", "annotation_id": f"doc{d:02d}.txt",
                            "document_index": d, "index": len(samples),
                            "relevance": {m: {s: [rng.choice([0.0, 0.25, 0.5, -0.5, rng.random()]) for _ in ids]
                                              for s in ("target", "predicted")} for m in METHODS},
                            "logits": [rng.gauss(0, 1), rng.gauss(0, 1)]})
            attention = samples[-1]["relevance"]["attention"]
            attention["predicted"] = attention["target"]                 # class-agnostic: one map
    return samples


def collate(samples: List[dict]):
    """A text batch (datamodules.text_common's layout) and the outputs of test_step for ``samples``; the
    ``attention`` method is class-agnostic (one tensor for both settings)."""
    b, n = len(samples), max(len(s["word_ids"]) for s in samples)
    w = max(s["num_words"] for s in samples)
    word_ids = torch.full((b, n), -1, dtype=torch.long)
    rationale = torch.zeros(b, w, dtype=torch.bool)
    relevance = {m: {s: torch.zeros(b, n) for s in ("target", "predicted")} for m in METHODS}
    for i, s in enumerate(samples):
        word_ids[i, : len(s["word_ids"])] = torch.tensor(s["word_ids"])
        rationale[i, : s["num_words"]] = torch.tensor(s["rationale"])
        for m in METHODS:
            for setting in ("target", "predicted"):
                relevance[m][setting][i, : len(s["word_ids"])] = torch.tensor(s["relevance"][m][setting])
    relevance["attention"]["predicted"] = relevance["attention"]["target"]      # the same tensor, as test_step
    batch = {"word_ids": word_ids, "rationale": rationale,
             **{k: torch.tensor([s[k] for s in samples]) for k in ("num_words", "word_offset", "label",
                                                                    "document_index", "index")},
             "docid": [s["docid"] for s in samples], "annotation_id": [s["annotation_id"] for s in samples]}
    logits = torch.tensor([s["logits"] for s in samples])
    outputs = {"relevance": relevance, "logits": logits,
               "targets": {"target": batch["label"], "predicted": logits.argmax(-1)}}
    return outputs, batch


def drive(test: RationaleTest, samples: List[dict], batch_size: int = 3) -> None:
    for start in range(0, len(samples), batch_size):
        test.update(*collate(samples[start:start + batch_size]))


def words_by_hand(samples: List[dict], method: str, setting: str, clamp: bool = True):
    """Per document: max over windows of the max over a word's tokens (clamped at 0), and its covered words."""
    docs = {}
    for s in samples:
        scores, covered = docs.setdefault(s["annotation_id"], ([0.0] * s["num_words"], [False] * s["num_words"]))
        for w, v in zip(s["word_ids"], s["relevance"][method][setting]):
            if w < 0:
                continue
            v = max(v, 0.0) if clamp else v
            scores[w] = v if not covered[w] else max(scores[w], v)
            covered[w] = True
    return docs


def test_callback_results_equal_a_direct_computation_on_its_export(tmp_path):
    samples = make_samples(0)
    ks = (1, 3, 5, 10)
    test = RationaleTest(class_settings=("target", "predicted"), ks=ks, class_names=["NEG", "POS"])
    reporter = ResultsReporter(tmp_path, print_results=False)
    trainer = SimpleNamespace(callbacks=[reporter], is_global_zero=True, datamodule=None)
    test.on_test_start(trainer, None)
    drive(test, samples)
    test.on_test_epoch_end(trainer, None)
    results = reporter.results
    truth = {s["annotation_id"]: {i for i, t in enumerate(s["rationale"]) if t} for s in samples}
    lengths = {s["docid"]: s["num_words"] for s in samples}
    folder = tmp_path / "rationales"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        f"{m}_{s}{suffix}.jsonl" for m in METHODS for s in ("target", "predicted")
        for suffix in [""] + [f"_top{k}" for k in ks])
    for method in METHODS:
        for setting in ("target", "predicted"):
            key = f"rationale/{method}/{setting}"
            by_hand = words_by_hand(samples, method, setting)
            soft = read_jsonl(folder / f"{method}_{setting}.jsonl", lengths)
            assert [r["annotation_id"] for r in soft] == sorted(truth)
            aucs = []
            for row in soft:
                scores = row["rationales"][0]["soft_rationale_predictions"]
                assert scores == pytest.approx(by_hand[row["annotation_id"]][0], abs=1e-7)
                if truth[row["annotation_id"]]:
                    aucs.append(sklearn_auprc([i in truth[row["annotation_id"]] for i in range(len(scores))],
                                              scores))
            assert results[f"{key}/auprc"] == pytest.approx(np.mean(aucs), abs=1e-12)
            for j, k in enumerate(ks):
                hard = read_jsonl(folder / f"{method}_{setting}_top{k}.jsonl", lengths)
                pred = {r["annotation_id"]: set(np.flatnonzero(mask_from_spans(hard_spans(r),
                                                                               lengths[r["annotation_id"]])))
                        for r in hard}
                for aid, chosen in pred.items():
                    assert chosen == top_k_by_hand(*by_hand[aid], k)
                want = eraser_token_prf(truth, pred)
                assert results[f"{key}/token_f1@{k}"] == pytest.approx(want["f1"], abs=1e-12)
                assert results[f"{key}/token_f1_micro@{k}"] == pytest.approx(want["micro_f1"], abs=1e-12)
                assert results[f"{key}/token_f1"][j] == results[f"{key}/token_f1@{k}"]
                assert results[f"{key}/token_precision"][j] == pytest.approx(want["p"], abs=1e-12)
                true_spans = {a: spans_from_mask([i in t for i in range(lengths[a])]) for a, t in truth.items()}
                want = eraser_iou_f1(true_spans, {r["annotation_id"]: hard_spans(r) for r in hard})
                assert results[f"{key}/iou_f1"][j] == pytest.approx(want["f1"], abs=1e-12)
                assert results[f"{key}/iou_f1_micro"][j] == pytest.approx(want["micro_f1"], abs=1e-12)
    coverage = [np.mean(c) for _, c in words_by_hand(samples, "attention", "target").values()]
    assert results["rationale/coverage"] == pytest.approx(np.mean(coverage), abs=1e-12)
    assert 0.5 < results["rationale/coverage"] < 1.0
    row = soft[0]
    logits = [torch.tensor(s["logits"]) for s in samples if s["annotation_id"] == row["annotation_id"]]
    probs = torch.stack([torch.softmax(x.double(), -1) for x in logits]).mean(0)
    assert row["classification"] == ["NEG", "POS"][int(probs.argmax())]
    assert row["classification_scores"]["POS"] == pytest.approx(float(probs[1]), abs=1e-12)
    declared = reporter.higher_is_better
    assert declared["rationale/attention/target/token_f1@5"] is True and declared["rationale/coverage"] is None
    assert reporter.curve_x["rationale/saliency/predicted/token_f1"] == [1.0, 3.0, 5.0, 10.0]


def test_windows_merge_by_max_and_repeated_samples_are_refused():
    samples = make_samples(4, n_docs=3)
    windows = [s for s in samples if s["document_index"] == 2]
    assert len(windows) == 2 and windows[1]["word_offset"] > 0
    test = RationaleTest(methods=["saliency"], ks=(2, 4), export_jsonl=False)
    drive(test, list(reversed(samples)), batch_size=2)               # window order does not matter
    test.compute()
    scores, covered = test._scores["rationale/saliency/target"][2]
    want_scores, want_covered = words_by_hand(windows, "saliency", "target")["doc02.txt"]
    assert scores.tolist() == pytest.approx(want_scores) and covered.tolist() == want_covered
    again = RationaleTest(methods=["saliency"], export_jsonl=False)
    again.update(*collate(samples[:1]))
    with pytest.raises(ValueError, match="evaluated twice"):
        again.update(*collate(samples[:1]))
    with pytest.raises(KeyError, match="lacks \\['rationale'\\]"):
        outputs, batch = collate(samples[1:2])
        batch.pop("rationale")
        again.update(outputs, batch)
    with pytest.raises(KeyError, match="no relevance for method 'saliency', class setting 'predicted'"):
        RationaleTest(methods=["saliency"], class_settings=("predicted",)).update(
            {"relevance": {"saliency": {"target": torch.zeros(1, 3)}}, "logits": torch.zeros(1, 2)},
            collate(samples[:1])[1])


def test_progress_state_resumes_to_the_same_results(tmp_path):
    """The base class's progress checkpoint (build arguments, metric states, extra state) through a weights-only
    file: a run resumed after 4 samples gives the numbers of an uninterrupted one."""
    samples = make_samples(5)
    whole = RationaleTest(ks=(2, 5), export_jsonl=False)
    drive(whole, samples)
    first = RationaleTest(ks=(2, 5), export_jsonl=False)
    drive(first, samples[:4])
    torch.save(first.progress_state(), tmp_path / "progress.pt")
    resumed = RationaleTest(ks=(2, 5), export_jsonl=False)
    resumed.on_test_start(SimpleNamespace(datamodule=None), None)
    resumed.build_from_progress(torch.load(tmp_path / "progress.pt", weights_only=True))
    assert len(resumed.metrics()) == len(first.metrics())
    drive(resumed, samples[4:])
    assert resumed.compute() == whole.compute()


def test_export_has_classification_only_with_class_names(tmp_path):
    test = RationaleTest(methods=["saliency"], ks=(3,))
    drive(test, make_samples(6, n_docs=3))
    test.compute()
    rows = read_jsonl(test.write_jsonl(tmp_path)[0])
    assert all(set(row) == {"annotation_id", "rationales"} for row in rows)   # ERASER needs the label names


# ------------------------------------------------------------------------------- one process vs two
SPLIT_SETTINGS = dict(class_settings=("target", "predicted"), ks=(1, 5, 10), class_names=["NEG", "POS"])


def test_two_ranks_gathered_equal_one_process(tmp_path, monkeypatch):
    """Two ranks (windows of one document on both, an uneven split) with the gather simulated in-process: rank 0
    scores every document, rank 1 nothing; the results and the files equal one process's."""
    import callbacks.rationale as module

    samples = make_samples(7, n_docs=8)
    assert len(samples) % 2 == 1
    single = RationaleTest(**SPLIT_SETTINGS)
    drive(single, samples, batch_size=2)
    results = single.compute()
    single.write_jsonl(tmp_path / "one")
    ranks = [RationaleTest(**SPLIT_SETTINGS) for _ in range(2)]
    for r, test in enumerate(ranks):
        drive(test, samples[r::2], batch_size=2)
    states = [(t._documents, t._scores, t._built_methods) for t in ranks]

    def gather(out, obj):
        out[:] = pickle.loads(pickle.dumps(states))

    monkeypatch.setattr(module.torch.distributed, "all_gather_object", gather)
    for r, test in enumerate(ranks):
        monkeypatch.setattr(module, "_distributed", lambda r=r: (r, 2))
        test.finalize()
    assert all(float(getattr(m, name).abs().sum()) == 0 for m in ranks[1].metrics() for name in m._defaults)
    two = ranks[0].compute()
    assert two == results                                                # the same sums in the same order
    ranks[0].write_jsonl(tmp_path / "two")
    one_files = sorted((tmp_path / "one").iterdir())
    assert [p.name for p in one_files] == sorted(p.name for p in (tmp_path / "two").iterdir())
    for path in one_files:
        assert path.read_bytes() == (tmp_path / "two" / path.name).read_bytes(), path.name


def _two_process_worker(rank: int, world: int, port: int, folder: str) -> None:
    with gloo_group(rank, world, port):
        test = RationaleTest(**SPLIT_SETTINGS)
        drive(test, make_samples(7, n_docs=8)[rank::world], batch_size=2)   # UnrepeatedDistributedSampler's split
        results = test.compute()
        if rank == 0:
            test.write_jsonl(Path(folder) / "rationales")
            (Path(folder) / "results.json").write_text(json.dumps(results, sort_keys=True))


@pytest.mark.slow
def test_two_gloo_processes_give_the_same_metrics_and_files(tmp_path):
    """The same with a real process group (all_gather_object, torchmetrics' sync): ~1 min on 2 busy cores."""
    single = RationaleTest(**SPLIT_SETTINGS)
    drive(single, make_samples(7, n_docs=8), batch_size=2)
    results = single.compute()
    single.write_jsonl(tmp_path / "one" / "rationales")
    (tmp_path / "two").mkdir()
    run_on_two_processes(_two_process_worker, str(tmp_path / "two"), base_port=29500)
    two = json.loads((tmp_path / "two" / "results.json").read_text())
    assert two.keys() == results.keys()
    for key, value in results.items():
        assert np.allclose(two[key], value, rtol=0, atol=1e-12, equal_nan=True), key
    one_files = sorted((tmp_path / "one" / "rationales").iterdir())
    assert [p.name for p in one_files] == sorted(p.name for p in (tmp_path / "two" / "rationales").iterdir())
    for path in one_files:
        assert path.read_bytes() == (tmp_path / "two" / "rationales" / path.name).read_bytes(), path.name
