"""CLIP zero-shot evaluation: ``clip:`` specs (save_pretrained folders, ``trained:`` CLIPs) as zero-shot
classifiers with CLIP's data config, the caption data and tokenizer of the synthetic benchmark, the contrastive
training and its export, the prompt heatmaps and ``evaluate.py`` on a tiny CLIP.

Everything runs on tiny CLIPs (32 px images, 8 px patches, width 32) so the file stays well under two minutes
on 2 CPU cores; the real run (``configs/evaluate/clip_zero_shot.yaml``) is measured, not tested here.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

transformers = pytest.importorskip("transformers")

import training  # noqa: E402,F401  (registers the trained: source that clip:trained: specs use)
from datamodules.synthetic_captions import (  # noqa: E402
    BOS,
    EOS,
    PAD,
    SPECIAL_TOKENS,
    SyntheticCaptionsDataModule,
    build_caption_tokenizer,
    caption_vocabulary,
    colour_name,
    describe,
    position_phrase,
)
from models.clip import OPENAI_CLIP_MEAN, ZeroShotClassifier, clip_source, is_clip_spec, load_zero_shot_classifier  # noqa: E402
from models.clip_prompts import read_prompt_set, save_prompt_set  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHAPES4 = ["square", "circle", "triangle", "cross"]
TINY_MEAN, TINY_STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
#: the tiny training run: 1 epoch of 64 captioned 32 px images, towers of width 32 and 2 blocks
TINY_TRAIN = {
    "trainer": {"max_epochs": 1, "logger": False, "log_every_n_steps": 1},
    "model": {"init_args": {"vision": {"image_size": 32, "patch_size": 8, "hidden_size": 32, "intermediate_size": 64,
                                       "num_hidden_layers": 2, "num_attention_heads": 2},
                            "text": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                     "num_attention_heads": 2, "max_position_embeddings": 24},
                            "projection_dim": 16}},
    "data": {"init_args": {"image_size": 32, "train_size": 64, "val_size": 32, "test_size": 16, "batch_size": 32,
                           "cache_train": False}},
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKEN_ATTRIBUTIONS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "offline")


def tiny_clip(tokenizer, seed=0):
    torch.manual_seed(seed)
    config = transformers.CLIPConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=24, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id),
        vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2), projection_dim=16)
    return transformers.CLIPModel(config).eval()


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    """A tiny CLIP in save_pretrained layout: model, caption tokenizer, image processor (own mean/std), prompts."""
    folder = tmp_path_factory.mktemp("tiny_clip")
    tokenizer = build_caption_tokenizer()
    tiny_clip(tokenizer).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                    image_mean=list(TINY_MEAN), image_std=list(TINY_STD)).save_pretrained(str(folder))
    save_prompt_set(folder, SHAPES4, [[f"a photo of a {c}.", f"there is a {c}."] for c in SHAPES4],
                    templates=["a photo of a {}.", "there is a {}."])
    return folder


@pytest.fixture(scope="module")
def trained_clip(tmp_path_factory):
    """``clip:trained:configs/train/synthetic_clip.yaml+<tiny overrides>``: trained on first use (1 tiny epoch)
    through train.py's code into a temporary cache, exported, loaded."""
    import os

    root = tmp_path_factory.mktemp("trained")
    overrides = root / "tiny.yaml"
    overrides.write_text(yaml.safe_dump(TINY_TRAIN))
    previous = os.environ.get("TOKEN_ATTRIBUTIONS_CACHE")
    os.environ["TOKEN_ATTRIBUTIONS_CACHE"] = str(root / "cache")
    try:
        spec = f"clip:trained:configs/train/synthetic_clip.yaml+{overrides}"
        classifier = load_zero_shot_classifier(spec)
    finally:
        if previous is None:
            os.environ.pop("TOKEN_ATTRIBUTIONS_CACHE", None)
        else:
            os.environ["TOKEN_ATTRIBUTIONS_CACHE"] = previous
    return spec, classifier, root / "cache"


