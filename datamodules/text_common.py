"""Shared pieces of the text datamodules (Movie Reviews, 20 Newsgroups, SST-2): documents as words, archive
extraction to the cache, tokenization with exact word alignment, truncation or sliding windows, dynamic padding.

Documents
---------
A document is a list of **words** (:class:`TextDocument`): ERASER's whitespace tokens for Movie Reviews (the
tokens its evidence spans index), :func:`whitespace_words` of the text for the other datasets. Every word index
in a batch (``word_ids``, ``rationale``, ``word_offset``, ``num_words``) refers to this list.

Tokenization
------------
A Hugging Face *fast* tokenizer (:func:`models.sources.load_tokenizer`: a folder, a name in the local cache or a
registered spec, loaded with ``AutoTokenizer.from_pretrained(..., local_files_only=True)``: nothing is downloaded)
runs on the pre-split words (``is_split_into_words=True``), so every token knows the word it came from; a word
that tokenizes to ``[UNK]`` keeps its word index, and a word made only of characters the tokenizer deletes
(control characters) has no token.
For BERT tokenizers the token ids equal those of the raw text (:func:`whitespace_words` splits exactly where
BERT's normaliser sees whitespace).

* ``stride=None`` (default): one sample per document, truncated to ``max_length`` tokens with the special tokens
  (the head of the document is kept: Chefer's Movie Reviews pipeline, ``max_length=512, truncation=True``, no
  windowing). :meth:`TokenizedTextDataset.coverage` gives, per document, the fraction of its words that
  survive the truncation.
* ``stride=S``: sliding windows that cover the whole document. A window holds whole words, as many as fit in
  ``max_length`` minus the special tokens (a single word longer than that is cut: the only case where a word
  loses tokens); the next window starts at the first word at least ``S`` tokens after the current start, moved
  back if needed so that no word is skipped. Each window is one sample with its ``document_index`` and
  ``word_offset`` (the document index of its first word).

Prompts (``prompt``: a template with one ``{text}`` slot, :mod:`datamodules.prompts`): the words fill the slot,
the prompt is tokenized as one string, its template tokens are special tokens without a word and marked in
``template_mask``; the text is truncated to whole words so that the template always fits in ``max_length``.

Batches (:func:`collate_text`, padded to the longest sample of the batch, on the right or, ``padding_side="left"``,
on the left)
--------------------------------------------------------------------------------------------------------------
``input_ids``, ``attention_mask``, ``token_type_ids`` (when the tokenizer gives them), ``special_tokens_mask``
(1 at special tokens and padding, as Hugging Face pads it), with a prompt ``template_mask`` (1 at the template's
tokens): ``LongTensor[B, N]``; ``word_ids``:
``LongTensor[B, N]``, the document word index of each position, ``-1`` at special tokens and padding;
``label``, ``index`` (the sample's dataset index: seeds per-sample random baselines and splits evaluation over
processes exactly, see ``datamodules/unrepeated.py``), ``document_index``, ``word_offset``, ``num_words`` (words of
the whole document): ``LongTensor[B]``; ``docid`` and ``annotation_id`` (the document's id and its annotation's
id, ERASER's for Movie Reviews, else the document id): ``List[str]``; ``words``: ``List[List[str]]``, the words
of each sample (its window's words: document words ``word_offset ...``); where the dataset has rationales,
``rationale``: ``BoolTensor[B, W]``, the document's word-level human rationale, padded with False to the batch's
largest ``num_words``.
The batch can be passed to a method as it is (``methods`` read only the tokenizer's keys).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import Dataset

from models.sources import load_tokenizer, resolve_cache_dir

from .prompts import TEMPLATE_MASK, PromptTemplate, as_template, chat_prompt, encode_prompt, template_token_count
from .split_loaders import SplitDataLoaders

PathLike = Union[str, os.PathLike]

#: keys of a batch that a model (and ``methods``) reads
MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask")
#: the sides a batch may be padded on
PADDING_SIDES = ("right", "left")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".zip")

#: the characters :func:`whitespace_words` splits on: Python's whitespace minus the control characters other
#: than tab, newline and carriage return (``\x0b``, ``\x0c``, ``\x1c``-``\x1f``, ``\x85``), which BERT's
#: normaliser deletes instead of treating them as spaces
WORD_SEPARATORS = ("\t\n\r \xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
                   "\u2028\u2029\u202f\u205f\u3000")
_SEPARATOR_RE = re.compile("[" + re.escape(WORD_SEPARATORS) + "]+")


def whitespace_words(text: str) -> List[str]:
    """The words of ``text``: maximal runs of characters between :data:`WORD_SEPARATORS`."""
    return [w for w in _SEPARATOR_RE.split(text) if w]


# ------------------------------------------------------------------------------------------------- files
def existing_path(path: PathLike, what: str, expected: str) -> Path:
    """``path`` (``~`` expanded) if it exists, else a ``FileNotFoundError`` naming it and what was expected."""
    resolved = Path(os.path.expanduser(str(path)))
    if not resolved.exists():
        raise FileNotFoundError(f"{what} {str(resolved)!r} does not exist; expected {expected}")
    return resolved


def is_archive(path: Path) -> bool:
    return path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES)


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _safe_members(archive: tarfile.TarFile, path: Path) -> List[tarfile.TarInfo]:
    """The archive's directories and regular files; refuses absolute paths, ``..`` and links (names the file)."""
    members = []
    for member in archive.getmembers():
        name = Path(member.name)
        if name.is_absolute() or ".." in name.parts:
            raise ValueError(f"archive {str(path)!r} holds an unsafe path {member.name!r}; refusing to extract it")
        if member.isdir() or member.isfile():
            members.append(member)
    return members


