"""ERASER Movie Reviews (DeYoung et al. 2020) with its human rationales, read offline from the release.

Release layout (the ``movies.tar.gz`` archive, extracted once to ``$TOKEN_ATTRIBUTIONS_CACHE``, or its folder)::

    movies/docs/<docid>            one review per file (e.g. negR_000.txt): one sentence per line, tokens
                                   separated by single spaces (already tokenised)
    movies/{train,val,test}.jsonl  one annotation per line: {"annotation_id", "classification": "NEG"|"POS",
                                   "evidences": [[{"docid", "start_token", "end_token", "text", ...}, ...], ...],
                                   "docids" (optional), "query", ...}

The path may be the archive, the ``movies`` folder or a folder that holds it.

* Words: ERASER's tokens of the document - lines stripped, empty lines dropped, each line split on single spaces,
  empty tokens dropped, sentences concatenated (the "flattened" document whose whitespace-token offsets the
  evidence spans use). Every evidence's ``text`` must equal its span's words joined by spaces (checked: a
  mismatch means the words are not the ones the spans index).
* Label: ``NEG`` = 0, ``POS`` = 1 (Chefer's ``classes: [NEG, POS]``).
* Rationale: the union of every evidence of every evidence group (ERASER's token-level truth), a bool mask over
  the document's words; an annotation without evidence has an all-False mask.
* Splits: ``train`` (1600), ``val`` (200), ``test`` (199 in this release: Chefer's and BI's token-F1 set); splits
  joined with ``+`` are concatenated in that order (``test+train+val``: the 1,999 documents of BI's perturbation).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from .text_common import TextDataModule, TextDocument, existing_path, extract_archive, is_archive

LABELS: Dict[str, int] = {"NEG": 0, "POS": 1}
SPLIT_FILES = ("train", "val", "test")
#: documents per split of the ERASER release
RELEASE_COUNTS = {"train": 1600, "val": 200, "test": 199}
LAYOUT = ("the ERASER Movie Reviews release: docs/<docid> (one tokenised review per file) and "
          "train.jsonl, val.jsonl, test.jsonl (one annotation per line), or its .tar.gz archive")


def eraser_tokens(path: Path) -> List[str]:
    """ERASER's whitespace tokens of the document file ``path`` (module docstring); errors name the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"document {str(path)!r} is not UTF-8 text: {err}") from err
    words = [token for line in text.split("\n") for token in line.strip().split(" ") if token]
    if not words:
        raise ValueError(f"document {str(path)!r} is empty: expected one tokenised review (tokens separated by "
                         "spaces, one sentence per line)")
    return words


def find_release_root(path: Path, cache_dir: Optional[str] = None) -> Path:
    """The folder holding ``docs/`` and the split files: ``path`` itself, its ``movies/`` folder, or the same
    inside the extracted archive ``path``."""
    if is_archive(path):
        path = extract_archive(path, cache_dir)
    elif not path.is_dir():
        raise ValueError(f"{str(path)!r} is neither a folder nor an archive (.tar.gz, .tar, .zip); expected {LAYOUT}")
    for root in (path, path / "movies"):
        if (root / "docs").is_dir() and any((root / f"{s}.jsonl").is_file() for s in SPLIT_FILES):
            return root
    found = sorted(p.name for p in path.iterdir())[:8]
    raise ValueError(f"{str(path)!r} does not hold the ERASER layout (found {found}); expected {LAYOUT}")


