"""The decoder-LM benchmark (associative recall): the data and its evidence, the LM read as a classifier over its
answer tokens, and evaluate.py end to end with a tiny LlamaForCausalLM trained in the test through the
``trained:`` spec (a fresh cache); the shipped config (the model trained to >= 0.95 accuracy) is ``slow``."""
import json
from pathlib import Path

import pytest
import torch
import yaml

from datamodules.associative_recall import AssociativeRecallDataModule, generate_sequences

ROOT = Path(__file__).resolve().parent.parent
TRAIN_CONFIG = "configs/train/associative_recall_llama.yaml"
METHODS = ["attnlrp", "transformer_attribution", "beyond_intuition_token", "token_ablation", "random"]


def test_sequences_hold_the_answer_and_its_evidence():
    for document, query in generate_sequences(64, 16, 16, (4, 8), seed=3, split="test"):
        words = document.words
        pairs = dict(zip(words[0::2], words[1::2]))
        assert len(pairs) == len(words) // 2                     # distinct keys
        assert query[0] == "?" and pairs[query[1]] == f"v{document.label}"
        evidence = [w for w, r in zip(words, document.rationale) if r]
        assert evidence == [query[1], f"v{document.label}"]      # the queried pair, in context order


def test_batches_mark_the_query_special_and_wordless():
    dm = AssociativeRecallDataModule(train_size=0, val_size=0, test_size=8, batch_size=8)
    dm.setup("test")
    batch = next(iter(dm.test_dataloader()))
    lengths = batch["attention_mask"].sum(dim=1)
    for i, n in enumerate(lengths.tolist()):
        assert batch["special_tokens_mask"][i, n - 2:n].tolist() == [1, 1]
        assert batch["word_ids"][i, n - 2:n].tolist() == [-1, -1]
        assert int(batch["num_words"][i]) == n - 2
        tokens = dm.tokenizer.convert_ids_to_tokens(batch["input_ids"][i, :n].tolist())
        assert tokens[:n - 2] == batch["words"][i] and tokens[n - 2] == "?"
    assert dm.classes == tuple(f"v{i}" for i in range(16))


def test_answer_token_classifier_reads_the_last_real_token(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from evaluation.classifier import AnswerTokenClassifier, classifier_for

    dm = AssociativeRecallDataModule(train_size=0, val_size=0, test_size=4, batch_size=4)
    tokenizer = dm.tokenizer
    torch.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      pad_token_id=tokenizer.pad_token_id, bos_token_id=None, eos_token_id=None,
                                      id2label={i: c for i, c in enumerate(dm.classes)}))
    lm.save_pretrained(tmp_path / "lm")
    tokenizer.save_pretrained(tmp_path / "lm")
    lm = LlamaForCausalLM.from_pretrained(tmp_path / "lm").eval()
    clf = classifier_for(lm)
    assert isinstance(clf, AnswerTokenClassifier)
    vocab = tokenizer.get_vocab()
    assert clf.method_targets(torch.tensor([0, 15])).tolist() == [vocab["v0"], vocab["v15"]]
    dm.setup("test")
    batch = next(iter(dm.test_dataloader()))
    right = clf.logits(batch)
    alone = torch.cat([clf.logits({k: batch[k][i:i + 1, :int(batch["attention_mask"][i].sum())]
                                   for k in ("input_ids", "attention_mask")}) for i in range(4)])
    torch.testing.assert_close(right, alone, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        full = lm(input_ids=batch["input_ids"][:1, :int(batch["attention_mask"][0].sum())]).logits[0, -1]
    torch.testing.assert_close(right[0], full[clf.answer_ids], atol=1e-5, rtol=1e-5)
    lm.config.id2label = {0: "LABEL_0", 1: "LABEL_1"}
    with pytest.raises(ValueError, match="answer tokens"):
        classifier_for(lm)


def _evaluate(tmp_path, monkeypatch, classifier, methods, eval_subset):
    import evaluate

    monkeypatch.setenv("TOKEN_ATTRIBUTIONS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    config = yaml.safe_load((ROOT / "configs" / "evaluate" / "associative_recall.yaml").read_text())
    config["base"] = str(ROOT / "configs" / "base" / "evaluate.yaml")
    config["trainer"]["logger"] = False
    config["trainer"]["callbacks"] = [c for c in config["trainer"]["callbacks"]
                                      if not c["class_path"].endswith("TextHeatmaps")]
    config["trainer"]["callbacks"][0]["init_args"]["export_jsonl"] = False
    config["model"]["classifier"] = classifier
    config["model"]["methods"] = methods
    config["data"]["init_args"]["eval_subset"] = eval_subset
    path = tmp_path / "recall.yaml"
    path.write_text(json.dumps(config))
    return evaluate.main(["--config", str(path), "--output_dir", str(tmp_path / "run"),
                          "--trainer.default_root_dir", str(tmp_path)])


def test_recall_evaluation_end_to_end_with_a_tiny_lm(tmp_path, monkeypatch):
    """A tiny Llama trained for a few steps in the test (its accuracy is not the point): trained on first use
    through the ``trained:`` spec, exported with its tokenizer and answer tokens, loaded back as a causal LM and
    evaluated by every test of the shipped config."""
    overrides = tmp_path / "tiny.yaml"
    overrides.write_text(yaml.safe_dump({
        "trainer": {"max_epochs": 1},
        "model": {"init_args": {"config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                           "num_attention_heads": 4, "num_key_value_heads": 2,
                                           "max_position_embeddings": 32}}},
        "data": {"init_args": {"train_size": 512, "val_size": 32, "test_size": 32, "batch_size": 256}}}))
    results = _evaluate(tmp_path, monkeypatch, f"trained:{TRAIN_CONFIG}+{overrides}", METHODS, eval_subset=6)
    assert 0.0 <= results["accuracy"] <= 1.0
    for method in METHODS:
        for key in ("token_f1@2", "auprc"):
            assert 0.0 <= results[f"rationale/{method}/target/{key}"] <= 1.0
        assert f"perturbation/{method}/positive/target/auc" in results
        assert f"eraser/{method}/predicted/aopc_comprehensiveness" in results
    exported = list((tmp_path / "cache").glob("associative_recall_llama-*"))
    assert len(exported) == 1 and json.loads((exported[0] / "config.json").read_text())["architectures"] == [
        "LlamaForCausalLM"]


@pytest.mark.slow
def test_shipped_recall_benchmark_answers_and_finds_the_evidence(tmp_path, monkeypatch):
    """The shipped config on a fresh cache (the model trained on first use, a few minutes on 2 CPU cores):
    answer accuracy >= 0.95 and the evidence far above the random map for AttnLRP and token ablation."""
    results = _evaluate(tmp_path, monkeypatch, f"trained:{TRAIN_CONFIG}", ["attnlrp", "token_ablation", "random"],
                        eval_subset=64)
    assert results["accuracy"] >= 0.95
    floor = results["rationale/random/target/token_f1@2"]
    for method in ("attnlrp", "token_ablation"):
        assert results[f"rationale/{method}/target/token_f1@2"] >= floor + 0.3
