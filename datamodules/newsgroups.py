"""20 Newsgroups, read offline from either release, cleaned exactly as scikit-learn cleans it.

Layouts (a folder, or a .tar.gz / .tar / .zip archive extracted once to ``$TOKEN_ATTRIBUTIONS_CACHE``)::

    20_newsgroups/<group>/<message>            the original release (20news-19997: 19,997 messages, full headers);
                                               the group folders may also sit directly in the given folder
    20news-bydate-train/<group>/<message>      the by-date release that sklearn's ``fetch_20newsgroups`` and
    20news-bydate-test/<group>/<message>       Beyond Intuition use (11,314 train / 7,532 test)

* Classes: the 20 group names sorted (:data:`NEWSGROUPS`, ``alt.atheism`` = 0 ... ``talk.religion.misc`` = 19),
  sklearn's ``target``; a folder that is not one of them is an error, a release with fewer groups keeps these
  indices.
* Text: the file's bytes decoded as latin-1 (sklearn's ``load_files(..., encoding="latin1")``), then, for each
  entry of ``remove`` in sklearn's order, sklearn's own ``strip_newsgroup_header`` (everything before the first
  blank line), ``strip_newsgroup_footer`` (the last block after a blank or dashed line) and
  ``strip_newsgroup_quoting`` (lines quoting or introducing a quote): the text of
  ``fetch_20newsgroups(remove=remove)``. A message that these leave empty is kept, as sklearn keeps it (its sample
  is ``[CLS] [SEP]``); a message *file* that is empty is an error. Words: ``text_common.whitespace_words``.
* By-date splits: ``test`` is the by-date test folder in the order of ``fetch_20newsgroups(subset="test")``
  (files sorted per sorted group, shuffled by ``load_files``' ``RandomState(0)`` then by
  ``fetch_20newsgroups``' ``RandomState(42)``), so dataset index ``i`` is sklearn's document ``i``; ``train`` and
  ``val`` split the by-date train folder (same sklearn order) with ``val_fraction`` of each group drawn for ``val``
  (seeded by ``split_seed``; ``val_fraction=0`` leaves ``val`` empty).
* Original-release splits (documented seeded split): within each group the files sorted by name are permuted by
  ``numpy.random.default_rng([split_seed, group index])``; the first ``round(n * train)`` go to ``train``, the next
  ``round(n * val)`` to ``val``, the rest to ``test`` (``split_fractions = (train, val, test)``, summing to 1);
  each split is ordered by (group, file name).
* ``test_subset=k`` keeps ``k`` test documents drawn as Beyond Intuition draws them
  (``random.seed(test_subset_seed); random.sample(range(len(test)), k)``, in drawn order): with ``k=3000``, seed 0,
  on the by-date layout these are exactly BI's 3,000 perturbation documents (``bert_pertub_20ng.py``).
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .text_common import TextDataModule, TextDocument, existing_path, extract_archive, is_archive, whitespace_words

NEWSGROUPS: Tuple[str, ...] = (
    "alt.atheism", "comp.graphics", "comp.os.ms-windows.misc", "comp.sys.ibm.pc.hardware", "comp.sys.mac.hardware",
    "comp.windows.x", "misc.forsale", "rec.autos", "rec.motorcycles", "rec.sport.baseball", "rec.sport.hockey",
    "sci.crypt", "sci.electronics", "sci.med", "sci.space", "soc.religion.christian", "talk.politics.guns",
    "talk.politics.mideast", "talk.politics.misc", "talk.religion.misc",
)
REMOVABLE = ("headers", "footers", "quotes")
BYDATE = ("20news-bydate-train", "20news-bydate-test")
ORIGINAL = "20_newsgroups"
#: Beyond Intuition's perturbation subset of the by-date test split
BI_TEST_SUBSET, BI_TEST_SEED = 3000, 0
LAYOUT = (f"{ORIGINAL}/<group>/<message> (the original release) or {BYDATE[0]}/<group>/<message> and "
          f"{BYDATE[1]}/<group>/<message> (the by-date release), as a folder or a .tar.gz archive; <group> one of "
          "the 20 newsgroup names (alt.atheism, ..., talk.religion.misc)")


def find_layout(path: Path, cache_dir: Optional[str] = None) -> Tuple[str, Tuple[Path, ...]]:
    """``("bydate", (train folder, test folder))`` or ``("original", (groups folder,))`` under ``path`` (or the
    extracted archive ``path``, or its single top folder)."""
    if is_archive(path):
        path = extract_archive(path, cache_dir)
    elif not path.is_dir():
        raise ValueError(f"{str(path)!r} is neither a folder nor an archive; expected {LAYOUT}")
    subfolders = [p for p in path.iterdir() if p.is_dir()]
    roots = [path]
    if len(subfolders) == 1 and subfolders[0].name not in NEWSGROUPS + BYDATE + (ORIGINAL,):
        roots.append(subfolders[0])  # a single wrapping folder
    for root in roots:
        if all((root / name).is_dir() for name in BYDATE):
            return "bydate", tuple(root / name for name in BYDATE)
        if (root / ORIGINAL).is_dir():
            return "original", (root / ORIGINAL,)
        if any((root / name).is_dir() for name in NEWSGROUPS):
            return "original", (root,)
    found = sorted(p.name for p in path.iterdir())[:8]
    raise ValueError(f"{str(path)!r} does not hold a 20 Newsgroups layout (found {found}); expected {LAYOUT}")


def scan_groups(folder: Path) -> List[Tuple[str, int]]:
    """``[(message path, class index)]`` of a ``<group>/<message>`` folder, sorted by group then file name (as
    strings, like sklearn's ``load_files``); errors name the folder."""
    index = {name: i for i, name in enumerate(NEWSGROUPS)}
    groups = sorted(p for p in folder.iterdir() if p.is_dir())
    unknown = [p.name for p in groups if p.name not in index]
    if unknown:
        raise ValueError(f"{str(folder)!r} holds folders that are not newsgroups ({', '.join(unknown[:3])}); "
                         f"expected the 20 groups {NEWSGROUPS[0]}, ..., {NEWSGROUPS[-1]} ({LAYOUT})")
    if not groups:
        raise ValueError(f"{str(folder)!r} holds no newsgroup folder; expected {LAYOUT}")
    samples = [(str(f), index[g.name]) for g in groups for f in sorted(str(p) for p in g.iterdir() if p.is_file())]
    if not samples:
        raise ValueError(f"the newsgroup folders of {str(folder)!r} hold no message; expected {LAYOUT}")
    return samples


def sklearn_order(samples: Sequence[Tuple[str, int]]) -> List[Tuple[str, int]]:
    """``samples`` (sorted as ``load_files`` lists them) in ``fetch_20newsgroups``' order: ``load_files``
    shuffles with ``RandomState(0)``, ``fetch_20newsgroups`` (``shuffle=True``) with ``RandomState(42)``."""
    order = np.arange(len(samples))
    np.random.RandomState(0).shuffle(order)
    second = np.arange(len(samples))
    np.random.RandomState(42).shuffle(second)
    return [samples[i] for i in order[second]]


def message_text(path: str, remove: Sequence[str] = REMOVABLE) -> str:
    """The message ``path`` decoded as latin-1 and cleaned as ``fetch_20newsgroups(remove=remove)`` cleans it."""
    from sklearn.datasets._twenty_newsgroups import (
        strip_newsgroup_footer,
        strip_newsgroup_header,
        strip_newsgroup_quoting,
    )

    data = Path(path).read_bytes()
    if not data.strip():
        raise ValueError(f"message {path!r} is empty; expected a news message (headers, a blank line, the body)")
    text = data.decode("latin1")
    if "headers" in remove:
        text = strip_newsgroup_header(text)
    if "footers" in remove:
        text = strip_newsgroup_footer(text)
    if "quotes" in remove:
        text = strip_newsgroup_quoting(text)
    return text


def stratified_split(samples: Sequence[Tuple[str, int]], fractions: Sequence[float], seed: int
                     ) -> List[List[Tuple[str, int]]]:
    """Per class, files permuted by ``default_rng([seed, class])`` and cut by ``fractions`` (rounded; the last
    part takes the rest); each part sorted by (class, file name)."""
    parts: List[List[Tuple[str, int]]] = [[] for _ in fractions]
    for label in sorted({lab for _, lab in samples}):
        files = [s for s in samples if s[1] == label]
        perm = np.random.default_rng([int(seed), int(label)]).permutation(len(files))
        start = 0
        for k, fraction in enumerate(fractions):
            stop = len(files) if k == len(fractions) - 1 else min(len(files), start + int(round(len(files) * fraction)))
            parts[k] += [files[i] for i in perm[start:stop]]
            start = stop
    return [sorted(part, key=lambda s: (s[1], s[0])) for part in parts]


class TwentyNewsgroupsDataModule(TextDataModule):
    """20 Newsgroups (module docstring) tokenized for a Hugging Face tokenizer (``datamodules.text_common``)."""

    classes = NEWSGROUPS

    def __init__(self, path: str, tokenizer: Optional[str] = None, remove: Tuple[str, ...] = REMOVABLE,
                 split_fractions: Tuple[float, float, float] = (0.8, 0.1, 0.1), val_fraction: float = 0.1,
                 split_seed: int = 0, test_subset: Optional[int] = None, test_subset_seed: int = BI_TEST_SEED,
                 max_length: int = 512, stride: Optional[int] = None, batch_size: int = 16, num_workers: int = 0,
                 cache_dir: Optional[str] = None, eval_subset: Optional[int] = None,
                 pad_to_max_length: bool = False) -> None:
        super().__init__(tokenizer, max_length=max_length, stride=stride, batch_size=batch_size,
                         num_workers=num_workers, eval_split="test", eval_subset=eval_subset,
                         pad_to_max_length=pad_to_max_length)
        self.save_hyperparameters()
        bad = [r for r in remove if r not in REMOVABLE]
        if bad:
            raise ValueError(f"remove may hold {REMOVABLE} (sklearn's names), got {tuple(remove)}")
        fractions = tuple(float(f) for f in split_fractions)
        if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1.0) > 1e-6:
            raise ValueError(f"split_fractions must be three non-negative (train, val, test) fractions summing to 1, "
                             f"got {split_fractions}")
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must lie in [0, 1), got {val_fraction}")
        if test_subset is not None and test_subset < 1:
            raise ValueError(f"test_subset must be >= 1 or None, got {test_subset}")
        self.path, self.cache_dir = path, cache_dir
        self.remove = tuple(remove)
        self.split_fractions, self.val_fraction, self.split_seed = fractions, float(val_fraction), int(split_seed)
        self.test_subset, self.test_subset_seed = test_subset, int(test_subset_seed)
        self._splits: Optional[Dict[str, List[Tuple[str, int]]]] = None
        self.layout: Optional[str] = None

    def split_files(self) -> Dict[str, List[Tuple[str, int]]]:
        """``{split: [(message path, class index)]}`` in dataset order (module docstring)."""
        if self._splits is None:
            path = existing_path(self.path, "20 Newsgroups path", LAYOUT)
            self.layout, folders = find_layout(path, self.cache_dir)
            if self.layout == "bydate":
                listed = scan_groups(folders[0])
                test = sklearn_order(scan_groups(folders[1]))
                held = set()
                if self.val_fraction > 0:
                    held = set(stratified_split(listed, (1.0 - self.val_fraction, self.val_fraction),
                                                self.split_seed)[1])
                train = [s for s in sklearn_order(listed) if s not in held]
                val = [s for s in sklearn_order(listed) if s in held]
            else:
                train, val, test = stratified_split(scan_groups(folders[0]), self.split_fractions, self.split_seed)
            if self.test_subset is not None:
                if self.test_subset > len(test):
                    raise ValueError(f"test_subset={self.test_subset} exceeds the {len(test)} test documents")
                drawn = random.Random(self.test_subset_seed).sample(range(len(test)), self.test_subset)
                test = [test[i] for i in drawn]
            self._splits = {"train": train, "val": val, "test": test}
        return self._splits

    def load_documents(self, split: str) -> List[TextDocument]:
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r}; choose one of {self.splits}")
        documents = []
        for file, label in self.split_files()[split]:
            words = whitespace_words(message_text(file, self.remove))
            docid = f"{Path(file).parent.name}/{Path(file).name}"
            documents.append(TextDocument(words=words, label=label, docid=docid))
        return documents

    def texts(self, split: str) -> List[str]:
        """The cleaned texts of ``split`` in dataset order (what ``fetch_20newsgroups`` returns as ``data``)."""
        return [message_text(file, self.remove) for file, _ in self.split_files()[split]]
