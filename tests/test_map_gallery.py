"""The map gallery (callbacks/map_gallery.py, evaluation/gallery.py, comparison/gallery.py) and the dashboard of three
seed runs of the synthetic ViT (the cached small ViT of ``configs/evaluate/synthetic.yaml``): the sanity table, the
agreement heatmap, the stability table and the gallery render in headless Chromium, run data stays text."""
from __future__ import annotations

import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import yaml

import compare
from comparison.sweep import seeded_config
from evaluation.gallery import GALLERY_FILE, read_gallery, write_gallery
from tests.test_compare import PART, TEXT, _browser

ROOT = Path(__file__).resolve().parent.parent
METHODS = ["gradcam", "input_x_gradient", "random"]
SAMPLES = 3


def _config(tmp_path: Path) -> Path:
    """A small sanity + catalogue config of the synthetic ViT: 4 images, three methods, gallery of 3 samples."""
    config = {
        "base": str(ROOT / "configs" / "base" / "evaluate.yaml"),
        "trainer": {"logger": False, "callbacks": [
            {"class_path": "callbacks.sanity.RandomisationTest",
             "init_args": {"orders": ["top_down"], "input_only": True, "gallery_samples": SAMPLES}},
            {"class_path": "callbacks.localisation.LocalisationTest",
             "init_args": {"class_settings": ["target"], "unit": "patch", "oracle": True}},
            {"class_path": "callbacks.complexity.ComplexityTest", "init_args": {"unit": "patch"}},
            {"class_path": "callbacks.faithfulness_correlation.FaithfulnessCorrelationTest",
             "init_args": {"runs": 6, "subset_fraction": 0.2, "unit": "patch", "masking": "chefer"}},
            {"class_path": "callbacks.map_gallery.MapGallery", "init_args": {"samples": SAMPLES}}]},
        "model": {"classifier": "synthetic", "methods": METHODS, "forward_batch_size": 256},
        "data": {"class_path": "datamodules.synthetic_shapes.SyntheticShapesDataModule",
                 "init_args": {"image_size": 64, "num_classes": 4, "test_size": 4, "seed": 0, "batch_size": 4,
                               "num_workers": 0, "object_scale": [0.2, 0.25]}}}
    path = tmp_path / "gallery.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def seed_runs(tmp_path_factory):
    """Three runs of :func:`_config` that differ only in seeds (:func:`comparison.sweep.seeded_config`), in one
    process; the third run's ``random`` map renamed to the payload in its gallery and sanity keys."""
    import json

    import torch

    import evaluate

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("gallery")
    config = _config(root)
    folders = []
    for seed in range(3):
        folder = root / f"seed{seed}"
        folder.mkdir()
        (folder / "sweep.yaml").write_text(yaml.safe_dump(seeded_config(config, seed)))
        evaluate.main(["--config", str(folder / "sweep.yaml"), "--output_dir", str(folder),
                       "--trainer.default_root_dir", str(root)])
        folders.append(folder)
    payload = root / "payload"
    payload.mkdir()
    for name in ("metrics.json", "metrics.meta.json", "per_sample.npz", "config.yaml"):
        (payload / name).write_bytes((folders[2] / name).read_bytes())
    metrics = json.loads((folders[2] / "metrics.json").read_text())
    metrics = {k.replace("sanity/random/", f"sanity/{PART}/"): v for k, v in metrics.items()}
    (payload / "metrics.json").write_text(json.dumps(metrics))
    gallery = read_gallery(folders[2] / GALLERY_FILE)
    write_gallery({k.replace("/random/", f"/{PART}/"): v for k, v in gallery.items()}, payload / GALLERY_FILE)
    return root, folders, payload