# ----------------------------------------------------------------------------------------------- clip: specs
def test_folder_loads_as_the_zero_shot_classifier_of_its_saved_prompts(clip_folder):
    clf = load_zero_shot_classifier(f"clip:{clip_folder}")
    assert isinstance(clf, ZeroShotClassifier) and not clf.training
    assert clf.classnames == SHAPES4 and clf.prompts[1] == ["a photo of a circle.", "there is a circle."]
    # OpenAI's recipe by hand: normalise each prompt's embedding, mean per class, normalise
    clip, tok = clf.clip, clf.tokenizer
    batch = tok([p for per in clf.prompts for p in per], padding=True, return_tensors="pt")
    with torch.no_grad():
        text = clip.get_text_features(**batch)
    text = getattr(text, "pooler_output", text)
    text = torch.nn.functional.normalize(text, dim=-1).view(4, 2, -1).mean(1)
    assert torch.allclose(clf.class_embeddings, torch.nn.functional.normalize(text, dim=-1), atol=1e-6)


def test_one_template_gives_clips_own_logits(clip_folder):
    clf = load_zero_shot_classifier(f"clip:hf:{clip_folder}", model_kwargs={
        "prompts": "custom", "classnames": ["ring", "square", "ring"], "templates": "a {} ."})
    assert clf.num_classes == 3  # a repeated class name stays a class of its own
    images = torch.randn(5, 3, 32, 32)
    batch = clf.tokenizer(["a ring .", "a square .", "a ring ."], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = clf.clip(pixel_values=images, **batch).logits_per_image
        assert torch.allclose(clf(images), expected, atol=1e-5)


def test_data_config_is_clips_own(clip_folder, tmp_path):
    from timm.data import resolve_data_config

    cfg = resolve_data_config({}, model=load_zero_shot_classifier(f"clip:{clip_folder}"))
    assert cfg["input_size"] == (3, 32, 32) and cfg["interpolation"] == "bicubic" and cfg["crop_pct"] == 1.0
    assert tuple(cfg["mean"]) == pytest.approx(TINY_MEAN) and tuple(cfg["std"]) == pytest.approx(TINY_STD)
    # without an image processor: OpenAI's normalisation
    bare = tmp_path / "bare"
    tokenizer = build_caption_tokenizer()
    tiny_clip(tokenizer).save_pretrained(str(bare))
    tokenizer.save_pretrained(str(bare))
    clf = load_zero_shot_classifier(f"clip:{bare}", model_kwargs={"prompts": "custom", "classnames": SHAPES4,
                                                                 "templates": ["a photo of a {}."]})
    assert tuple(resolve_data_config({}, model=clf)["mean"]) == pytest.approx(OPENAI_CLIP_MEAN)


def test_bad_specs_are_named(clip_folder, tmp_path):
    assert is_clip_spec("clip:x") and not is_clip_spec("hf:x") and not is_clip_spec(None)
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        load_zero_shot_classifier(f"clip:{tmp_path / 'does-not-exist'}")
    with pytest.raises(ValueError, match="unknown model_kwargs.*num_labels"):
        load_zero_shot_classifier(f"clip:{clip_folder}", model_kwargs={"num_labels": 3})
    with pytest.raises(ValueError, match="prompts must be one of"):
        load_zero_shot_classifier(f"clip:{clip_folder}", model_kwargs={"prompts": "imagenet"})
    with pytest.raises(ValueError, match="saved prompt set has its own class names"):
        load_zero_shot_classifier(f"clip:{clip_folder}", model_kwargs={"classnames": ["a", "b"]})
    with pytest.raises(ValueError, match="not 'clip:"):
        clip_source("clip:")
    no_prompts = tmp_path / "no_prompts"
    no_prompts.mkdir()
    (no_prompts / "config.json").write_text((clip_folder / "config.json").read_text())
    with pytest.raises(ValueError, match="no saved prompt set"):
        load_zero_shot_classifier(f"clip:{no_prompts}")
    bert = tmp_path / "bert"
    transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64).save_pretrained(str(bert))
    save_prompt_set(bert, ["a"], [["a"]])
    with pytest.raises(ValueError, match="cannot load a transformers CLIPModel"):
        load_zero_shot_classifier(f"clip:{bert}")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "prompts.json").write_text('{"classnames": ["a", "b"], "prompts": [["x"]]}')
    with pytest.raises(ValueError, match="same, non-zero length"):
        read_prompt_set(tmp_path / "broken")


