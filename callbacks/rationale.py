"""Rationale test (Chefer et al. 2021a on ERASER Movie Reviews; ERASER's scorer, DeYoung et al. 2020),
PROTOCOLS.md sections 4 and 8.

For every method and class setting (``target``: the map explained the gold label, as Chefer, default;
``predicted``: the argmax class), on every document:

1. the token scores ``outputs["relevance"][method][setting]`` (``[B, N]``) are clamped at 0 (``clamp``, Chefer's
   ``cam.clamp(min=0)``; ``clamp=False`` keeps the signs) and reduced to the document's words
   (:func:`evaluation.words.document_word_scores`: ``max`` over a word's tokens by default, Chefer's; a word
   with no token in the input is uncovered and scores 0);
2. for each ``k`` in ``ks`` (5, 10, ..., 80) the top-``k`` covered words are the hard rationale (ties, uncovered
   words, one top-k per ``k``: :mod:`evaluation.rationale_selection`);
3. scored against the document's human rationale (``batch["rationale"]``, the union of every evidence) exactly as
   ERASER's scorer does (:mod:`evaluation.rationale_metrics`; IOU-F1 at ``iou_threshold``).

Documents and windows
---------------------
Samples are gathered per document (``batch["document_index"]``). A truncated document is one sample (its tail is
uncovered and its evidence there counts against recall: Chefer's policy). With sliding windows
(``datamodules.text_common``, ``stride``) a document is several samples: a word's score is the **max over the
windows** that cover it (each window's map computed alone), covered if any window covers it, and the document's
class probabilities are the mean of its windows' softmax (in window order). Samples are kept until the end of
the test epoch, when every process's documents are gathered (``torch.distributed.all_gather_object`` when a
process group is initialised: the windows of one document may fall on different processes), merged, sorted by
annotation id and scored on global rank 0 into the metric states (the other ranks contribute zeros), so one
process and several give identical numbers. A window seen twice (same document and ``word_offset``) is an error.

Results (``rationale/<method>/<setting>/...``), every one higher-is-better:

* ``token_f1@<k>`` (ERASER token-level ``instance_macro`` F1, Chefer's metric), ``token_f1_micro@<k>``;
* curves over ``k`` (``curve_x`` = ks): ``token_f1``, ``token_precision``, ``token_recall`` (``instance_macro``),
  ``token_f1_micro``, ``iou_f1`` (ERASER's ``partial_match_score`` macro F1) and ``iou_f1_micro``;
* ``auprc`` (mean over documents with a true word);

and ``rationale/coverage`` (mean fraction of a document's words covered by the input; no direction).

Export (``export_jsonl``, default on): at the end, global rank 0 writes, in the run folder of the
:class:`~callbacks.reporter.ResultsReporter` (its ``output_dir``; nothing when it has none), ERASER results files
(:mod:`evaluation.eraser_export`) sorted by annotation id:
``rationales/<method>_<setting>.jsonl`` (``soft_rationale_predictions``: the word scores, one per document
token) and ``rationales/<method>_<setting>_top<k>.jsonl`` for every ``k`` (``hard_rationale_predictions``: the
top-k words as maximal runs; Chefer's layout of one file per ``k``; one file, since the soft scores of every
``k`` would repeat), each with ``classification`` and ``classification_scores`` (the clean prediction; written
only when class names are known, from ``class_names`` or the datamodule's ``classes``, because ERASER looks the
names up among the annotation labels). ERASER's scorer reads them: ``--results <file> --data_dir <movies> --split
test``. It scores **every** annotation of the split file: on a subset of documents it would count the missing
ones as instances with recall 0 (and its classification scoring stops on them), so give it a split file of the
evaluated annotations; the results here are over the evaluated documents.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torchmetrics import Metric

from evaluation.eraser_export import eraser_row, write_eraser_jsonl
from evaluation.metrics import MeanOverImages
from evaluation.rationale_metrics import (
    DEFAULT_IOU_THRESHOLD,
    SoftAUPRC,
    SpanIOUF1,
    TokenF1,
    soft_auprc,
    span_iou_matches,
    token_counts,
)
from evaluation.rationale_selection import DEFAULT_KS, check_ks, top_k_masks
from evaluation.result_keys import ResultKey
from evaluation.words import check_reduction, document_word_scores, word_mask

from .base import EvaluationCallback, OncePerMap, Result, outputs_device, relevance_for
from .reporter import ResultsReporter

PREFIX = "rationale"
COVERAGE = ResultKey(PREFIX, metric="coverage").format()
#: batch keys the test reads (``datamodules.text_common`` batches of a dataset with rationales)
BATCH_KEYS = ("word_ids", "word_offset", "num_words", "rationale", "label", "docid", "annotation_id",
              "document_index")
#: documents scored per chunk at the end of the epoch
CHUNK = 64
SUPPORTED_SETTINGS = ("target", "predicted")
#: the metric states of a method and setting
STATES = {"token": TokenF1, "iou": SpanIOUF1, "auprc": SoftAUPRC}
#: result metric -> (metric state, its computed value): one result per k (``<metric><k>``), curves over k
POINTS = {"token_f1@": ("token", "f1"), "token_f1_micro@": ("token", "micro_f1")}
CURVES = {"token_f1": ("token", "f1"), "token_precision": ("token", "p"), "token_recall": ("token", "r"),
          "token_f1_micro": ("token", "micro_f1"), "iou_f1": ("iou", "f1"), "iou_f1_micro": ("iou", "micro_f1")}


def _distributed() -> Tuple[int, int]:
    """``(rank, world size)`` of the default process group, ``(0, 1)`` without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _file_stem(method: str, setting: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{method}_{setting}")


class RationaleTest(EvaluationCallback):
    """ERASER token-F1, IOU-F1 and AUPRC per method and class setting, and the ERASER JSONL export (module
    docstring).

    Args:
        methods: method names (default: every method of the module's outputs).
        class_settings: explained classes to test: ``target`` (gold label, Chefer's; default) and/or
            ``predicted``.
        ks: the sizes of the top-k hard rationales (default 5, 10, ..., 80).
        reduction: token scores -> word score: ``max`` (Chefer's), ``sum``, ``mean`` or ``absmax``.
        iou_threshold: IoU at which a predicted span matches a true one (ERASER's default 0.5).
        clamp: clamp the token scores at 0 before the word reduction (Chefer's ``cam.clamp(min=0)``).
        export_jsonl: write the ERASER results files into the run folder at the end.
        class_names: names of the classes for the export's ``classification`` (default: the datamodule's
            ``classes``, else the class indices as strings).
    """

    def __init__(self, methods: Optional[Sequence[str]] = None, class_settings: Sequence[str] = ("target",),
                 ks: Sequence[int] = DEFAULT_KS, reduction: str = "max",
                 iou_threshold: float = DEFAULT_IOU_THRESHOLD, clamp: bool = True, export_jsonl: bool = True,
                 class_names: Optional[Sequence[str]] = None) -> None:
        super().__init__()
        self._select(methods, class_settings, SUPPORTED_SETTINGS)
        check_reduction(reduction)
        if not 0.0 < float(iou_threshold) <= 1.0:
            raise ValueError(f"iou_threshold must lie in (0, 1], got {iou_threshold}")
        self.ks = check_ks(ks)
        self.reduction = reduction
        self.iou_threshold = float(iou_threshold)
        self.clamp = bool(clamp)
        self.export_jsonl = bool(export_jsonl)
        self.class_names: Optional[List[str]] = list(class_names) if class_names is not None else None
        self.reset()

    # -------------------------------------------------------------------------------- metrics
    @staticmethod
    def _key(method: str, setting: str) -> str:
        return f"{PREFIX}/{method}/{setting}"

    def _pairs(self) -> List[Tuple[str, str]]:
        return [(m, s) for m in self._built_methods for s in self.class_settings]

    def build(self, methods: Sequence[str], device=None) -> None:
        """Metric states per method and class setting: token P/R/F1, IOU-F1, AUPRC; and the coverage."""
        self._built_methods = list(methods)
        self._metrics: Dict[str, Metric] = {}
        for m, s in self._pairs():
            self._metrics[f"{self._key(m, s)}/token"] = TokenF1(len(self.ks))
            self._metrics[f"{self._key(m, s)}/iou"] = SpanIOUF1(len(self.ks))
            self._metrics[f"{self._key(m, s)}/auprc"] = SoftAUPRC()
        self._metrics[f"{PREFIX}/coverage"] = MeanOverImages()
        self._place_metrics(device)

    def reset(self) -> None:
        self._metrics = {}
        self._built_methods: List[str] = []
        #: document_index -> {annotation_id, docid, label, num_words, rationale, probs: {word_offset: [C]}}
        self._documents: Dict[int, Dict[str, Any]] = {}
        #: "method/setting" -> document_index -> (word scores [num_words], covered [num_words])
        self._scores: Dict[str, Dict[int, Tuple[np.ndarray, np.ndarray]]] = {}
        self._rows: Dict[str, Tuple[List[dict], Dict[int, List[dict]]]] = {}
        self._finalized = False
        self.written: List[Path] = []

    # -------------------------------------------------------------------------------- resumable state
    def extra_progress_state(self) -> dict:
        """This process's documents so far and their word scores, as tensors and plain values (a progress file is
        read with ``torch.load(weights_only=True)``, callbacks.progress); the metric states stay empty until the
        end of the epoch, so this is the whole progress of the test."""
        documents = [{"document_index": int(d), "annotation_id": m["annotation_id"], "docid": m["docid"],
                      "label": int(m["label"]), "num_words": int(m["num_words"]),
                      "rationale": torch.from_numpy(m["rationale"].copy()), "windows": sorted(m["windows"]),
                      "probs": [[int(o), torch.from_numpy(np.array(p, dtype=np.float64))]
                                for o, p in sorted(m["probs"].items())]}
                     for d, m in self._documents.items()]
        scores = {key: [[int(d), torch.from_numpy(s.copy()), torch.from_numpy(c.copy())]
                        for d, (s, c) in table.items()] for key, table in self._scores.items()}
        return {"documents": documents, "scores": scores}

    def load_extra_progress_state(self, state: dict) -> None:
        """Take back :meth:`extra_progress_state` (after ``build`` and the metric states were restored)."""
        if not state:
            return
        missing = [k for k in ("documents", "scores") if k not in state]
        if missing:
            raise KeyError(f"rationale: the progress state lacks {missing}")
        self._documents = {}
        for m in state["documents"]:
            self._documents[int(m["document_index"])] = {
                "annotation_id": str(m["annotation_id"]), "docid": str(m["docid"]), "label": int(m["label"]),
                "num_words": int(m["num_words"]), "rationale": m["rationale"].numpy().astype(bool),
                "windows": set(int(o) for o in m["windows"]),
                "probs": {int(o): p.numpy().astype(np.float64) for o, p in m["probs"]}}
        self._scores = {key: {int(d): (s.numpy(), c.numpy().astype(bool)) for d, s, c in rows}
                        for key, rows in state["scores"].items()}
        self._rows, self._finalized = {}, False

    # -------------------------------------------------------------------------------- Lightning hooks
    def on_test_start(self, trainer, pl_module) -> None:
        super().on_test_start(trainer, pl_module)
        if self.class_names is None:
            classes = getattr(getattr(trainer, "datamodule", None), "classes", None)
            if classes:
                self.class_names = [str(c) for c in classes]

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        super().on_test_epoch_end(trainer, pl_module)      # compute(): gathers, scores, reports
        if self.export_jsonl and trainer.is_global_zero:
            folder = ResultsReporter.of(trainer).output_dir
            if folder is not None:
                self.write_jsonl(Path(folder) / "rationales")

    # -------------------------------------------------------------------------------- update
    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        if self._finalized:
            raise RuntimeError("rationale: update after compute; call reset() to start a new run")
        relevance = outputs["relevance"]
        missing = [k for k in BATCH_KEYS if k not in batch]
        if missing:
            raise KeyError(f"rationale: the batch lacks {missing}; the test needs a text batch with word-level "
                           f"rationales (datamodules.text_common, e.g. MovieReviewsDataModule)")
        if not self._metrics:
            methods = self.methods if self.methods is not None else (self._built_methods or list(relevance))
            self.build(methods, outputs_device(outputs))
        word_ids, num_words = batch["word_ids"], batch["num_words"].long()
        word_offset = batch["word_offset"].long()
        b = word_ids.shape[0]
        for key in ("word_offset", "num_words", "label", "document_index", "docid", "annotation_id"):
            if len(batch[key]) != b:
                raise ValueError(f"rationale: batch[{key!r}] has {len(batch[key])} entries for {b} samples")
        rationale = batch["rationale"]
        if rationale.dim() != 2 or rationale.shape[0] != b or (b and rationale.shape[1] < int(num_words.max())):
            raise ValueError(f"rationale: batch['rationale'] must be [B={b}, W >= max(num_words)], got "
                             f"{tuple(rationale.shape)}")
        logits = outputs.get("logits")
        probs = None if logits is None else torch.softmax(logits.detach().to(torch.float64), dim=-1).cpu().numpy()
        self._register_samples(batch, probs)

        once = OncePerMap()      # class-agnostic methods give one tensor for every setting: reduce it once
        for method, setting in self._pairs():
            rel = relevance_for(relevance, method, setting, "rationale")

            def word_scores(rel=rel, method=method, setting=setting):
                scores = rel.detach()
                if scores.dtype != torch.float64:
                    scores = scores.float()          # half precision: reduce in float32 (numpy has no bf16)
                if self.clamp:
                    scores = scores.clamp(min=0)
                try:
                    words = document_word_scores(scores, word_ids.to(scores.device), word_offset, num_words,
                                                 self.reduction)
                except ValueError as err:
                    raise ValueError(f"rationale: method {method!r}, setting {setting!r}: {err}") from None
                return words[0].cpu().numpy(), words[1].cpu().numpy()

            words = once.get(rel, word_scores)
            self._merge_scores(self._key(method, setting), batch["document_index"], num_words, *words)

    def _register_samples(self, batch: Dict[str, Any], probs: Optional[np.ndarray]) -> None:
        num_words = batch["num_words"].tolist()
        offsets = batch["word_offset"].tolist()
        rationale = batch["rationale"].detach().cpu().numpy().astype(bool)
        for i, doc in enumerate(batch["document_index"].tolist()):
            n = int(num_words[i])
            meta = {"annotation_id": str(batch["annotation_id"][i]), "docid": str(batch["docid"][i]),
                    "label": int(batch["label"][i]), "num_words": n, "rationale": rationale[i, :n].copy(),
                    "windows": {int(offsets[i])}, "probs": {} if probs is None else {int(offsets[i]): probs[i]}}
            _merge_document(self._documents, int(doc), meta)

    def _merge_scores(self, key: str, documents: torch.Tensor, num_words: torch.Tensor, scores: np.ndarray,
                      covered: np.ndarray) -> None:
        table = self._scores.setdefault(key, {})
        for i, doc in enumerate(documents.tolist()):
            n = int(num_words[i])
            _merge_words(table, int(doc), scores[i, :n].copy(), covered[i, :n].copy())

    # -------------------------------------------------------------------------------- end of epoch
    def finalize(self) -> None:
        """Gather every process's documents, merge windows, and score them into the metric states on global rank 0
        (idempotent; a collective when a process group is initialised: every rank must call it)."""
        if self._finalized:
            return
        rank, world = _distributed()
        documents, scores = self._documents, self._scores
        if world > 1:
            gathered: List[Any] = [None] * world
            torch.distributed.all_gather_object(gathered, (documents, scores, self._built_methods))
            documents, scores = {}, {}
            for docs_r, scores_r, methods_r in gathered:
                for doc, meta in docs_r.items():
                    _merge_document(documents, doc, meta)
                for key, table in scores_r.items():
                    merged = scores.setdefault(key, {})
                    for doc, (s, c) in table.items():
                        _merge_words(merged, doc, s, c)
                if not self._built_methods and methods_r:
                    self._built_methods = list(methods_r)
        if not self._metrics:
            self.build(self._built_methods or self.methods or [])
        self._finalized = True
        if rank != 0:
            return
        order = sorted(documents, key=lambda d: (documents[d]["annotation_id"], d))
        ids = [documents[d]["annotation_id"] for d in order]
        duplicated = sorted({a for a, b in zip(ids, ids[1:]) if a == b})
        if duplicated:
            raise ValueError(f"rationale: annotation ids {duplicated[:5]} belong to more than one document index")
        classes = {d: self._document_classification(documents[d]) for d in order} if self.export_jsonl else {}
        self._rows = ({self._key(m, s): ([], {k: [] for k in self.ks}) for m, s in self._pairs()}
                      if self.export_jsonl else {})
        for start in range(0, len(order), CHUNK):
            self._score_chunk(order[start:start + CHUNK], documents, scores, classes)

    def _score_chunk(self, chunk: List[int], documents: Dict[int, dict],
                     scores: Dict[str, Dict[int, Tuple[np.ndarray, np.ndarray]]],
                     classes: Dict[int, Dict[str, Any]]) -> None:
        """Score documents ``chunk`` (padded to their longest) into the metric states; keep their export rows."""
        n = torch.tensor([documents[d]["num_words"] for d in chunk], dtype=torch.long)
        width = int(n.max())
        truth = torch.zeros(len(chunk), width, dtype=torch.bool)
        for i, d in enumerate(chunk):
            truth[i, : n[i]] = torch.from_numpy(documents[d]["rationale"])
        valid = word_mask(n, width)
        for method, setting in self._pairs():
            key = self._key(method, setting)
            table = scores.get(key, {})
            missing = [documents[d]["annotation_id"] for d in chunk if d not in table]
            if missing:
                raise RuntimeError(f"rationale: no word scores of {key} for documents {missing[:3]}")
            s = torch.zeros(len(chunk), width, dtype=torch.float64)
            c = torch.zeros(len(chunk), width, dtype=torch.bool)
            for i, d in enumerate(chunk):
                s[i, : n[i]] = torch.from_numpy(table[d][0].astype(np.float64))
                c[i, : n[i]] = torch.from_numpy(table[d][1])
            hard = top_k_masks(s, c, self.ks)
            device = self._metrics[f"{key}/token"].device
            self._metrics[f"{key}/token"].update(*(x.to(device) for x in token_counts(hard, truth)))
            matches = span_iou_matches(hard, truth, self.iou_threshold)
            self._metrics[f"{key}/iou"].update(*(x.to(device) for x in matches))
            self._metrics[f"{key}/auprc"].update(soft_auprc(s, truth, valid).to(device))
            if key in self._rows:
                self._add_rows(self._rows[key], chunk, documents, classes, s, hard.numpy(), n.tolist())
        # coverage depends on the tokens only, not on the method: taken from the first method's covered words
        first = scores[self._key(self._built_methods[0], self.class_settings[0])] if self._built_methods else {}
        covered = torch.tensor([float(first[d][1].sum()) if d in first else 0.0 for d in chunk], dtype=torch.float64)
        fraction = torch.where(n > 0, covered / n.clamp(min=1), torch.ones_like(covered))
        metric = self._metrics[f"{PREFIX}/coverage"]
        metric.update(fraction.to(metric.device))

    def _add_rows(self, rows: Tuple[List[dict], Dict[int, List[dict]]], chunk: List[int],
                  documents: Dict[int, dict], classes: Dict[int, Dict[str, Any]], scores: torch.Tensor,
                  hard: np.ndarray, num_words: List[int]) -> None:
        soft_rows, hard_rows = rows
        for i, d in enumerate(chunk):
            meta, n = documents[d], num_words[i]
            soft_rows.append(eraser_row(meta["annotation_id"], meta["docid"], soft_scores=scores[i, :n].numpy(),
                                        **classes[d]))
            for j, k in enumerate(self.ks):
                hard_rows[k].append(eraser_row(meta["annotation_id"], meta["docid"], hard_mask=hard[i, j, :n],
                                               **classes[d]))

    def _document_classification(self, meta: Dict[str, Any]) -> Dict[str, Any]:
        """ERASER's ``classification`` and ``classification_scores`` of a document: the mean of its windows' class
        probabilities (window order), its argmax; empty without logits or class names."""
        if not meta["probs"] or self.class_names is None:
            return {}
        mean = np.mean([meta["probs"][o] for o in sorted(meta["probs"])], axis=0)
        names = self.class_names
        if len(names) != len(mean):
            raise ValueError(f"rationale: {len(names)} class names {names} for {len(mean)} classes of the logits")
        return {"classification": names[int(np.argmax(mean))],
                "classification_scores": {name: float(p) for name, p in zip(names, mean)}}

    def write_jsonl(self, folder) -> List[Path]:
        """Write the ERASER results files (module docstring) into ``folder``; returns their paths. Call after
        :meth:`compute` on global rank 0 (the only rank holding the rows)."""
        self.finalize()
        if not self.export_jsonl:
            raise RuntimeError("rationale: export_jsonl is off, no rows were kept")
        folder = Path(folder)
        paths: List[Path] = []
        for method, setting in self._pairs():
            soft_rows, hard_rows = self._rows[self._key(method, setting)]
            lengths = {row["rationales"][0]["docid"]: len(row["rationales"][0]["soft_rationale_predictions"])
                       for row in soft_rows}
            stem = _file_stem(method, setting)
            paths.append(write_eraser_jsonl(soft_rows, folder / f"{stem}.jsonl", lengths))
            for k, rows in hard_rows.items():
                paths.append(write_eraser_jsonl(rows, folder / f"{stem}_top{k}.jsonl", lengths))
        self.written = paths
        return paths

    # -------------------------------------------------------------------------------- compute
    @staticmethod
    def _result(method: str, setting: str, metric: str) -> str:
        return ResultKey(PREFIX, method, setting, metric).format()

    def compute(self) -> Dict[str, Result]:
        self.finalize()
        results: Dict[str, Result] = {}
        for method, setting in self._pairs():
            key = self._key(method, setting)
            # every rank: torchmetrics syncs the sums (and squeezes a single k to 0-d: reshape back)
            values = {state: {n: v.reshape(-1) for n, v in self._metrics[f"{key}/{state}"].compute().items()}
                      for state in ("token", "iou")}
            for j, k in enumerate(self.ks):
                for metric, (state, name) in POINTS.items():
                    results[self._result(method, setting, f"{metric}{k}")] = float(values[state][name][j])
            for metric, (state, name) in CURVES.items():
                results[self._result(method, setting, metric)] = [float(v) for v in values[state][name]]
            results[self._result(method, setting, "auprc")] = float(self._metrics[f"{key}/auprc"].compute())
        results[COVERAGE] = float(self._metrics[f"{PREFIX}/coverage"].compute())
        return results

    def _result_keys(self) -> Dict[str, Tuple[Optional[bool], bool]]:
        """``{result key: (higher_is_better, is a curve over k)}``."""
        keys: Dict[str, Tuple[Optional[bool], bool]] = {}
        for method, setting in self._pairs():
            for k in self.ks:
                for metric, (state, _) in POINTS.items():
                    keys[self._result(method, setting, f"{metric}{k}")] = (STATES[state].higher_is_better, False)
            for metric, (state, _) in CURVES.items():
                keys[self._result(method, setting, metric)] = (STATES[state].higher_is_better, True)
            keys[self._result(method, setting, "auprc")] = (SoftAUPRC.higher_is_better, False)
        keys[COVERAGE] = (MeanOverImages.higher_is_better, False)
        return keys

    def higher_is_better(self) -> Dict[str, Optional[bool]]:
        return {key: better for key, (better, _) in self._result_keys().items()}

    def curve_x(self) -> Dict[str, List[float]]:
        return {key: [float(k) for k in self.ks] for key, (_, curve) in self._result_keys().items() if curve}


# ------------------------------------------------------------------------------------------------ merging
def _merge_document(documents: Dict[int, Dict[str, Any]], doc: int, meta: Dict[str, Any]) -> None:
    """Add one sample's (or one process's) record of document ``doc``; its windows must be new."""
    windows = set(meta["windows"])
    have = documents.get(doc)
    if have is None:
        documents[doc] = dict(meta, probs=dict(meta["probs"]), windows=windows)
        return
    for field in ("annotation_id", "docid", "label", "num_words"):
        if have[field] != meta[field]:
            raise ValueError(f"rationale: document index {doc} has {field} {have[field]!r} in one sample and "
                             f"{meta[field]!r} in another")
    if not np.array_equal(have["rationale"], meta["rationale"]):
        raise ValueError(f"rationale: document index {doc} ({meta['annotation_id']!r}) has two different rationales")
    again = have["windows"] & windows
    if again:
        raise ValueError(f"rationale: document {meta['annotation_id']!r} (index {doc}) was evaluated twice at word "
                         f"offset {sorted(again)}: a sampler repeated it (use datamodules.unrepeated)")
    have["windows"] |= windows
    have["probs"].update(meta["probs"])


def _merge_words(table: Dict[int, Tuple[np.ndarray, np.ndarray]], doc: int, scores: np.ndarray,
                 covered: np.ndarray) -> None:
    """Max-merge one window's word scores into the document's (a word covered by one side takes its score)."""
    have = table.get(doc)
    if have is None:
        table[doc] = (scores, covered)
        return
    s, c = have
    both = c & covered
    merged = np.where(both, np.maximum(s, scores), np.where(covered, scores, s))
    table[doc] = (merged.astype(np.result_type(s, scores)), c | covered)