def _make_writable(func, target, _exc) -> None:
    os.chmod(target, 0o700)
    func(target)


def _remove_tree(path: Path) -> None:
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=_make_writable)
    else:
        shutil.rmtree(path, onerror=_make_writable)


def extract_archive(path: PathLike, cache_dir: Optional[PathLike] = None) -> Path:
    """The folder where the archive ``path`` (tar, tar.gz/bz2/xz or zip) is extracted, under
    ``<cache>/datasets/<archive name>-<sha256 of its content>/``; extracted once. A corrupt archive (a compressed
    stream whose checksum fails included) is an error naming it; nothing of it is kept.

    Safe under concurrent processes: each extracts into its own temporary folder beside the target and renames
    it into place (atomic); a process that finds the target already there discards its copy.
    """
    path = existing_path(path, "archive", "a .tar.gz, .tar or .zip file")
    stem = path.name
    for suffix in ARCHIVE_SUFFIXES:
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    root = resolve_cache_dir(cache_dir) / "datasets"
    target = root / f"{stem}-{_file_digest(path)}"
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{stem}-", dir=root))
    try:
        try:
            if path.name.lower().endswith(".zip"):
                with zipfile.ZipFile(path) as archive:
                    for name in archive.namelist():
                        if Path(name).is_absolute() or ".." in Path(name).parts:
                            raise ValueError(f"archive {str(path)!r} holds an unsafe path {name!r}; "
                                             "refusing to extract it")
                    archive.extractall(tmp)
            else:
                with tarfile.open(path) as archive:
                    members = _safe_members(archive, path)
                    if hasattr(tarfile, "data_filter"):
                        archive.extractall(tmp, members=members, filter="data")
                    else:  # pragma: no cover - Python without extraction filters
                        archive.extractall(tmp, members=members)
                    while archive.fileobj.read(1 << 20):   # to the end: a compressed stream's checksum is checked
                        pass
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as err:
            raise ValueError(f"cannot extract archive {str(path)!r} (corrupt or not an archive): {err}") from err
        for folder, dirs, _ in os.walk(tmp):  # members may be read-only folders: keep the copy removable
            for name in dirs:
                os.chmod(os.path.join(folder, name), 0o755)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        if tmp.exists():
            _remove_tree(tmp)
    return target


# --------------------------------------------------------------------------------------------- documents
@dataclass
class TextDocument:
    """One document: its words, class index, optional word-level rationale (bool ``[len(words)]``), ids."""

    words: List[str]
    label: int
    docid: str
    rationale: Optional[np.ndarray] = None
    annotation_id: Optional[str] = None


