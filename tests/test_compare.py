"""compare.py: tables, figures, the self-contained dashboard and the W&B report over real evaluate.py outputs.

One tiny ``evaluate.py`` run (the tiny config of ``tests/test_evaluate.py``, W&B offline) gives the real formats:
its run folder (``metrics.json``, ``config.yaml``) and its offline W&B run. A second run folder is that run with
other values, the ``index`` tie convention and some metrics removed, so the tables have a best, deltas and gaps.
"""
import copy
import csv
import json
import re
import shutil
import subprocess

import pytest
import yaml

import compare
from comparison import RunLoadError, load_run
from comparison.runs import read_wandb_run_file
from comparison.tables import same
from tests.test_evaluate import run_evaluate, tiny_args

GRADCAM_POS = "perturbation/gradcam/positive/predicted/auc"
RANDOM_POS = "perturbation/random/positive/predicted/auc"
ROLLOUT_MIOU = "segmentation/rollout/miou"
DROPPED = "segmentation/gradcam/f1"
DROPPED_CURVE = "perturbation/rollout/negative/target/curve"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    result = run_evaluate(tiny_args(root / "eval", logger=True))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    a = root / "eval" / "run"
    wandb_run = next((root / "eval" / "wandb").glob("offline-run-*"))
    b = root / "b"
    b.mkdir()
    metrics = json.loads((a / "metrics.json").read_text())
    changed = copy.deepcopy(metrics)
    changed[GRADCAM_POS] = metrics[GRADCAM_POS] - 5.0
    changed[ROLLOUT_MIOU] = metrics[ROLLOUT_MIOU] + 0.1
    del changed[DROPPED], changed[DROPPED_CURVE]
    (b / "metrics.json").write_text(json.dumps(changed))
    config = yaml.safe_load((a / "config.yaml").read_text())
    config["trainer"]["callbacks"][0]["init_args"]["ties"] = "index"
    (b / "config.yaml").write_text(yaml.safe_dump(config))
    out = root / "dashboard"
    comparison = compare.main([str(a), str(b), str(wandb_run), "--names", "a", "b", "w", "--reference", "a",
                               "--out", str(out)])
    return dict(a=a, b=b, w=wandb_run, metrics=metrics, comparison=comparison, out=out, root=root)


def table(comparison, test, setting, metric):
    return next(t for t in comparison.tables if (t.test, t.setting, t.metric) == (test, setting, metric))


def test_tables_mark_the_best_show_random_and_deltas(runs):
    metrics, c = runs["metrics"], runs["comparison"]
    pos = table(c, "perturbation", "predicted", "positive AUC")
    assert pos.higher_is_better["gradcam"] is False   # as PositivePerturbationCurve declares
    cell_a, cell_b, cell_w = (pos.cell("gradcam", run) for run in ("a", "b", "w"))
    assert cell_a.value == metrics[GRADCAM_POS] and cell_b.value == pytest.approx(metrics[GRADCAM_POS] - 5.0)
    assert cell_b.best and not cell_a.best and not cell_w.best          # lower is better
    assert cell_b.delta == pytest.approx(-5.0) and cell_a.delta is None and cell_w.delta == 0.0
    assert cell_a.random == metrics[RANDOM_POS] and pos.cell("random", "a").random is None
    assert not any(pos.cell("rollout", run).best for run in "abw")       # all runs tie: no best
    miou = table(c, "segmentation", "", "miou")
    assert miou.higher_is_better["rollout"] is True and miou.cell("rollout", "b").best
    assert miou.cell("rollout", "b").delta == pytest.approx(0.1)
    # the W&B run (float32 copies of the same values) ties with its run folder
    assert all(same(pos.cell(r, "a").value, pos.cell(r, "w").value) for r in pos.rows)


