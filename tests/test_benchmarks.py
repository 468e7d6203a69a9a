"""Smoke test of ``benchmarks/methods.py`` on a tiny model: rows, JSON and anchors; never timing thresholds."""
from __future__ import annotations

import importlib.util
import json
import math
import os

import pytest

pytest.importorskip("timm")

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "benchmarks")


def _load_script(name):
    """A benchmark script as a module (run as a script, its folder would shadow the ``methods`` package)."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}_script", os.path.join(BENCHMARKS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _load_script("methods")


def _positive(x):
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_tiny_run_rows_and_json(bench, tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    result = bench.main(["--model-size", "tiny", "--isolation", "none", "--threads", "1", "--device", "cpu",
                         "--methods", "rollout", "token_ablation", "--batch-sizes", "1", "2",
                         "--repeats", "1", "--warmup", "1", "--json", str(out_json)])
    printed = capsys.readouterr().out

    rows = result["rows"]
    # exactly these (method, batch) rows: anchors at each batch size, token_ablation skipped at batch 2
    assert sorted((r["method"], r["batch"]) for r in rows) == sorted([
        ("forward", 1), ("forward+backward", 1), ("forward", 2), ("forward+backward", 2),
        ("rollout", 1), ("rollout", 2), ("token_ablation", 1), ("token_ablation", 2)])

    for r in rows:
        if r["status"] == "skipped":
            assert (r["method"], r["batch"]) == ("token_ablation", 2)
            assert r["ms_per_image"] is None
            continue
        assert _positive(r["ms_per_image"]), r
        if r["kind"] == "anchor":
            continue
        assert _positive(r["anchor_ms_per_image"]) and _positive(r["ratio"]), r
        assert all(_positive(p) for p in r["paired_ratios"])
        if r["method"] == "rollout":
            assert r["anchor"] == "1 fwd" and r["target"] == 1.3 and r["status"] in ("pass", "FAIL")
        else:
            assert r["anchor"] == "16 fwd" and r["target"] is None and r["status"] == "report"

    # the table and the notes are printed; the JSON holds the same rows
    for name in ("[forward]", "[forward+backward]", "rollout", "token_ablation", "skipped"):
        assert name in printed
    assert "token_ablation" in " ".join(result["notes"])
    saved = json.loads(out_json.read_text())
    assert saved["rows"] == json.loads(json.dumps(rows))
    assert saved["config"]["model"]["depth"] == 2 and saved["config"]["batch_sizes"] == [1, 2]


def test_tiny_text_run(bench, capsys):
    """--family bert: token batches through a BertForSequenceClassification; token_ablation's anchor counts the
    content tokens (seq_len - 2)."""
    result = bench.main(["--family", "bert", "--model-size", "tiny", "--seq-len", "12", "--isolation", "none",
                         "--threads", "1", "--device", "cpu", "--methods", "gradcam", "token_ablation",
                         "--batch-sizes", "2", "--token-ablation-batch-sizes", "2", "--repeats", "1"])
    printed = capsys.readouterr().out
    rows = {r["method"]: r for r in result["rows"]}
    assert set(rows) == {"forward", "forward+backward", "gradcam", "token_ablation"}
    assert rows["gradcam"]["anchor"] == "1 fwd+bwd" and _positive(rows["gradcam"]["ratio"])
    assert rows["token_ablation"]["anchor"] == "10 fwd" and _positive(rows["token_ablation"]["ratio"])
    assert result["config"]["family"] == "bert" and result["config"]["seq_len"] == 12
    assert "BERT, 12 positions" in printed and "inputs_embeds" in " ".join(result["notes"])


def test_tiny_llama_run(bench, capsys):
    """--family llama: token batches through a LlamaForCausalLM, the next token at the last position explained (a
    vocabulary id per row); the anchors compute the head at that position only."""
    result = bench.main(["--family", "llama", "--model-size", "tiny", "--seq-len", "12", "--isolation", "none",
                         "--threads", "1", "--device", "cpu", "--methods", "attnlrp", "rollout",
                         "--batch-sizes", "2", "--repeats", "1"])
    printed = capsys.readouterr().out
    rows = {r["method"]: r for r in result["rows"]}
    assert set(rows) == {"forward", "forward+backward", "attnlrp", "rollout"}
    assert rows["attnlrp"]["anchor"] == "1 fwd+bwd" and _positive(rows["attnlrp"]["ratio"])
    assert rows["rollout"]["anchor"] == "1 fwd" and _positive(rows["rollout"]["ratio"])
    assert result["config"]["family"] == "llama" and result["config"]["model"]["num_key_value_heads"] == 2
    assert "Llama, 12 positions" in printed and "logits_to_keep" in " ".join(result["notes"])


def test_tiny_dinov2_reg_run(bench, capsys):
    """--family dinov2_reg: a ViT with 4 registers and layer scale; every method runs there (the LRP methods
    through the layer scale)."""
    result = bench.main(["--family", "dinov2_reg", "--model-size", "tiny", "--isolation", "none", "--threads", "1",
                         "--device", "cpu", "--methods", "rollout", "partial_lrp", "--batch-sizes", "2",
                         "--repeats", "1"])
    printed = capsys.readouterr().out
    rows = {r["method"]: r for r in result["rows"]}
    assert set(rows) == {"forward", "forward+backward", "rollout", "partial_lrp"}
    assert rows["rollout"]["anchor"] == "1 fwd" and _positive(rows["rollout"]["ratio"])
    assert _positive(rows["partial_lrp"]["ratio"])
    assert result["config"]["model"]["reg_tokens"] == 4 and "DINOv2-reg ViT" in printed


def test_tiny_siglip_run(bench, capsys):
    """--family siglip: a SiglipModel's vision tower (attention-pooling head) as a zero-shot classifier; rollout
    reads its rows weighted by the pooling attention."""
    result = bench.main(["--family", "siglip", "--model-size", "tiny", "--isolation", "none", "--threads", "1",
                         "--device", "cpu", "--methods", "attnlrp", "rollout", "--batch-sizes", "2", "--repeats", "1"])
    printed = capsys.readouterr().out
    rows = {r["method"]: r for r in result["rows"]}
    assert set(rows) == {"forward", "forward+backward", "attnlrp", "rollout"}
    assert rows["attnlrp"]["anchor"] == "1 fwd+bwd" and _positive(rows["attnlrp"]["ratio"])
    assert rows["rollout"]["anchor"] == "1 fwd" and _positive(rows["rollout"]["ratio"])
    assert result["config"]["family"] == "siglip" and result["config"]["model"]["num_hidden_layers"] == 2
    assert "SigLIP vision tower" in printed


def test_anchor_arithmetic(bench):
    """Ratios use the anchor each method fundamentally needs (PROTOCOLS.md section 7)."""
    fwd, fb = 0.5, 1.5
    results = [
        dict(name="beyond_intuition_head", batch=2, first_call_s=1.0, peak_extra_mib=None, memory_note="n",
             steps=20, num_patches=196,
             samples={"beyond_intuition_head": [12.0], "forward+backward": [fb], "forward": [fwd]}),
        dict(name="token_ablation", batch=1, first_call_s=1.0, peak_extra_mib=None, memory_note="n", num_patches=196,
             samples={"token_ablation": [49.0], "forward": [fwd]}),
        dict(name="transformer_attribution", batch=1, first_call_s=1.0, peak_extra_mib=None, memory_note="n",
             num_patches=196, samples={"transformer_attribution": [4.5], "forward+backward": [fb]}),
    ]
    rows = {r["method"]: r for r in bench.make_rows(results, [])}
    assert rows["beyond_intuition_head"]["ratio"] == pytest.approx(12.0 / (fb + 20 * fwd))
    assert rows["beyond_intuition_head"]["ms_per_image"] == pytest.approx(6000.0)
    assert rows["beyond_intuition_head"]["status"] == "pass"
    assert rows["token_ablation"]["ratio"] == pytest.approx(49.0 / (196 * fwd))
    assert rows["transformer_attribution"]["ratio"] == pytest.approx(3.0)
    assert rows["transformer_attribution"]["status"] == "FAIL"


def test_memory_target_of_attnlrp(bench):
    """attnlrp / cp_lrp: peak extra memory against the forward+backward anchor's at the same batch size."""
    def result(name, peak, seconds=1.0):
        return dict(name=name, batch=4, first_call_s=1.0, peak_extra_mib=peak, memory_note="n", num_patches=196,
                    samples={name: [seconds]} if name == "forward+backward" else
                    {name: [seconds], "forward+backward": [1.0]})
    rows = {r["method"]: r for r in bench.make_rows(
        [result("forward+backward", 100.0), result("attnlrp", 140.0), result("cp_lrp", 160.0)], [])}
    assert rows["attnlrp"]["memory_ratio"] == pytest.approx(1.4) and rows["attnlrp"]["status"] == "pass"
    assert rows["cp_lrp"]["memory_ratio"] == pytest.approx(1.6) and rows["cp_lrp"]["status"] == "FAIL (memory)"