def test_gallery_keeps_the_same_samples_in_every_run(seed_runs):
    _, folders, _ = seed_runs
    galleries = [read_gallery(f / GALLERY_FILE) for f in folders]
    for g in galleries:
        assert g["ids"].tolist() == list(range(SAMPLES)) and g["image"].shape == (SAMPLES, 64, 64, 3)
        assert g["grid"].tolist() == [8, 8] and list(g["steps"]) == ["head", "block_3", "block_2", "block_1",
                                                                     "block_0", "embedding"]
        assert {k for k in g if k.startswith("map/")} == {f"map/{m}/predicted" for m in METHODS}
        assert {k for k in g if k.startswith("randomised/")} == {f"randomised/{m}/predicted" for m in METHODS}
        assert np.isfinite(g["map/gradcam/predicted"]).all()
    # the seeds change neither the model nor the maps: the same maps in every run; the randomised copies are
    # seeded by the sanity checks' seed (the sweep's), so their maps differ between runs
    for g in galleries[1:]:
        assert np.array_equal(g["image"], galleries[0]["image"])
        assert np.array_equal(g["map/gradcam/predicted"], galleries[0]["map/gradcam/predicted"])
        assert not np.array_equal(g["randomised/gradcam/predicted"], galleries[0]["randomised/gradcam/predicted"])
    # the gallery's randomised maps are the ones the checks compared: the last step's Spearman of |a| recomputed
    g = galleries[0]
    original, last = g["map/input_x_gradient/predicted"], g["randomised/input_x_gradient/predicted"][:, -1]
    assert not np.allclose(original, last)
    random_map = g["randomised/random/predicted"]
    assert np.array_equal(random_map[:, -1], g["map/random/predicted"])   # the seeded null map ignores the model


def _tags(page: str) -> list:
    """``[(tag, attributes)]`` of every start tag of ``page``."""
    tags: list = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag, attrs):
            tags.append((tag, dict(attrs)))

    Tags().feed(page)
    return tags


def _dashboard(seed_runs, out):
    root, folders, payload = seed_runs
    return compare.main([str(f) for f in folders] + [str(payload), "--names", "seed0", "seed1", TEXT, TEXT + "2",
                                                     "--out", str(out), "--no-png", "--title", TEXT])


def test_dashboard_sections_of_three_seed_runs(seed_runs, tmp_path):
    c = _dashboard(seed_runs, tmp_path / "out")
    page = (c.out / "dashboard.html").read_text()
    for section in ("id='sanity-table'", "id='meta-stability'", "id='meta-agreement'", "id='gallery-runs'"):
        assert section in page, section
    assert page.count("id='randomised-") == 4 * len(METHODS)   # every run, every method the gallery shows
    assert c.meta.groups and len(next(iter(c.meta.groups.values()))) == 4   # one seed group
    assert all(set(m.stability) == set(c.meta.groups) for m in c.meta.metrics)
    gradcam = [line for line in page.split("<tr") if "data-sanity" in line and ">gradcam<" in line]
    assert gradcam and all("data-sanity='pass'" in line for line in gradcam if "mprt_top_down" in line)
    edges = [line for line in page.split("<tr") if ">input_only<" in line and "mprt_top_down" in line]
    assert edges and "data-sanity='pass'" not in edges[0]
    tags = _tags(page)
    images = [a for t, a in tags if t == "img"]
    # per run: (methods + the image) x samples across runs, (1 + 6 steps) x methods x samples randomised
    assert len(images) == SAMPLES * (1 + 4 * len(METHODS)) + 4 * SAMPLES * len(METHODS) * 7
    assert all(set(a) == {"class", "src", "alt", "title"} and a["src"].startswith("data:image/png;base64,")
               for a in images)
    assert not [a for _, a in tags if any(k.startswith("on") for k in a)]
    assert sum(t == "script" for t, _ in tags) == 1 + len(c.figures)
    assert "&lt;img src=x onerror=" in page and f"data-method='{PART}" not in page