def test_missing_metric_is_shown_not_dropped(runs):
    c = runs["comparison"]
    f1 = table(c, "segmentation", "", "f1")
    assert "gradcam" in f1.rows and f1.cell("gradcam", "b").missing and not f1.cell("gradcam", "a").missing
    md = (runs["out"] / "tables.md").read_text()
    section = md[md.index("### segmentation / f1\n"):]
    gradcam_line = next(line for line in section.splitlines() if line.startswith("| gradcam |"))
    assert gradcam_line.split(" | ")[2] == "*missing*"
    rows = list(csv.DictReader((runs["out"] / "tables.csv").open()))
    row = next(r for r in rows if r["key"] == DROPPED and r["run"] == "b")
    assert row["missing"] == "1" and row["value"] == ""
    best = next(r for r in rows if r["key"] == GRADCAM_POS and r["run"] == "b")
    assert best["best"] == "1" and float(best["delta_vs_reference"]) == pytest.approx(-5.0)
    assert best["higher_is_better"] == "false" and float(best["random"]) == runs["metrics"][RANDOM_POS]
    html = (runs["out"] / "dashboard.html").read_text()
    assert "data-missing='1'" in html and "missing: b" in html   # the table cell and the curve panel
    # the summary of what differs from the reference: two changed values, one gap; the W&B copy changes nothing
    assert re.search(r"<h3>b vs a</h3><p class='note'>2 of \d+ values differ; 1 present in only one", html)
    assert re.search(r"<h3>w vs a</h3><p class='note'>0 of \d+ values differ</p>", html)


def test_config_differences_name_the_convention(runs):
    diff = (runs["out"] / "config_differences.md").read_text()
    line = next(line for line in diff.splitlines() if line.startswith("| trainer.callbacks.PerturbationTest.ties"))
    assert [cell.strip() for cell in line.strip("|").split("|")] == [
        "trainer.callbacks.PerturbationTest.ties", "random", "index", "random"]
    assert "| conventions | perturbation (differs) |" in diff


def test_dashboard_is_self_contained_and_pngs_exist(runs):
    c, html = runs["comparison"], (runs["out"] / "dashboard.html").read_text()
    assert not re.search(r"<script[^>]+src\s*=", html)   # every script inline
    markup = re.sub(r"<script[^>]*>.*?</script>", "", html, flags=re.S)   # the page without its scripts' code
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", markup)
    assert "Plotly.newPlot" in html and len(html) > 1_000_000   # plotly.js embedded
    names = {f.name for f in c.figures}
    assert {"perturbation_curves_predicted_positive", "perturbation_predicted_positive_auc",
            "segmentation_miou"} <= names
    for figure in c.figures:
        assert figure.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", figure.png
        assert f"data-figure='{figure.name}'" in html


def test_wandb_runs_carry_group_tags_and_method_tables(runs, monkeypatch):
    # the run's declarations (metrics.meta.json) reach the W&B run as its summary value metrics_meta
    meta = json.loads((runs["a"] / "metrics.meta.json").read_text())
    summary = read_wandb_run_file(next(runs["w"].glob("*.wandb")))["summary"]
    assert json.loads(summary["metrics_meta"]) == meta and meta["metrics"][GRADCAM_POS]["higher_is_better"] is False
    monkeypatch.setattr("comparison.runs.declared_directions", lambda keys: dict.fromkeys(keys))   # no fallback
    run = load_run(runs["w"])
    assert run.higher_is_better[GRADCAM_POS] is False and run.higher_is_better[ROLLOUT_MIOU] is True
    assert run.group == "SyntheticShapes/vit_tiny_patch16_224"
    assert {"dataset:SyntheticShapes", "model:vit_tiny_patch16_224", "ties:random", "auc:chefer",
            "methods:beyond_intuition_token+gradcam+random+rollout"} <= set(run.tags)
    tables = {p.name.split("_by_method")[0] for p in (runs["w"] / "files" / "media" / "table").glob("*_by_method*")}
    assert tables == {"perturbation", "segmentation"}
    by_method = json.loads(next((runs["w"] / "files" / "media" / "table").glob("perturbation_by_method*")).read_text())
    row = next(r for r in by_method["data"] if r[0] == "gradcam")
    assert row[by_method["columns"].index("positive/predicted/auc")] == pytest.approx(runs["metrics"][GRADCAM_POS])
    # the run folder keeps the resolved config beside metrics.json
    assert yaml.safe_load((runs["a"] / "config.yaml").read_text())["trainer"]["callbacks"][0]["init_args"]["ties"] == \
        "random"