def test_unknown_method_is_refused(bench):
    with pytest.raises(SystemExit, match="unknown methods"):
        bench.main(["--model-size", "tiny", "--isolation", "none", "--methods", "nope"])


# ------------------------------------------------------------------------------------- ranking_stability.py
@pytest.fixture(scope="module")
def ranking():
    return _load_script("ranking_stability")


def _metrics(random_auc, gradcam_auc, random_miou, gradcam_miou):
    return {"perturbation/random/positive/predicted/auc": random_auc, "segmentation/random/miou": random_miou,
            "perturbation/gradcam/positive/predicted/auc": gradcam_auc, "segmentation/gradcam/miou": gradcam_miou}


def test_ranking_comparison_with_random(ranking):
    runs = {"a": _metrics(30.0, 25.0, 0.3, 0.5), "b": _metrics(30.0, 36.0, 0.3, 0.2)}
    table = ranking.compare_with_random(runs)
    auc, miou = table["gradcam"]["positive_predicted_auc"], table["gradcam"]["miou"]
    assert (auc["runs"], auc["better"], auc["min"], auc["max"]) == (2, 1, -5.0, 6.0)   # lower AUC is better
    assert auc["mean"] == pytest.approx(0.5) and auc["per_run"] == {"a": -5.0, "b": 6.0}
    assert (miou["better"], miou["mean"]) == (1, pytest.approx(0.05))                 # higher mIoU is better
    assert "random" not in table
    assert "gradcam" in ranking.format_table(table)
    with pytest.raises(KeyError, match="random"):
        ranking.compare_with_random({"c": {"segmentation/gradcam/miou": 0.4}})
    assert ranking.overrides(["model.features=cls", "--x=[a, b]"]) == ["--model.features", "cls", "--x", "[a, b]"]
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        ranking.overrides(["model.features"])


