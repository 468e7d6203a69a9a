"""SST-2 (GLUE's binary Stanford Sentiment Treebank) from split files the user gives, offline.

Files: GLUE's parquet (``SST-2-val.parquet``, as the Hugging Face ``glue/sst2`` export has it: columns
``sentence``, ``label``, ``idx``) or GLUE's original tab-separated files (``train.tsv``, ``dev.tsv``: a header
``sentence<TAB>label``); ``idx`` is optional. Rows keep the file's order; dataset index ``i`` is row ``i``.

* Label: 0 = negative, 1 = positive; any other value is an error naming the file and row (GLUE's *test* files
  hold no label, ``-1``: they cannot be evaluated).
* Words: ``text_common.whitespace_words`` of the sentence (GLUE's sentences are already tokenised and
  lower-cased); an empty sentence is an error.
* ``path`` is the evaluated file (``test_dataloader``/``predict_dataloader``); ``train_path`` and ``val_path`` are
  optional and needed only by ``fit``/``validate``.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import List, Optional, Tuple

from .text_common import TextDataModule, TextDocument, existing_path, whitespace_words

LABELS = (0, 1)
FORMAT = ("a GLUE SST-2 split file: .parquet with columns sentence, label (and idx), or .tsv with a header "
          "'sentence<TAB>label'")


def read_sst2(path: Path) -> List[Tuple[str, int, int]]:
    """``[(sentence, label, idx)]`` of a split file in file order; errors name the file and row."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as err:
            raise ValueError(f"cannot read {str(path)!r} as parquet ({err}); expected {FORMAT}") from err
        columns = set(table.column_names)
        if not {"sentence", "label"} <= columns:
            raise ValueError(f"{str(path)!r} has columns {sorted(columns)}; expected {FORMAT}")
        data = table.to_pydict()
        sentences, labels = data["sentence"], data["label"]
        ids = data.get("idx") or list(range(len(sentences)))
    elif suffix in (".tsv", ".txt"):
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            line = data[:err.start].count(b"\n") + 1
            raise ValueError(f"{path}:{line}: not UTF-8 text ({err.reason}); expected {FORMAT}") from None
        rows = list(csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE))
        if not rows or not {"sentence", "label"} <= set(rows[0]):
            raise ValueError(f"{str(path)!r} has header {rows[0] if rows else []}; expected {FORMAT}")
        header = rows[0]
        col_s, col_l = header.index("sentence"), header.index("label")
        col_i = header.index("idx") if "idx" in header else None
        sentences, labels, ids = [], [], []
        for r, row in enumerate(rows[1:]):
            if len(row) != len(header):
                raise ValueError(f"{path}:{r + 2}: {len(row)} fields, expected {len(header)} ({FORMAT})")
            sentences.append(row[col_s])
            try:
                labels.append(int(row[col_l]))
            except ValueError:
                raise ValueError(f"{path}:{r + 2}: label {row[col_l]!r} is not one of {LABELS}") from None
            if col_i is not None and not row[col_i].strip().lstrip("-").isdigit():
                raise ValueError(f"{path}:{r + 2}: idx {row[col_i]!r} is not an integer ({FORMAT})")
            ids.append(int(row[col_i]) if col_i is not None else r)
    else:
        raise ValueError(f"{str(path)!r}: unknown file type {suffix!r}; expected {FORMAT}")
    out = []
    for r, (sentence, label, idx) in enumerate(zip(sentences, labels, ids)):
        if label not in LABELS:
            raise ValueError(f"{str(path)!r}, row {r} (idx {idx}): label {label!r} is not one of {LABELS} "
                             "(0 negative, 1 positive; GLUE test files are unlabelled)")
        if not isinstance(sentence, str) or not sentence.strip():
            raise ValueError(f"{str(path)!r}, row {r} (idx {idx}): empty sentence; expected a non-empty sentence")
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise ValueError(f"{str(path)!r}, row {r}: idx {idx!r} is not an integer; expected {FORMAT}")
        out.append((sentence, int(label), int(idx)))
    if not out:
        raise ValueError(f"{str(path)!r} holds no sentence; expected {FORMAT}")
    return out


class SST2DataModule(TextDataModule):
    """SST-2 split files (module docstring) tokenized for a Hugging Face tokenizer (``datamodules.text_common``);
    ``prompt`` (a template with one ``{text}`` slot), ``padding_side`` and ``chat_template``: prompted
    classification with a decoder
    language model (:mod:`datamodules.prompts`)."""

    classes = ("negative", "positive")

    def __init__(self, path: str, tokenizer: Optional[str] = None, train_path: Optional[str] = None,
                 val_path: Optional[str] = None, max_length: int = 512, stride: Optional[int] = None,
                 batch_size: int = 32, num_workers: int = 0, eval_subset: Optional[int] = None,
                 prompt: Optional[str] = None, padding_side: str = "right", chat_template: bool = False) -> None:
        super().__init__(tokenizer, max_length=max_length, stride=stride, batch_size=batch_size,
                         num_workers=num_workers, eval_split="test", eval_subset=eval_subset, prompt=prompt,
                         padding_side=padding_side, chat_template=chat_template)
        self.save_hyperparameters()
        self.paths = {"train": train_path, "val": val_path, "test": path}

    def has_split(self, split: str) -> bool:
        return self.paths.get(split) is not None

    def load_documents(self, split: str) -> List[TextDocument]:
        if split not in self.paths:
            raise ValueError(f"unknown split {split!r}; choose one of {tuple(self.paths)}")
        if self.paths[split] is None:
            raise ValueError(f"no {split} file given: pass {split}_path (an SST-2 split file, {FORMAT})")
        path = existing_path(self.paths[split], f"SST-2 {split} file", FORMAT)
        return [TextDocument(words=whitespace_words(sentence), label=label, docid=str(idx))
                for sentence, label, idx in read_sst2(path)]