def load_split(root: Path, split: str, cache: Optional[Dict[str, List[str]]] = None) -> List[TextDocument]:
    """The annotated documents of ``<root>/<split>.jsonl`` in file order; errors name the file and line."""
    jsonl = root / f"{split}.jsonl"
    if not jsonl.is_file():
        raise FileNotFoundError(f"split file {str(jsonl)!r} does not exist; expected {LAYOUT}")
    cache = {} if cache is None else cache
    documents: List[TextDocument] = []
    with open(jsonl, "rb") as handle:
        for line_no, raw in enumerate(handle, 1):
            where = f"{jsonl}:{line_no}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{where}: not UTF-8 text ({err.reason}); expected a JSON annotation") from None
            if not line.strip():
                continue
            try:
                ann = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not a JSON object ({err}); expected one annotation per line") from err
            if not isinstance(ann, dict):
                raise ValueError(f"{where}: not a JSON object; expected one annotation per line")
            missing = [k for k in ("annotation_id", "classification", "evidences") if k not in ann]
            if missing:
                raise ValueError(f"{where}: annotation lacks {missing}; expected annotation_id, classification and "
                                 "evidences")
            label = ann["classification"]
            if not isinstance(label, str) or label not in LABELS:
                raise ValueError(f"{where}: classification {label!r} is not one of {sorted(LABELS)}")
            groups, listed = ann["evidences"] or [], ann.get("docids") or []
            if not (isinstance(groups, list) and all(isinstance(g, list) and all(isinstance(ev, dict) for ev in g)
                                                     for g in groups) and isinstance(listed, list)):
                raise ValueError(f"{where}: evidences must be a list of lists of evidences (objects with docid, "
                                 f"start_token, end_token) and docids a list; got {str(groups)[:80]}, {listed!r}")
            evidences = [ev for group in groups for ev in group]
            docids = {str(ev["docid"]) for ev in evidences if "docid" in ev} | set(map(str, listed))
            if not docids:
                docids = {str(ann["annotation_id"])}
            if len(docids) != 1:
                raise ValueError(f"{where}: annotation refers to {len(docids)} documents {sorted(docids)}; expected "
                                 "one document per annotation (Movie Reviews)")
            docid = docids.pop()
            if docid not in cache:
                doc_path = root / "docs" / docid
                if not doc_path.is_file():
                    raise FileNotFoundError(f"{where}: annotation {ann['annotation_id']!r} refers to document "
                                            f"{docid!r}, but {str(doc_path)!r} does not exist")
                cache[docid] = eraser_tokens(doc_path)
            words = cache[docid]
            rationale = np.zeros(len(words), dtype=bool)
            for ev in evidences:
                try:
                    start, end = int(ev["start_token"]), int(ev["end_token"])
                except (KeyError, TypeError, ValueError) as err:
                    raise ValueError(f"{where}: evidence without integer start_token/end_token: {ev}") from err
                if not 0 <= start <= end <= len(words):
                    raise ValueError(f"{where}: evidence span [{start}, {end}) lies outside document {docid!r} "
                                     f"of {len(words)} tokens")
                text = ev.get("text")
                if text is not None and " ".join(words[start:end]) != text:
                    raise ValueError(f"{where}: evidence text {str(text)[:60]!r} differs from tokens {start}..{end} of "
                                     f"document {docid!r} ({' '.join(words[start:end])[:60]!r}): the document is not "
                                     "the one the spans index")
                rationale[start:end] = True
            documents.append(TextDocument(words=words, label=LABELS[label], docid=docid, rationale=rationale,
                                          annotation_id=str(ann["annotation_id"])))
    if not documents:
        raise ValueError(f"split file {str(jsonl)!r} holds no annotation; expected one JSON annotation per line")
    return documents


class MovieReviewsDataModule(TextDataModule):
    """ERASER Movie Reviews (module docstring) tokenized for a Hugging Face tokenizer (``datamodules.text_common``:
    truncation to ``max_length`` or sliding windows with ``stride``); batches carry ``rationale``.

    ``eval_split`` (default ``test``) is what ``test_dataloader``/``predict_dataloader`` serve; ``+`` joins splits
    (``test+train+val``). ``cache_dir`` overrides ``$TOKEN_ATTRIBUTIONS_CACHE`` for the extracted archive.
    ``prompt`` (a template with one ``{text}`` slot), ``padding_side`` and ``chat_template``: prompted
    classification with a decoder
    language model (``datamodules.text_common.TextDataModule``, :mod:`datamodules.prompts`)."""

    classes = ("NEG", "POS")

    def __init__(self, path: str, tokenizer: Optional[str] = None, eval_split: str = "test", max_length: int = 512,
                 stride: Optional[int] = None, batch_size: int = 16, num_workers: int = 0,
                 cache_dir: Optional[str] = None, eval_subset: Optional[int] = None, prompt: Optional[str] = None,
                 padding_side: str = "right", chat_template: bool = False) -> None:
        super().__init__(tokenizer, max_length=max_length, stride=stride, batch_size=batch_size,
                         num_workers=num_workers, eval_split=eval_split, eval_subset=eval_subset, prompt=prompt,
                         padding_side=padding_side, chat_template=chat_template)
        self.save_hyperparameters()
        for part in eval_split.split("+"):
            if part not in SPLIT_FILES:
                raise ValueError(f"eval_split parts must be among {SPLIT_FILES} (joined with '+'), got {eval_split!r}")
        self.path = path
        self.cache_dir = cache_dir
        self._root: Optional[Path] = None
        self._words: Dict[str, List[str]] = {}

    @property
    def root(self) -> Path:
        if self._root is None:
            self._root = find_release_root(existing_path(self.path, "Movie Reviews path", LAYOUT), self.cache_dir)
        return self._root

    def load_documents(self, split: str) -> List[TextDocument]:
        documents: List[TextDocument] = []
        for part in split.split("+"):
            if part not in SPLIT_FILES:
                raise ValueError(f"unknown split {part!r}; choose among {SPLIT_FILES} (joined with '+')")
            documents += load_split(self.root, part, self._words)
        return documents