def test_ranking_study_on_a_given_classifier(ranking, tmp_path):
    """End to end on a tiny untrained classifier file (no training): evaluate.py runs, summary.json is written,
    and a second call reuses the finished run."""
    import torch
    from timm.models.vision_transformer import VisionTransformer

    from models.classifier_file import save_classifier

    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4).eval()
    model.pretrained_cfg = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}
    classifier = save_classifier(model, tmp_path / "tiny.pt")
    out = tmp_path / "study"
    args = ["--classifiers", str(classifier), "--out", str(out), "--eval-set", "data.init_args.image_size=32",
            "data.init_args.test_size=4", "data.init_args.batch_size=4", "model.methods=[rollout, gradcam, random]"]
    summary = ranking.main(args)
    table = summary["compare_with_random"]
    assert set(table) == {"rollout", "gradcam"}
    assert table["gradcam"]["positive_predicted_auc"]["runs"] == 1
    metrics = out / "0-tiny" / "metrics.json"
    stamp = metrics.stat().st_mtime_ns
    assert json.loads((out / "summary.json").read_text())["compare_with_random"] == json.loads(json.dumps(table))
    ranking.main(args)
    assert metrics.stat().st_mtime_ns == stamp   # resumed, not re-run
    with pytest.raises(SystemExit, match="not found"):
        ranking.main(["--classifiers", str(tmp_path / "missing.pt"), "--out", str(out)])


@pytest.fixture(scope="module")
def max_length():
    return _load_script("max_length")


def test_max_length_search_finds_the_limit(max_length):
    """Doubling, then halving between the last size that ran and the first that ran out of memory; a slow call ends
    the search with a lower bound; a bug in the method is raised, not counted as out of memory."""
    def limited(limit, slow_from=None):
        def call_at(n):
            if n > limit:
                return dict(outcome=max_length.OUT_OF_MEMORY, seconds=0.1, peak_extra_mib=None)
            return dict(outcome=max_length.RAN, seconds=100.0 if slow_from and n >= slow_from else 0.1,
                        peak_extra_mib=float(n))
        return call_at

    found = max_length.search(limited(5000), start=1024, max_len=65536, bisect=2, time_limit=30)
    assert [c["n"] for c in found["calls"]] == [1024, 2048, 4096, 8192, 6144, 5120]
    assert found["largest"] == 4096 and found["bound"] == "exact" and found["first_failed"] == 5120
    found = max_length.search(limited(10**9), start=1024, max_len=4096, bisect=2, time_limit=30)
    assert found["largest"] == 4096 and found["bound"] == "max-len" and found["first_failed"] is None
    found = max_length.search(limited(10**9, slow_from=2048), start=1024, max_len=65536, bisect=2, time_limit=30)
    assert found["largest"] == 2048 and found["bound"] == "time limit"
    assert max_length.is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried ..."))
    assert not max_length.is_out_of_memory(RuntimeError("shape mismatch"))
    with pytest.raises(ValueError, match="a bug"):
        max_length.measure_call(lambda: (_ for _ in ()).throw(ValueError("a bug")), "cpu")