def test_wandb_report_is_built_offline(runs):
    wr = pytest.importorskip("wandb_workspaces.reports.v2")
    from comparison.wandb_report import build_report

    c = runs["comparison"]
    report = build_report(c.runs, c.tables, project="token-attributions", entity="someone", title="t")
    assert isinstance(report, wr.Report) and report.title == "t"
    grids = [b for b in report.blocks if isinstance(b, wr.PanelGrid)]
    panels = [p for g in grids for p in g.panels]
    bars = {p.title: p for p in panels if isinstance(p, wr.BarPlot)}
    assert GRADCAM_POS in bars["perturbation / predicted class / positive AUC"].metrics
    assert any(isinstance(p, wr.RunComparer) for p in panels)
    assert {p.table_name for p in panels if isinstance(p, wr.WeavePanelSummaryTable)} >= {
        "curves", "perturbation_by_method"}
    run_id = runs["w"].name.rsplit("-", 1)[-1]
    assert run_id in str(grids[0].runsets[0].filters)


def test_bad_input_names_the_path(runs, tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(SystemExit, match=re.escape(str(missing))):
        compare.main([str(missing), "--out", str(tmp_path / "o")])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RunLoadError, match=re.escape(str(empty)) + ".*no metrics.json"):
        load_run(empty)
    corrupt = tmp_path / "corrupt"
    shutil.copytree(runs["a"], corrupt)
    (corrupt / "metrics.json").write_text('{"accuracy": 0.5,')
    with pytest.raises(SystemExit, match=re.escape(str(corrupt / "metrics.json")) + ": corrupt JSON"):
        compare.main([str(corrupt), "--out", str(tmp_path / "o")])


def _browser():
    return next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@pytest.mark.skipif(_browser() is None, reason="no headless browser (apt-get install chromium)")
def test_every_figure_renders_in_a_headless_browser(runs, tmp_path):
    # a profile of its own: a browser sharing the default profile with another one waits for it
    result = subprocess.run([_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                             "--no-first-run", "--disable-background-networking", "--disable-component-update",
                             "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=15000",
                             "--dump-dom", (runs["out"] / "dashboard.html").as_uri()],
                            capture_output=True, text=True, timeout=120)
    dom = result.stdout
    figures = runs["comparison"].figures
    chunks = dom.split("data-figure=")[1:]
    assert len(chunks) == len(figures), result.stderr[-2000:]
    for chunk, figure in zip(chunks, figures):
        assert chunk.startswith(f'"{figure.name}"')
        assert 'class="main-svg"' in chunk, f"figure {figure.name} did not render"


#: markup and script in every part of every key: an HTML tag with an event handler, the quotes that end an attribute
#: or a JavaScript string (a result key part holds no '/'); names, config values and the title add '</script>'
PART = """<"'>&<img src=x onerror="document.title='pwned'">");document.title='pwned';(\""""
TEXT = PART + "</script><script>document.title='pwned'</script>"


def _payload_runs(tmp_path):
    m, d, s, x, t = (PART + c for c in "mdsxt")   # method, direction, setting, metric, test
    keys = [f"perturbation/{m}/{d}/{s}/auc", f"perturbation/random/{d}/{s}/auc", f"segmentation/{m}/{x}",
            f"{t}/{m}/{s}/{x}", f"cdam_analysis/{x}/{m}"]
    for i, name in enumerate("xy"):
        metrics = {key: 0.25 + 0.5 * i for key in keys}
        metrics[f"perturbation/{m}/{d}/{s}/curve"] = [1.0, 0.5 - 0.2 * i, 0.1]
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(metrics))
        config = {"model": {"classifier": TEXT + name, TEXT: TEXT + name}, "seed_everything": i}
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump(config))
    return compare.main([str(tmp_path / "x"), str(tmp_path / "y"), "--names", TEXT, TEXT + "2", "--title", TEXT,
                         "--out", str(tmp_path / "out")])