# ----------------------------------------------------------------------------------------------- evaluation module
def test_evaluation_module_explains_the_vision_tower(clip_folder):
    from evaluation.classifier import Classifier
    from lightning_modules.evaluation import AttributionEvaluationModule

    module = AttributionEvaluationModule(classifier=f"clip:{clip_folder}", methods=["gradcam", "random"],
                                         class_settings=["predicted", "target"])
    assert isinstance(module.model, ZeroShotClassifier)  # models.sources.load_model dispatches clip: specs
    assert module.classifier.modality == "image" and isinstance(module.classifier, Classifier)
    assert module.classifier.mean == pytest.approx(TINY_MEAN) and module.classifier.std == pytest.approx(TINY_STD)
    images = torch.rand(3, 3, 32, 32)
    batch = {"image": images, "label": torch.tensor([0, 3, 1]), "index": torch.arange(3)}
    out = module.test_step(batch, 0)
    normalised = (images - torch.tensor(TINY_MEAN).view(1, 3, 1, 1)) / torch.tensor(TINY_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        assert torch.allclose(out["logits"], module.model(normalised), atol=1e-5)
    assert tuple(out["layout"].grid) == (4, 4)
    assert out["relevance"]["gradcam"]["target"].shape == (3, 16)
    # the map gallery keeps the image's patch maps, though the captioned batch carries token ids too
    from callbacks.map_gallery import MapGallery
    gallery = MapGallery(samples=2)
    batch["input_ids"] = torch.ones(3, 5, dtype=torch.long)
    gallery.on_test_batch_end(None, module, out, batch, 0)
    assert sorted(gallery._rows) == [0, 1] and gallery._rows[0]["map/gradcam/predicted"].shape == (16,)
    assert gallery._rows[1]["image"].shape == (32, 32, 3)


# ----------------------------------------------------------------------------------------------- captions
def test_caption_tokenizer_is_closed_and_clip_like():
    tok = build_caption_tokenizer(max_length=24)
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == list(SPECIAL_TOKENS)
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == (PAD, BOS, EOS) and tok.eos_token_id != 2
    assert len(tok) == 4 + len(caption_vocabulary())
    ids = tok("A Photo of a red Circle.")["input_ids"]
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id and tok.unk_token_id not in ids
    assert tok.convert_ids_to_tokens(ids[1:-1]) == ["a", "photo", "of", "a", "red", "circle", "."]
    assert tok("zebra")["input_ids"][1] == tok.unk_token_id


def test_descriptions_read_the_rendered_object():
    image = torch.zeros(3, 30, 30)
    mask = torch.zeros(30, 30)
    mask[2:8, 21:28] = 1
    image[:, mask.bool()] = torch.tensor([0.1, 0.3, 0.95])[:, None]  # blue
    assert describe(image, mask, 2, SHAPES4) == {"shape": "triangle", "colour": "blue", "row": "top",
                                                "column": "right"}
    assert colour_name([0.95, 0.1, 0.1]) == "red" and colour_name([0.1, 0.9, 0.1]) == "green"
    assert position_phrase("middle", "center") == "in the center" and position_phrase("bottom", "left") == \
        "in the bottom left"
    with pytest.raises(ValueError, match="mask is empty"):
        describe(image, torch.zeros(30, 30), 0)


def test_caption_batches_describe_their_images():
    dm = SyntheticCaptionsDataModule(image_size=32, train_size=8, val_size=4, test_size=8, batch_size=4)
    again = SyntheticCaptionsDataModule(image_size=32, train_size=8, val_size=4, test_size=8, batch_size=4)
    batch = next(iter(dm.test_dataloader()))
    assert batch["caption"] == next(iter(again.test_dataloader()))["caption"]  # a pure function of the sample
    assert set(batch) >= {"image", "label", "mask", "index", "caption", "input_ids", "attention_mask"}
    for i, caption in enumerate(batch["caption"]):
        attributes = describe(batch["image"][i], batch["mask"][i], int(batch["label"][i]), dm.classes)
        words = caption.rstrip(".").replace(",", "").split()
        assert attributes["shape"] == dm.classes[int(batch["label"][i])] and attributes["shape"] in words
        assert all(colour not in words or colour == attributes["colour"] for colour in
                   ("red", "orange", "yellow", "green", "cyan", "blue", "purple", "pink"))
    assert (batch["input_ids"] != dm.tokenizer.unk_token_id).all()
    assert dm.prompt_set.prompts[0][0] == "a photo of a square."


# ----------------------------------------------------------------------------------------------- training + export
def test_trained_clip_is_exported_and_cached(trained_clip):
    spec, clf, cache = trained_clip
    folders = [p for p in cache.iterdir() if p.is_dir() and p.name.startswith("synthetic_clip-")]
    assert len(folders) == 1
    folder = folders[0]
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "preprocessor_config.json", "prompts.json",
            "training.json"} <= names
    info = json.loads((folder / "training.json").read_text())
    assert "val/zero_shot_acc" in info["val_metrics"] and info["classes"] == SHAPES4
    assert clf.classnames == SHAPES4 and clf.source == str(folder)
    assert transformers.AutoTokenizer.from_pretrained(str(folder)).eos_token_id == 3
    # the same spec again: read from the cache, not trained again
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    import os

    os.environ["TOKEN_ATTRIBUTIONS_CACHE"] = str(cache)
    again = load_zero_shot_classifier(spec)
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert torch.equal(again.class_embeddings, clf.class_embeddings)