class TokenizedTextDataset(Dataset):
    """Tokenized samples of a list of :class:`TextDocument` (truncation or sliding windows, see the module
    docstring). Items are dicts of Python lists and ints; :func:`collate_text` pads and stacks them.

    ``prompt``: a :class:`~datamodules.prompts.PromptTemplate` (or its string) around each document's words
    (:mod:`datamodules.prompts`: the prompt tokenized as one string, the template's tokens special and in
    ``template_mask``, the text truncated to whole words so that the template is never cut; no sliding windows)."""

    def __init__(self, documents: Sequence[TextDocument], tokenizer: Any, max_length: int = 512,
                 stride: Optional[int] = None, prompt: Union[None, str, PromptTemplate] = None) -> None:
        self.documents = list(documents)
        self.tokenizer = load_tokenizer(tokenizer)
        self.max_length = int(max_length)
        self.prompt = prompt if isinstance(prompt, PromptTemplate) else as_template(prompt)
        if self.prompt is not None and stride is not None:
            raise ValueError("a prompt template classifies each document once: sliding windows (stride) are not "
                             "supported with a prompt; leave stride unset (the text is truncated to max_length)")
        specials = int(self.tokenizer.num_special_tokens_to_add(pair=False))
        if self.prompt is not None:
            specials = template_token_count(self.tokenizer, self.prompt)
        self.capacity = self.max_length - specials
        if self.capacity < 1:
            what = "the prompt template's and special" if self.prompt is not None else "the"
            raise ValueError(f"max_length must leave room for at least one token besides {what} {specials} "
                             f"tokens, got {max_length}")
        self.stride = None if stride is None else int(stride)
        if self.stride is not None and not 1 <= self.stride <= self.capacity:
            raise ValueError(f"stride must lie in [1, max_length - {specials} = {self.capacity}] tokens so that the "
                             f"windows cover every word, got {stride}")
        self.has_rationale = any(doc.rationale is not None for doc in self.documents)
        if self.stride is None:
            self.windows: List[Tuple[int, int, int]] = [(d, 0, len(doc.words)) for d, doc in enumerate(self.documents)]
        else:
            self.windows = self._sliding_windows()

    def word_token_counts(self) -> List[np.ndarray]:
        """Per document, the number of tokens of each word (without special tokens, untruncated)."""
        counts: List[np.ndarray] = []
        chunk = 256
        for start in range(0, len(self.documents), chunk):
            docs = self.documents[start:start + chunk]
            nonempty = [doc.words for doc in docs if doc.words]
            enc = (self.tokenizer(nonempty, is_split_into_words=True, add_special_tokens=False, verbose=False)
                   if nonempty else None)
            k = 0
            for doc in docs:
                if not doc.words:
                    counts.append(np.zeros(0, dtype=np.int64))
                    continue
                ids = [w for w in enc.word_ids(k) if w is not None]
                counts.append(np.bincount(np.asarray(ids, dtype=np.int64), minlength=len(doc.words)))
                k += 1
        return counts

    def _sliding_windows(self) -> List[Tuple[int, int, int]]:
        windows = []
        for d, counts in enumerate(self.word_token_counts()):
            n = len(counts)
            starts = np.concatenate([[0], np.cumsum(counts)])  # token offset of each word, and the total
            s = 0
            while True:
                e = int(np.searchsorted(starts, starts[s] + self.capacity, side="right")) - 1
                e = min(max(e, s + 1), n) if n else 0
                windows.append((d, s, e))
                if e >= n:
                    break
                nxt = int(np.searchsorted(starts, starts[s] + self.stride, side="left"))
                s = min(max(nxt, s + 1), e)
        return windows

    def __len__(self) -> int:
        return len(self.windows)

    def encode(self, words: Sequence[str]) -> Dict[str, List[int]]:
        """The tokenizer's encoding of ``words`` (truncated to ``max_length``) with ``word_ids`` (-1: special);
        with a prompt, :func:`datamodules.prompts.encode_prompt` (``template_mask`` too)."""
        if self.prompt is not None:
            enc = encode_prompt(self.tokenizer, self.prompt, words, self.max_length)
            enc.pop("num_kept_words")
            return enc
        if words:
            enc = self.tokenizer(list(words), is_split_into_words=True, truncation=True, max_length=self.max_length,
                                 return_special_tokens_mask=True)
            word_ids = [-1 if w is None else int(w) for w in enc.word_ids()]
        else:
            enc = self.tokenizer("", truncation=True, max_length=self.max_length, return_special_tokens_mask=True)
            word_ids = [-1] * len(enc["input_ids"])
        out = {key: list(enc[key]) for key in MODEL_INPUT_KEYS if key in enc}
        out.setdefault("attention_mask", [1] * len(out["input_ids"]))
        out["word_ids"] = word_ids
        return out

    def __getitem__(self, index: int) -> Dict[str, Any]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        index = index % len(self)
        d, start, end = self.windows[index]
        doc = self.documents[d]
        item: Dict[str, Any] = self.encode(doc.words[start:end])
        item["word_ids"] = [w + start if w >= 0 else -1 for w in item["word_ids"]]
        item.update(label=int(doc.label), index=index, document_index=d, word_offset=start,
                    num_words=len(doc.words), words=list(doc.words[start:end]), docid=str(doc.docid),
                    annotation_id=str(doc.annotation_id if doc.annotation_id is not None else doc.docid))
        if self.has_rationale:
            item["rationale"] = (doc.rationale if doc.rationale is not None
                                 else np.zeros(len(doc.words), dtype=bool))
        return item

    def coverage(self) -> np.ndarray:
        """Per document (truncation mode), the fraction of its words that survive truncation: words up to and
        including the last word with a token in the input (a word cut inside counts); 1 for an empty document."""
        if self.stride is not None:
            raise ValueError("coverage is defined for truncation (stride=None); sliding windows cover every word")
        out = np.ones(len(self.documents), dtype=np.float64)
        if self.prompt is not None:   # whole words are kept
            for d, doc in enumerate(self.documents):
                if doc.words:
                    kept = encode_prompt(self.tokenizer, self.prompt, doc.words, self.max_length)["num_kept_words"]
                    out[d] = kept / len(doc.words)
            return out
        for d, counts in enumerate(self.word_token_counts()):
            if len(counts) == 0:
                continue
            tokens = np.cumsum(counts)  # tokens up to and including each word
            first_cut = int(np.searchsorted(tokens, self.capacity, side="left"))  # last word with a kept token
            kept = min(first_cut + 1, len(counts)) if tokens[-1] > self.capacity else len(counts)
            out[d] = kept / len(counts)
        return out