@pytest.mark.skipif(_browser() is None, reason="no headless browser (apt-get install chromium)")
def test_seed_dashboard_renders_in_a_headless_browser(seed_runs, tmp_path):
    """Chromium loads the page of the three seed runs and the payload run (a method named by the payload, the
    title too): every section and gallery image is there, no payload ran (the title is the escaped text, no
    injected element), and the screenshot shows the sanity table's and the gallery's colours."""
    root, folders, payload = seed_runs
    c = compare.main([str(f) for f in folders] + [str(payload), "--names", "seed0", "seed1", "seed2", "payload",
                                                  "--out", str(tmp_path / "out"), "--no-png", "--title", TEXT])
    shot = tmp_path / "shot.png"
    result = subprocess.run([_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                             "--no-first-run", "--disable-background-networking", "--disable-component-update",
                             "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=15000",
                             "--window-size=1400,5000", f"--screenshot={shot}", "--dump-dom",
                             (c.out / "dashboard.html").as_uri()], capture_output=True, text=True, timeout=180)
    dom = result.stdout
    assert "</html>" in dom, result.stderr[-2000:]
    for section in ('id="sanity-table"', 'id="meta-stability"', 'id="meta-agreement"', 'id="gallery-runs"'):
        assert section in dom, section
    assert dom.count('data-tau="') == len(c.meta.agreement_names) ** 2
    images = SAMPLES * (1 + 4 * len(METHODS)) + 4 * SAMPLES * len(METHODS) * 7
    tags = _tags(dom)
    assert [a.get("class") for t, a in tags if t == "img"] == ["gmap"] * images   # none injected
    assert not [a for _, a in tags if any(k.startswith("on") for k in a)] and "<script>document" not in dom
    title = re.search(r"<title>(.*?)</title>", dom, re.S).group(1)
    assert title == TEXT.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")   # no script set it
    assert dom.count("&lt;img src=x onerror=") >= 2 * SAMPLES   # the payload method's rows: text
    image = pytest.importorskip("PIL.Image")
    pixels = np.asarray(image.open(shot).convert("RGB")).reshape(-1, 3).astype(int)
    colours = {tuple(p) for p in pixels[:: 7]}
    assert (0xEE, 0xF7, 0xEE) in colours and (0xFB, 0xE0, 0xE0) in colours   # pass and fail cells
    saturated = (pixels.max(axis=1) - pixels.min(axis=1)) > 120
    assert saturated.mean() > 0.05, saturated.mean()                         # the maps (jet) are drawn


def _text_batches():
    """Two fake text batches (no model): token maps, word ids with a special token and padding, words."""
    import torch

    g = torch.Generator().manual_seed(0)
    for start in (0, 2):
        word_ids = torch.tensor([[-1, 0, 1, 1, 2, -1], [-1, 0, 1, -1, -1, -1]])
        outputs = {"relevance": {"m": {"predicted": torch.randn(2, 6, generator=g)}},
                   "logits": torch.randn(2, 3, generator=g)}
        batch = {"input_ids": torch.ones(2, 6, dtype=torch.long), "word_ids": word_ids,
                 "words": [["a", "b", "c"], [f"<w{start}>", "e"]], "word_offset": torch.zeros(2, dtype=torch.long),
                 "label": torch.tensor([0, 1]), "index": torch.tensor([start, start + 1])}
        yield outputs, batch


def test_text_gallery_words_and_resume_round_trip(tmp_path):
    """Word scores (the signed token score of largest magnitude per word), words padded, and a gallery saved
    through a progress file after one batch and resumed equals the uninterrupted one."""
    from types import SimpleNamespace

    import torch

    from callbacks.map_gallery import MapGallery
    from callbacks.progress import write_atomic

    data = list(_text_batches())
    whole = MapGallery(samples=3)
    for outputs, batch in data:
        whole.on_test_batch_end(None, None, outputs, batch, 0)
    trainer = SimpleNamespace(callbacks=[whole])
    arrays = whole.arrays(trainer)
    assert arrays["ids"].tolist() == [0, 1, 2] and arrays["words"].tolist()[1] == ["<w0>", "e", ""]
    tokens = data[0][0]["relevance"]["m"]["predicted"][0]
    expected = [tokens[1], tokens[2] if tokens[2].abs() >= tokens[3].abs() else tokens[3], tokens[4]]
    assert np.allclose(arrays["map/m/predicted"][0], torch.stack(expected).numpy())
    assert np.isnan(arrays["map/m/predicted"][1, 2]) and arrays["covered"][1].tolist() == [True, True, False]
    first = MapGallery(samples=3)
    first.on_test_batch_end(None, None, *data[0], 0)
    path = write_atomic({"extra": first.extra_progress_state()}, tmp_path / "state.pt")
    resumed = MapGallery(samples=3)
    resumed.load_extra_progress_state(torch.load(path, weights_only=True)["extra"])
    resumed.on_test_batch_end(None, None, *data[1], 0)
    again = resumed.arrays(SimpleNamespace(callbacks=[resumed]))
    assert arrays.keys() == again.keys()
    assert all(np.array_equal(arrays[k], again[k], equal_nan=arrays[k].dtype.kind == "f") for k in arrays)
    with pytest.raises(ValueError, match="samples must be >= 0"):
        MapGallery(samples=-1)