def test_module_refuses_a_datamodule_it_cannot_serve():
    from lightning_modules.clip_contrastive import CLIPContrastiveModule

    module = CLIPContrastiveModule(vision={"image_size": 32, "hidden_size": 32, "num_attention_heads": 2,
                                           "num_hidden_layers": 1, "intermediate_size": 32},
                                   text={"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1,
                                         "intermediate_size": 32}, vocab_size=16)
    dm = SyntheticCaptionsDataModule(image_size=32)
    with pytest.raises(ValueError, match="raise --model.init_args"):
        module.check_datamodule(dm)
    with pytest.raises(ValueError, match="eos_token_id 2"):
        CLIPContrastiveModule(eos_token_id=2)


# ----------------------------------------------------------------------------------------------- evaluate.py
def test_evaluate_zero_shot_config_end_to_end(trained_clip, tmp_path, monkeypatch):
    """configs/evaluate/clip_zero_shot.yaml on the tiny trained CLIP (8 test images, 3 methods): BI's
    perturbation (mean masking, fractions to 1.0), segmentation, prompt heatmaps with captions."""
    import evaluate

    spec, clf, cache = trained_clip
    monkeypatch.setenv("TOKEN_ATTRIBUTIONS_CACHE", str(cache))
    results = evaluate.main([
        "--config", str(ROOT / "configs" / "evaluate" / "clip_zero_shot.yaml"), "--trainer.logger", "false",
        "--model.classifier", spec, "--model.methods", "[gradcam, generic_attribution, random]",
        "--data.init_args.image_size", "32", "--data.init_args.test_size", "8", "--data.init_args.batch_size", "4",
        "--output_dir", str(tmp_path / "run")])
    curve = results["perturbation/gradcam/positive/predicted/curve"]
    assert len(curve) == 11 and curve[0] == results["accuracy"]
    assert {"segmentation/random/miou", "perturbation/generic_attribution/negative/target/auc"} <= set(results)
    html = (tmp_path / "run" / "prompt_heatmaps.html").read_text(encoding="utf-8")
    assert html.count("<img src=\"data:image/png;base64,") == 4 and "caption (logit" in html
    assert "prompt (logit" in html and "gradcam" in html and "class word first" in html