def test_max_length_tiny_run(max_length, tmp_path, capsys):
    out = tmp_path / "max.json"
    result = max_length.main(["--device", "cpu", "--model-size", "tiny", "--methods", "rollout", "--start", "16",
                              "--max-len", "32", "--json", str(out)])
    assert set(result["results"]) == {"forward", "forward+backward", "rollout"}
    assert all(r["largest"] == 32 and r["bound"] == "max-len" for r in result["results"].values())
    assert json.loads(out.read_text())["config"]["model"]["max_position_embeddings"] == 32
    assert "| rollout | 32 | max-len |" in capsys.readouterr().out


def test_attention_recompute_tiny_run(capsys):
    rows = _load_script("attention_recompute").main(["--device", "cpu", "--model-size", "tiny", "--seq-lens", "16",
                                                     "--batch-sizes", "2", "--repeats", "1",
                                                     "--methods", "generic_attribution"])
    assert [(r["method"], r["seq_len"], r["batch"]) for r in rows] == [("generic_attribution", 16, 2)]
    assert _positive(rows[0]["ratio"]["recompute"]) and _positive(rows[0]["ratio"]["keep"])
    assert "| generic_attribution | 16 | 2 |" in capsys.readouterr().out


def test_eager_floor_tiny_run(capsys):
    rows = _load_script("eager_floor").main(["--device", "cpu", "--model-size", "tiny", "--seq-lens", "16",
                                             "--repeats", "1"])
    assert [r["seq_len"] for r in rows] == [16]
    assert all(_positive(rows[0][k]) for k in ("eager_over_sdpa", "rollout_over_sdpa", "rollout_over_eager"))
    assert "| 16 |" in capsys.readouterr().out


def test_generic_baseline_anchor_arithmetic(bench):
    """Integrated gradients and SmoothGrad against steps (samples) x fwd+bwd, occlusion against 1 + windows
    forwards, KernelSHAP / LIME against 1 + samples forwards (issue 38)."""
    fwd, fb = 0.5, 1.5

    def result(name, seconds, **info):
        anchor = "forward" if name in ("occlusion", "kernel_shap") else "forward+backward"
        return dict(name=name, batch=2, first_call_s=1.0, peak_extra_mib=None, memory_note="n", num_patches=16,
                    samples={name: [seconds], anchor: [fwd if anchor == "forward" else fb]}, **info)
    rows = {r["method"]: r for r in bench.make_rows([
        result("integrated_gradients", 6.3, steps=4), result("smoothgrad", 9.0, method_samples=4),
        result("occlusion", 8.0, forwards=17), result("kernel_shap", 13.0, method_samples=25),
        result("saliency", 1.7)], [])}
    assert rows["integrated_gradients"]["ratio"] == pytest.approx(6.3 / (4 * fb))
    assert rows["integrated_gradients"]["status"] == "pass" and rows["integrated_gradients"]["anchor"] == "4 x fwd+bwd"
    assert rows["smoothgrad"]["ratio"] == pytest.approx(1.5) and rows["smoothgrad"]["status"] == "FAIL"
    assert rows["occlusion"]["ratio"] == pytest.approx(8.0 / (17 * fwd)) and rows["occlusion"]["anchor"] == "17 fwd"
    assert rows["kernel_shap"]["ratio"] == pytest.approx(1.0) and rows["kernel_shap"]["status"] == "report"
    assert rows["saliency"]["target"] == 1.2 and rows["saliency"]["status"] == "pass"


def test_tiny_generic_baselines_run(bench, capsys):
    """--method-options reach the method and its anchor; --warmup 0 times the first call; no anchor rows."""
    result = bench.main(["--model-size", "tiny", "--isolation", "none", "--threads", "1", "--device", "cpu",
                         "--methods", "integrated_gradients", "occlusion", "--batch-sizes", "2", "--repeats", "1",
                         "--warmup", "0", "--clock", "process", "--skip-anchor-rows", "--method-options",
                         '{"integrated_gradients": {"steps": 3}, "occlusion": {"window": 32}}'])
    rows = {r["method"]: r for r in result["rows"]}
    assert sorted(rows) == ["integrated_gradients", "occlusion"]
    assert rows["integrated_gradients"]["anchor"] == "3 x fwd+bwd" and rows["occlusion"]["anchor"] == "5 fwd"
    assert all(_positive(r["ratio"]) and r["samples"] == 1 for r in rows.values())
    assert result["config"]["clock"] == "process"