def collate_text(items: Sequence[Dict[str, Any]], pad_token_id: int = 0, pad_to: Optional[int] = None,
                 padding_side: str = "right") -> Dict[str, Any]:
    """Pads the items of :class:`TokenizedTextDataset` to the batch's longest, or to ``pad_to`` positions, on the
    ``padding_side`` (``right``, default, or ``left``: each row's tokens end at the last column, as decoders are
    usually fed), and stacks them (keys and shapes: module docstring)."""
    if not items:
        raise ValueError("cannot collate an empty batch")
    if padding_side not in PADDING_SIDES:
        raise ValueError(f"padding_side must be one of {PADDING_SIDES}, got {padding_side!r}")
    b = len(items)
    n = max(len(item["input_ids"]) for item in items)
    if pad_to is not None:
        if pad_to < n:
            raise ValueError(f"cannot pad to {pad_to} positions a batch whose longest sample has {n} tokens")
        n = int(pad_to)
    pad_values = {"input_ids": int(pad_token_id), "attention_mask": 0, "token_type_ids": 0,
                  "special_tokens_mask": 1, "word_ids": -1, TEMPLATE_MASK: 0}
    batch: Dict[str, torch.Tensor] = {}
    for key, value in pad_values.items():
        if key not in items[0]:
            continue
        out = torch.full((b, n), value, dtype=torch.long)
        for i, item in enumerate(items):
            length = len(item[key])
            columns = slice(n - length, n) if padding_side == "left" else slice(0, length)
            out[i, columns] = torch.as_tensor(item[key], dtype=torch.long)
        batch[key] = out
    for key in ("label", "index", "document_index", "word_offset", "num_words"):
        batch[key] = torch.tensor([int(item[key]) for item in items], dtype=torch.long)
    for key in ("docid", "annotation_id"):
        if key in items[0]:
            batch[key] = [str(item[key]) for item in items]
    if "words" in items[0]:
        batch["words"] = [list(item["words"]) for item in items]
    if "rationale" in items[0]:
        w = int(batch["num_words"].max())
        mask = torch.zeros((b, w), dtype=torch.bool)
        for i, item in enumerate(items):
            r = np.asarray(item["rationale"], dtype=bool)
            mask[i, : len(r)] = torch.from_numpy(r)
        batch["rationale"] = mask
    return batch