def test_run_data_is_text_in_every_output(tmp_path):
    """Markup in keys, run names, config values and the title stays text: escaped in the page, ids are slugs, no
    event handler or injected tag; Markdown escapes it; the CSV guards formulas but keeps numbers."""
    from html.parser import HTMLParser

    c = _payload_runs(tmp_path)
    page = (c.out / "dashboard.html").read_text()
    tags: list = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag, attrs):
            tags.append((tag, dict(attrs)))

    Tags().feed(page)
    assert not [t for t in tags if t[0] == "img" or any(a.startswith("on") for a in t[1])]
    assert sum(t[0] == "script" for t in tags) == 1 + len(c.figures)   # plotly.js, one per figure
    assert all(re.fullmatch(r"[a-z0-9_-]+", a["id"]) for _, a in tags if "id" in a)
    assert all(re.fullmatch(r"[a-z0-9_]+", f.name) and f"id='fig-{f.name}'" in page.replace('"', "'")
               for f in c.figures) and len(c.figures) == 5
    assert not re.search(r'(?<!\\)"\);document', page)   # no quote ends a JavaScript string of the page
    assert "&lt;img src=x onerror=&quot;document.title=&#x27;pwned&#x27;&quot;&gt;" in page   # shown as text
    assert f"<title>{html_escape(TEXT)}</title>" in page
    for name in ("tables.md", "config_differences.md"):
        md = (c.out / name).read_text()
        assert "<img" not in md and "<script" not in md and "&lt;img src=x" in md, name
    rows = list(csv.DictReader((c.out / "tables.csv").open()))
    assert {r["run"] for r in rows} == {TEXT, TEXT + "2"}   # starts with '<': no formula, kept as it is
    formula = tmp_path / "formula"
    formula.mkdir()
    (formula / "metrics.json").write_text(json.dumps({"segmentation/=1+2/miou": -0.5, "@sum/-m/+m/x": 1.0}))
    c = compare.main([str(formula), "--names", "=HYPERLINK(0)", "--out", str(tmp_path / "f"), "--no-png"])
    rows = list(csv.DictReader((c.out / "tables.csv").open()))
    assert {r["run"] for r in rows} == {"'=HYPERLINK(0)"} and {r["method"] for r in rows} == {"'=1+2", "'-m"}
    assert {r["test"] for r in rows} == {"segmentation", "'@sum"} and {r["class_setting"] for r in rows} == {"", "'+m"}
    assert {r["key"] for r in rows} == {"'@sum/-m/+m/x", "segmentation/=1+2/miou"}
    assert {r["value"] for r in rows} == {"-0.5", "1.0"}   # numbers stay numbers


def html_escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;").replace(
        "'", "&#x27;")


@pytest.mark.skipif(_browser() is None, reason="no headless browser (apt-get install chromium)")
def test_payload_runs_no_script_in_a_headless_browser(tmp_path):
    """The page of :func:`_payload_runs` in headless Chromium: every figure renders, no payload ran (the title is
    still the escaped text, no injected element), the payload shows as text in the tables and the figures."""
    c = _payload_runs(tmp_path)
    result = subprocess.run([_browser(), "--headless", "--no-sandbox", "--disable-gpu",
                             "--disable-background-networking", "--disable-component-update", "--no-first-run",
                             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=15000",
                             "--dump-dom", (c.out / "dashboard.html").as_uri()], capture_output=True, text=True,
                            timeout=180)
    dom = result.stdout
    assert "</html>" in dom, result.stderr[-2000:]
    title = re.search(r"<title>(.*?)</title>", dom, re.S).group(1)
    assert title == TEXT.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")   # no script set it
    assert not re.search(r"<img\b|<script>document", dom)
    assert dom.count('class="main-svg"') >= len(c.figures)   # every figure drew
    assert "&lt;img src=x onerror=" in dom.split('class="main-svg"', 1)[1]   # Plotly shows it as text too