def test_prompt_heatmaps_rows_follow_the_words(trained_clip):
    from callbacks.prompt_heatmaps import PromptHeatmaps, class_word_wins
    from methods import build_method

    _, clf, _ = trained_clip

    class Module:
        model = clf
        methods = {"gradcam": build_method("gradcam"), "raw_attention": build_method("raw_attention")}

    class Outputs(dict):
        pass

    from evaluation.classifier import Classifier

    callback = PromptHeatmaps(num_images=2, num_prompts=1)
    classifier = Classifier(clf, clf.pretrained_cfg["mean"], clf.pretrained_cfg["std"])
    images = torch.rand(3, 3, 32, 32)
    batch = {"image": images, "label": torch.tensor([1, 2, 0]), "index": torch.arange(3),
             "caption": ["a <b>red</b> circle", "a triangle at the top", "x"]}

    class Trainer:
        is_global_zero = True

    callback.on_test_batch_end(Trainer(), Module(), {"classifier": classifier, "logits": clf(
        classifier.normalize(images)).detach(), "targets": {}}, batch, 0)
    callback.explain(Module())
    assert [t["kind"] for t in callback.texts] == ["prompt", "caption", "prompt", "caption"]
    row = callback.rows["gradcam"][1]
    assert row.words == ["a", "<b>red</b>", "circle"] and set(callback.class_word_top1) == {"gradcam",
                                                                                           "raw_attention"}
    html = callback.render(SHAPES4)
    assert "&lt;b&gt;red&lt;/b&gt;" in html and "<b>red</b>" not in html
    assert class_word_wins(row, "circle") == (float(row.scores[2]) > float(row.scores[:2].max()))
    tied = type(row)(**{**row.__dict__, "scores": torch.zeros(3)})
    assert not class_word_wins(tied, "circle")          # an all-zero map: no word wins
    lead = type(row)(**{**row.__dict__, "scores": torch.tensor([0.1, 0.2, 0.7])})
    assert class_word_wins(lead, "Circle") and not class_word_wins(lead, "square")


def test_zero_shot_metrics_on_two_processes_match_one_process(clip_folder, tmp_path):
    """The zero-shot perturbation and segmentation tests of configs/evaluate/clip_zero_shot.yaml on a tiny CLIP
    folder, 7 test images (uneven over 2 processes): every metric equal within 1e-6."""
    from tests.test_evaluate import assert_same_metrics, metrics_on_one_and_two_processes

    args = ["--config", str(ROOT / "configs" / "evaluate" / "clip_zero_shot.yaml"), "--trainer.logger", "false",
            "--trainer.callbacks", json.dumps([
                {"class_path": "callbacks.perturbation.PerturbationTest",
                 "init_args": {"class_settings": ["predicted", "target"], "directions": ["positive", "negative"],
                               "fractions": [0.3, 0.6, 1.0], "masking": "mean", "ties": "random"}},
                {"class_path": "callbacks.segmentation.SegmentationTest",
                 "init_args": {"class_setting": "predicted"}}]),
            "--model.classifier", f"clip:{clip_folder}",
            "--model.methods", "[gradcam, generic_attribution, beyond_intuition_token, random]",
            "--model.method_options", json.dumps({"beyond_intuition_token": {"start_layer": 1, "steps": 4}}),
            "--data.init_args.image_size", "32", "--data.init_args.test_size", "7",
            "--data.init_args.batch_size", "2", "--trainer.default_root_dir", str(tmp_path)]
    one, two = metrics_on_one_and_two_processes(args, tmp_path)
    assert "segmentation/generic_attribution/miou" in one
    assert "perturbation/random/positive/target/auc" in one
    assert_same_metrics(one, two)