class TextCollator:
    """Picklable ``collate_fn`` (worker processes) that pads with the tokenizer's pad id on ``padding_side``."""

    def __init__(self, pad_token_id: int, pad_to: Optional[int] = None, padding_side: str = "right") -> None:
        if padding_side not in PADDING_SIDES:
            raise ValueError(f"padding_side must be one of {PADDING_SIDES}, got {padding_side!r}")
        self.pad_token_id = int(pad_token_id)
        self.pad_to = pad_to
        self.padding_side = padding_side

    def __call__(self, items: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
        return collate_text(items, self.pad_token_id, self.pad_to, self.padding_side)


# ------------------------------------------------------------------------------------------- datamodule
def evenly_spaced(n: int, m: int) -> List[int]:
    """``m`` distinct indices of ``range(n)`` spread evenly, first and last included (``m <= n``)."""
    if m >= n:
        return list(range(n))
    if m == 1:
        return [0]
    return sorted({int(round(i * (n - 1) / (m - 1))) for i in range(m)})


class TextDataModule(SplitDataLoaders, pl.LightningDataModule):
    """Train/val/test splits of a text dataset as :class:`TokenizedTextDataset` batches. A subclass sets
    ``classes`` and implements :meth:`load_documents`; ``eval_split`` is the split that ``test_dataloader``
    and ``predict_dataloader`` serve.

    ``eval_subset=M`` evaluates M documents of the eval split, evenly spaced in its order (document
    ``round(i * (n - 1) / (M - 1))`` for ``i < M``: both classes of a split stored class by class, the same
    documents on every run and process count); ``None`` (default) the whole split. ``pad_to_max_length``: every
    batch padded to ``max_length`` positions (Beyond Intuition's 20 Newsgroups inputs) instead of to its longest
    sample. ``prompt``: a template with one ``{text}`` slot (e.g. ``"Review: {text}\\nSentiment:"``) around each
    document, for prompted classification with a decoder language model (:mod:`datamodules.prompts`: the
    template's tokens are read, never ranked, scored or removed; the text is truncated, never the template).
    ``padding_side``: ``right`` (default) or ``left`` (decoders; a decoder's scores and logits are the same
    either way). ``chat_template``: the prompt is the user's message in the tokenizer's chat template, read out
    where the assistant's reply begins (:func:`datamodules.prompts.chat_prompt`; instruct models)."""

    classes: Tuple[str, ...] = ()
    splits: Tuple[str, ...] = ("train", "val", "test")

    def __init__(self, tokenizer: Optional[str] = None, max_length: int = 512, stride: Optional[int] = None,
                 batch_size: int = 16, num_workers: int = 0, eval_split: str = "test",
                 eval_subset: Optional[int] = None, pad_to_max_length: bool = False, prompt: Optional[str] = None,
                 padding_side: str = "right", chat_template: bool = False) -> None:
        super().__init__()
        self.pad_to_max_length = bool(pad_to_max_length)
        # a malformed template: ValueError when the config is read (a chat template adds the answer cue)
        self.prompt = as_template(prompt, require_cue=not chat_template)
        if chat_template and self.prompt is None:
            raise ValueError("chat_template: true puts the prompt template into the tokenizer's chat template: give a "
                             "prompt (a template with one {text} slot)")
        self.chat_template = bool(chat_template)
        if padding_side not in PADDING_SIDES:
            raise ValueError(f"padding_side must be one of {PADDING_SIDES}, got {padding_side!r}")
        self.padding_side = padding_side
        if eval_subset is not None and eval_subset < 1:
            raise ValueError(f"eval_subset must be >= 1 documents or None (the whole split), got {eval_subset}")
        self.eval_subset = eval_subset
        if batch_size < 1 or num_workers < 0:
            raise ValueError(f"batch_size must be >= 1 and num_workers >= 0, got {batch_size}, {num_workers}")
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2 tokens, got {max_length}")
        self.tokenizer_spec = tokenizer
        self.max_length, self.stride = int(max_length), stride
        self.batch_size, self.num_workers = batch_size, num_workers
        self.eval_split = eval_split
        self._tokenizer = None
        self._documents: Dict[str, List[TextDocument]] = {}
        self.datasets: Dict[str, TokenizedTextDataset] = {}

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            if self.tokenizer_spec is None:
                raise ValueError(f"{type(self).__name__} has no tokenizer: give one (--data.init_args.tokenizer "
                                 "<folder or name>), or evaluate a Hugging Face classifier saved with its tokenizer "
                                 "(evaluate.py then uses the model's)")
            self._tokenizer = load_tokenizer(self.tokenizer_spec)
        return self._tokenizer

    def set_model_data_config(self, data_config: Dict[str, Any]) -> None:
        """The evaluated model's data facts (``evaluate.py`` hands them over before setup): its tokenizer is used
        when the datamodule was given none; a tokenizer given explicitly is kept."""
        if self.tokenizer_spec is None and data_config.get("tokenizer") is not None:
            self.tokenizer_spec = data_config["tokenizer"]

    def load_documents(self, split: str) -> List[TextDocument]:
        raise NotImplementedError

    def documents(self, split: str) -> List[TextDocument]:
        if split not in self._documents:
            documents = self.load_documents(split)
            if split == self.eval_split and self.eval_subset is not None and self.eval_subset < len(documents):
                documents = [documents[i] for i in evenly_spaced(len(documents), self.eval_subset)]
            self._documents[split] = documents
        return self._documents[split]

    def dataset(self, split: str) -> TokenizedTextDataset:
        if split not in self.datasets:
            prompt = chat_prompt(self.tokenizer, self.prompt) if self.chat_template and self.prompt else self.prompt
            self.datasets[split] = TokenizedTextDataset(self.documents(split), self.tokenizer, self.max_length,
                                                        self.stride, prompt=prompt)
        return self.datasets[split]

    def split_for(self, stage: str) -> str:
        return self.eval_split if stage in ("test", "predict") else stage

    def collate_fn(self) -> TextCollator:
        return TextCollator(self.tokenizer.pad_token_id or 0, self.max_length if self.pad_to_max_length else None,
                            self.padding_side)


def size_range(value: Sequence[int], what: str) -> Tuple[int, int]:
    """``value`` as ``(min, max)``, checked: ``1 <= min <= max`` (``what`` names it in the error)."""
    low, high = (int(v) for v in value)
    if not 1 <= low <= high:
        raise ValueError(f"{what} must be (min, max) with 1 <= min <= max, got {tuple(value)}")
    return low, high


class GeneratedTextDataModule(TextDataModule):
    """A benchmark generated from ``seed`` (:mod:`.planted_words`, :mod:`.associative_recall`): the splits
    ``train``, ``val``, ``test`` of ``train_size``, ``val_size``, ``test_size`` documents (:meth:`split_size`),
    ``eval_split`` one of them; the other options are :class:`TextDataModule`'s."""

    def __init__(self, tokenizer: Optional[str], train_size: int, val_size: int, test_size: int, seed: int,
                 **options: Any) -> None:
        super().__init__(tokenizer, **options)
        if self.eval_split not in self.splits:
            raise ValueError(f"eval_split must be one of {self.splits}, got {self.eval_split!r}")
        self.sizes = {"train": int(train_size), "val": int(val_size), "test": int(test_size)}
        if min(self.sizes.values()) < 0:
            raise ValueError(f"split sizes must be >= 0, got {self.sizes}")
        self.seed = int(seed)

    def has_split(self, split: str) -> bool:
        return self.sizes.get(split, 0) > 0

    def split_size(self, split: str) -> int:
        """How many documents ``split`` has; ``ValueError`` for a split that is none of the three."""
        if split not in self.sizes:
            raise ValueError(f"unknown split {split!r}; choose among {self.splits}")
        return self.sizes[split]
