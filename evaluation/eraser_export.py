"""Rationales in ERASER's results format (JSONL), so that ERASER's own scorer (``rationale_benchmark/metrics.py``,
``--results``) can read them: a writer and a schema check.

One JSON object per line, one line per annotation, keys sorted (ERASER's ``write_jsonl``), lines sorted by
``annotation_id`` (so any number of processes writes the same file)::

    {"annotation_id": str,
     "rationales": [{"docid": str,
                     "hard_rationale_predictions": [{"start_token": int, "end_token": int}, ...],  # optional
                     "soft_rationale_predictions": [float, ...]}],                                # optional
     "classification": str,                                   # optional, with classification_scores
     "classification_scores": {class name: probability},      # normalised, as ERASER requires
     "comprehensiveness_classification_scores": {...},        # optional, needs classification
     "sufficiency_classification_scores": {...},              # optional, needs classification
     "thresholded_scores": [{"threshold": float, "comprehensiveness_classification_scores": {...},
                             "sufficiency_classification_scores": {...}}, ...]}   # optional (AOPC)

Field names are exactly those ERASER's scorer reads (``Rationale.from_instance``,
``PositionScoredDocument.from_results``, ``score_classifications``, ``compute_aopc_scores``). Spans are token
offsets of the flattened document, ``start_token`` inclusive and ``end_token`` exclusive; the hard rationale of a
document is written as its maximal runs (:func:`evaluation.rationale_selection.spans_from_mask`), so spans never
overlap or touch. ``soft_rationale_predictions`` holds one value per document token.

:func:`check_eraser_rows` raises for everything ERASER's ``verify_instances`` / ``verify_instance`` reject
(duplicate annotation ids, overlapping or out-of-range spans, soft predictions of the wrong length, a
classification without scores, optional fields present on some instances only, differing AOPC thresholds) and for
what its scoring would trip over (a ``classification`` missing from its score dicts, non-finite numbers, empty
spans). Note that ERASER decides whether to score hard rationales from the **first** instance only: a file whose
first instance has no hard span is scored for soft predictions and classification only.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np

from .rationale_selection import spans_from_mask

HARD = "hard_rationale_predictions"
SOFT = "soft_rationale_predictions"
CLASSIFICATION = "classification"
CLASSIFICATION_SCORES = "classification_scores"
COMPREHENSIVENESS = "comprehensiveness_classification_scores"
SUFFICIENCY = "sufficiency_classification_scores"
THRESHOLDED = "thresholded_scores"
#: optional instance fields that must be on every instance or on none (ERASER's ``verify_instances``)
ALL_OR_NONE = (CLASSIFICATION, COMPREHENSIVENESS, SUFFICIENCY, THRESHOLDED)


def eraser_row(annotation_id: str, docid: str, *, hard_mask: Optional[Sequence[bool]] = None,
               soft_scores: Optional[Sequence[float]] = None, classification: Optional[str] = None,
               classification_scores: Optional[Mapping[str, float]] = None) -> Dict[str, Any]:
    """One ERASER instance (module docstring) for a single-document annotation. The hard rationale is given as a
    word mask (written as its maximal runs); the other fields are written when given."""
    rationale: Dict[str, Any] = {"docid": str(docid)}
    if hard_mask is not None:
        rationale[HARD] = [{"start_token": s, "end_token": e} for s, e in spans_from_mask(hard_mask)]
    if soft_scores is not None:
        rationale[SOFT] = [float(v) for v in np.asarray(soft_scores, dtype=np.float64).reshape(-1)]
    row: Dict[str, Any] = {"annotation_id": str(annotation_id), "rationales": [rationale]}
    if classification_scores is not None:
        row[CLASSIFICATION_SCORES] = {str(c): float(p) for c, p in classification_scores.items()}
    if classification is not None:
        row[CLASSIFICATION] = str(classification)
    return row


# -------------------------------------------------------------------------------------------------- schema
def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _score_dict_problem(value: Any, name: str, classification: Any) -> Optional[str]:
    if not isinstance(value, dict) or not value:
        return f"{name} must be a non-empty dict {{class name: probability}}, got {type(value).__name__}"
    if not all(isinstance(k, str) and _is_number(v) for k, v in value.items()):
        return f"{name} must map class names (str) to finite numbers"
    if isinstance(classification, str) and classification not in value:
        return f"{name} has no entry for the classification {classification!r} (ERASER reads that entry)"
    return None


def _instance_problems(row: Any, lengths: Optional[Mapping[str, int]]) -> List[str]:
    if not isinstance(row, dict):
        return [f"an instance must be a JSON object, got {type(row).__name__}"]
    problems: List[str] = []
    if not isinstance(row.get("annotation_id"), str):
        problems.append("annotation_id must be a string")
    rationales = row.get("rationales")
    if not isinstance(rationales, list):
        return problems + ["rationales must be a list of {docid, hard_rationale_predictions, "
                           "soft_rationale_predictions}"]
    seen = set()
    soft_present = []
    for rat in rationales:
        if not isinstance(rat, dict) or not isinstance(rat.get("docid"), str):
            problems.append("every rationale must be an object with a string docid")
            continue
        docid = rat["docid"]
        if docid in seen:
            problems.append(f"docid {docid!r} appears more than once (ERASER allows one rationale per document)")
        seen.add(docid)
        length = None if lengths is None else lengths.get(docid)
        if lengths is not None and length is None:
            problems.append(f"docid {docid!r} is not a known document")
        hard = rat.get(HARD, [])
        if not isinstance(hard, list):
            problems.append(f"{HARD} of {docid!r} must be a list")
            hard = []
        spans = []
        for span in hard:
            if not isinstance(span, dict) or not _is_int(span.get("start_token")) \
                    or not _is_int(span.get("end_token")):
                problems.append(f"{HARD} of {docid!r} must hold {{start_token: int, end_token: int}}, got {span!r}")
                continue
            s, e = span["start_token"], span["end_token"]
            if not 0 <= s < e or (length is not None and e > length):
                problems.append(f"span [{s}, {e}) of {docid!r} is empty or outside the document"
                                + ("" if length is None else f" of {length} tokens"))
            spans.append((s, e))
        spans.sort()
        for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
            if s2 < e1:
                problems.append(f"spans [{s1}, {e1}) and [{s2}, {e2}) of {docid!r} overlap")
        soft = rat.get(SOFT)
        soft_present.append(soft is not None)
        if soft is not None:
            if not isinstance(soft, list) or not all(_is_number(v) for v in soft):
                problems.append(f"{SOFT} of {docid!r} must be a list of finite numbers")
            elif length is not None and len(soft) != length:
                problems.append(f"{SOFT} of {docid!r} has {len(soft)} values for a document of {length} tokens")
    if any(soft_present) and not all(soft_present):
        problems.append(f"{SOFT} given for some but not all documents of the instance")
    classification = row.get(CLASSIFICATION)
    if (CLASSIFICATION in row) != (CLASSIFICATION_SCORES in row):
        problems.append(f"{CLASSIFICATION} and {CLASSIFICATION_SCORES} must be given together")
    if CLASSIFICATION in row and not isinstance(classification, str):
        problems.append(f"{CLASSIFICATION} must be a string, got {classification!r}")
    if CLASSIFICATION_SCORES in row:
        problem = _score_dict_problem(row[CLASSIFICATION_SCORES], CLASSIFICATION_SCORES, classification)
        if problem is None and abs(sum(row[CLASSIFICATION_SCORES].values()) - 1.0) > 1e-4:
            problem = f"{CLASSIFICATION_SCORES} must be normalised (sum 1), sums to " \
                      f"{sum(row[CLASSIFICATION_SCORES].values())}"
        if problem:
            problems.append(problem)
    for key in (COMPREHENSIVENESS, SUFFICIENCY):
        if key in row:
            if CLASSIFICATION not in row:
                problems.append(f"{key} needs {CLASSIFICATION} and {CLASSIFICATION_SCORES}")
            problem = _score_dict_problem(row[key], key, classification)
            if problem:
                problems.append(problem)
    if THRESHOLDED in row:
        if not all(k in row for k in (CLASSIFICATION, CLASSIFICATION_SCORES, COMPREHENSIVENESS, SUFFICIENCY)):
            problems.append(f"{THRESHOLDED} needs {CLASSIFICATION}, {CLASSIFICATION_SCORES}, {COMPREHENSIVENESS} "
                            f"and {SUFFICIENCY}")
        entries = row[THRESHOLDED]
        if not isinstance(entries, list) or not entries:
            problems.append(f"{THRESHOLDED} must be a non-empty list")
        else:
            for entry in entries:
                if not isinstance(entry, dict) or not _is_number(entry.get("threshold")):
                    problems.append(f"every {THRESHOLDED} entry needs a numeric threshold, got {entry!r}")
                    continue
                for key in (COMPREHENSIVENESS, SUFFICIENCY):
                    problem = _score_dict_problem(entry.get(key), f"{THRESHOLDED}[{entry['threshold']}].{key}",
                                                  classification)
                    if problem:
                        problems.append(problem)
    return problems


def check_eraser_rows(rows: Sequence[Mapping[str, Any]], document_lengths: Optional[Mapping[str, int]] = None,
                      where: str = "ERASER rows") -> None:
    """Raise a ``ValueError`` naming ``where``, the instances and the problems, if ``rows`` are not a valid ERASER
    results file (module docstring); ``document_lengths`` (``{docid: tokens}``) also checks span ends and the
    length of soft predictions."""
    problems: List[str] = []
    ids = [row.get("annotation_id") if isinstance(row, dict) else None for row in rows]
    seen, duplicates = set(), set()
    for i in ids:
        (duplicates if i in seen else seen).add(i)
    if duplicates:
        problems.append(f"annotation ids appear more than once: {sorted(map(str, duplicates))[:5]}")
    for i, row in enumerate(rows):
        for problem in _instance_problems(row, document_lengths):
            problems.append(f"instance {i} ({ids[i]!r}): {problem}")
    dict_rows = [row for row in rows if isinstance(row, dict)]
    for key in ALL_OR_NONE:
        having = sum(key in row for row in dict_rows)
        if 0 < having < len(dict_rows):
            problems.append(f"{key} is on {having} of {len(dict_rows)} instances: all or none must have it")
    soft = [any(isinstance(r, dict) and SOFT in r for r in row.get("rationales") or []) for row in dict_rows]
    if 0 < sum(soft) < len(soft):
        problems.append(f"{SOFT} is on {sum(soft)} of {len(soft)} instances: all or none must have it")
    thresholds = {tuple(sorted(e.get("threshold") for e in row[THRESHOLDED] if isinstance(e, dict)))
                  for row in dict_rows if isinstance(row.get(THRESHOLDED), list)}
    if len(thresholds) > 1:
        problems.append(f"instances have different {THRESHOLDED} thresholds: {sorted(thresholds)[:3]}")
    if problems:
        shown = "\n  ".join(problems[:10])
        more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise ValueError(f"{where} are not valid ERASER results:\n  {shown}{more}")


# -------------------------------------------------------------------------------------------------- files
def write_eraser_jsonl(rows: Iterable[Mapping[str, Any]], path: os.PathLike,
                       document_lengths: Optional[Mapping[str, int]] = None) -> Path:
    """Check ``rows`` (:func:`check_eraser_rows`) and write them to ``path`` sorted by annotation id, one
    ``json.dumps(row, sort_keys=True)`` per line (written to a temporary file, then renamed into place)."""
    rows = sorted(rows, key=lambda row: str(row.get("annotation_id")))
    path = Path(path)
    check_eraser_rows(rows, document_lengths, where=f"rows for {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, sort_keys=True, allow_nan=False))
            handle.write("\n")
    os.replace(tmp, path)
    return path