def test_non_finite_metrics_are_shown_flagged_never_tie_or_best(tmp_path):
    """NaN / Infinity in metrics.json: shown as such, flagged, no delta (never "Δ 0"), never the best; a missing
    value stays "missing"; a non-finite reference gives no deltas."""
    miou, acc, rollout = "segmentation/gradcam/miou", "segmentation/gradcam/pixel_accuracy", "segmentation/rollout/miou"
    values = {"a": {miou: 0.5, acc: 0.2, rollout: float("-inf")},
              "b": {miou: float("inf"), acc: float("nan"), rollout: 0.3},
              "c": {miou: 0.7, rollout: 0.3}}
    for name, metrics in values.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(metrics))   # NaN, Infinity, -Infinity
    c = compare.main([str(tmp_path / n) for n in "abc"] + ["--names", "a", "b", "c", "--out", str(tmp_path / "o"),
                                                          "--no-png"])
    t_miou, t_acc = table(c, "segmentation", "", "miou"), table(c, "segmentation", "", "pixel_accuracy")
    inf_cell, nan_cell = t_miou.cell("gradcam", "b"), t_acc.cell("gradcam", "b")
    assert inf_cell.delta is None and not inf_cell.best and t_miou.cell("gradcam", "c").best   # not "Δ 0", not best
    assert inf_cell.non_finite and not inf_cell.missing and nan_cell.non_finite and nan_cell.delta is None
    assert t_acc.cell("gradcam", "c").missing and not t_acc.cell("gradcam", "c").non_finite
    assert t_miou.cell("rollout", "b").delta is None and not any(t_miou.cell("rollout", r).best for r in "abc")
    md = (c.out / "tables.md").read_text()
    assert "| gradcam | 0.5000 | inf (non-finite) | **0.7000** Δ +0.2000 |" in md
    assert "| gradcam | 0.2000 | NaN (non-finite) | *missing* |" in md
    assert "| rollout | -inf (non-finite) | 0.3000 | 0.3000 |" in md and "Δ 0" not in md
    page = (c.out / "dashboard.html").read_text()
    assert page.count("(non-finite)</b>") == 3 and "<span class='v'>inf</span>" in page
    assert "<span class='v'>NaN</span>" in page and "Δ 0" not in page
    rows = {(r["metric"], r["method"], r["run"]): r for r in csv.DictReader((c.out / "tables.csv").open())}
    assert rows[("miou", "gradcam", "b")]["value"] == "inf" and rows[("miou", "gradcam", "b")]["non_finite"] == "1"
    assert rows[("pixel_accuracy", "gradcam", "c")]["missing"] == "1"


def test_cdam_analysis_panels_and_declared_directions(tmp_path):
    """CDAM-analysis keys get their tables (the directions CDAMAnalysis declares) and bar figures."""
    base = {"accuracy": 0.5, "cdam_analysis/pearson/cdam__vs__rollout": 0.3, "cdam_analysis/sparsity/cdam": 0.2,
            "cdam_analysis/sparsity/rollout": 0.4, "cdam_analysis/discrimination/cdam/target_share_on_target": 0.6,
            "cdam_analysis/discrimination/cdam/other_share_on_target": 0.3}
    other = dict(base, **{"cdam_analysis/discrimination/cdam/target_share_on_target": 0.7})
    for name, metrics in (("x", base), ("y", other)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(metrics))
    c = compare.main([str(tmp_path / "x"), str(tmp_path / "y"), "--out", str(tmp_path / "out"), "--no-png"])
    share = table(c, "cdam_analysis", "", "discrimination/target_share_on_target")
    assert share.higher_is_better["cdam"] is True and share.cell("cdam", "y").best
    assert table(c, "cdam_analysis", "", "discrimination/other_share_on_target").higher_is_better["cdam"] is False
    pearson = table(c, "cdam_analysis", "", "pearson")
    assert pearson.rows == ["cdam vs rollout"] and pearson.higher_is_better["cdam vs rollout"] is None
    assert not pearson.cell("cdam vs rollout", "y").best          # no declared direction: no best
    assert {f.section for f in c.figures} == {"cdam_analysis"} and all(f.png is None for f in c.figures)
    assert "cdam_analysis / discrimination/target_share_on_target" in (tmp_path / "out" / "dashboard.html").read_text()


