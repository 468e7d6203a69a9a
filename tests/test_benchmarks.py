"""Smoke test of ``benchmarks/methods.py`` on a tiny model: rows, JSON and anchors; never timing thresholds."""
from __future__ import annotations

import importlib.util
import json
import math
import os

import pytest

pytest.importorskip("timm")

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "methods.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("benchmarks_methods_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def test_unknown_method_is_refused(bench):
    with pytest.raises(SystemExit, match="unknown methods"):
        bench.main(["--model-size", "tiny", "--isolation", "none", "--methods", "nope"])