def _meta_runs(tmp_path, name=PART):
    """Three seed runs with per-sample sidecars (one metric consistent, one noise that contradicts it), sanity
    verdicts and a method named by the payload: the meta-evaluation sections and marks."""
    import numpy as np

    from tests.test_compare_meta import N, consistent_samples, write_run

    rng = np.random.default_rng(1)
    folders = []
    for seed in range(3):
        order = ("oracle", name, "b", "random")
        samples = consistent_samples(order, "miou")
        samples.update({f"segmentation/{m}/f1": (np.arange(N), rng.normal(size=N)) for m in order})
        scalars = {k: float(v.mean()) for k, (_, v) in samples.items()}
        scalars.update({f"segmentation/{m}/f1": float(v) for m, v in zip(order, (0.1, 0.2, 0.3, 0.4))})
        scalars.update({f"sanity/{name}/predicted/mprt_cascading_pass": float(seed != 1),
                        "sanity/b/predicted/mprt_cascading_pass": 1.0})
        folders.append(write_run(tmp_path / f"seed{seed}", scalars, {k: True for k in scalars}, samples, seed))
    return compare.main([str(f) for f in folders] + ["--out", str(tmp_path / "out"), "--no-png"])


def test_meta_evaluation_sections_and_marks(tmp_path):
    c = _meta_runs(tmp_path)
    page = (c.out / "dashboard.html").read_text()
    for section in ("id='sanity-table'", "id='meta-stability'", "id='meta-agreement'"):
        assert section in page
    f1 = next(m for m in c.meta.metrics if m.family[2] == "f1")
    assert {f.rule for f in f1.failures} >= {"unreliable", "oracle not first"}
    miou = next(m for m in c.meta.metrics if m.family[2] == "miou")
    assert miou.failures == [] and miou.stability == {"seed0": pytest.approx(1.0)}
    assert c.meta.contradictory == [("segmentation / f1", "segmentation / miou")]
    # the f1 table is marked with its rules, the miou table is not
    f1_html = page[page.index("<h3>segmentation / f1</h3>"):page.index("<table class='metrics'", page.index(
        "<h3>segmentation / f1</h3>"))]
    assert "fails the meta-evaluation: unreliable" in f1_html and "oracle not first" in f1_html
    miou_at = page.index("<h3>segmentation / miou</h3>")
    assert "metafail" not in page[miou_at:page.index("<table class='metrics'", miou_at)]
    assert page.count("data-sanity='fail'") == 1 and page.count("data-sanity='pass'") == 5
    assert "<img" not in page and "&lt;img src=x onerror=" in page   # the payload method stays text


@pytest.mark.skipif(_browser() is None, reason="no headless browser (apt-get install chromium)")
def test_meta_sections_render_in_a_headless_browser(tmp_path):
    c = _meta_runs(tmp_path)
    result = subprocess.run([_browser(), "--headless", "--no-sandbox", "--disable-gpu",
                             "--disable-background-networking", "--disable-component-update", "--no-first-run",
                             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=15000",
                             "--dump-dom", (c.out / "dashboard.html").as_uri()], capture_output=True, text=True,
                            timeout=180)
    dom = result.stdout
    assert "</html>" in dom, result.stderr[-2000:]
    for section in ('id="sanity-table"', 'id="meta-stability"', 'id="meta-agreement"'):
        assert section in dom
    assert dom.count('data-tau="') == len(c.meta.agreement_names) ** 2
    assert "fails the meta-evaluation" in dom and not re.search(r"<img\b|<script>document", dom)
    assert re.search(r"<title>run comparison</title>", dom)
