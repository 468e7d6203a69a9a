"""Bad input, one test per case: each gets a clear error naming the file or the sample (and what to do), never a
silent result; and what a run computed before the error is kept (its progress checkpoints).

* corrupt, empty or truncated image: ``ImageFolderDataset`` names the file (``test_unreadable_image``); in the
  middle of a run the run stops naming it, and ``--resume`` after the file is replaced writes the metrics of a run
  that never failed (``test_unreadable_image_mid_run_loses_nothing``);
* truncated ``.mat``: ``ImageNetSegmentationDataset`` names the file (``test_truncated_mat``);
* labels outside the model's classes: the evaluation module names the labels and samples
  (``test_labels_outside_the_classes``);
* a method that returns NaN for one sample: the evaluation module names the method, class setting and sample
  (``test_method_returning_nan_is_named``);
* NaN / Inf in the inputs: refused by the evaluation module naming the samples (``test_non_finite_inputs``);
* a non-finite metric: written to ``metrics.json`` as ``null`` with a warning naming each key
  (``test_non_finite_metric_is_never_written_silently``);
* a config naming an unknown method or option: the method registry names it and the choices
  (``test_unknown_method``);
* a config naming a missing file (data folder, ``.mat``, classifier, concepts, config): named by the CLI or the
  loaders (``test_missing_files``); a missing weights file is named by the timm loader
  (``test_missing_weights_file_is_named``);
* an ``--output_dir`` holding an earlier run's ``metrics.json`` or foreign files in ``progress/``: refused unless
  ``--overwrite``, which keeps the foreign files (``test_output_dir_of_an_earlier_run_is_...``);
* bad bytes, JSON, types or keys in a data file: the reader names the file and line (SST-2 ``.tsv``, Movie Reviews
  ``.jsonl``, a run folder's ``metrics.json`` / ``config.yaml``, a ``--config`` file, CLIP's
  ``preprocessor_config.json``, a subset index ``.npy``), a concept file without ``names``, pickled weights in an
  ``hf:`` folder;
* a classifier file whose kwargs ask for a huge model: refused from the shapes (a ``meta``-device build) before any
  memory is allocated (``test_classifier_file_asking_for_a_huge_model_is_refused_before_building_it``).

The classifier is a random tiny timm ViT; the data small written ImageNet folders, ``.mat`` files and text files.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from PIL import Image

from tests.test_datamodules_imagenet import write_gtsegs

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = "{img_size: 32, patch_size: 8, embed_dim: 32, depth: 2, num_heads: 2, num_classes: 4}"
WNIDS = ["n01440764", "n01443537"]   # classes 0 and 1 of ImageNet-1k
OUT_OF_RANGE_WNID = "n15075141"      # class 999: outside a 4-class model


def _image(path, seed, size=(40, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, "JPEG")
    return path


def _imagenet(root, wnids=WNIDS, per_class=3):
    """``root/val/<wnid>/img<i>.JPEG``; samples in (class, file) order: position ``c * per_class + i``."""
    paths = []
    for c, wnid in enumerate(wnids):
        paths += [_image(root / "val" / wnid / f"img{i}.JPEG", 10 * c + i) for i in range(per_class)]
    return paths


def _evaluate(monkeypatch, root, run, *extra):
    import evaluate

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("CI", "1")
    torch.set_num_threads(1)
    return evaluate.main([
        "--config", str(ROOT / "configs" / "evaluate" / "imagenet_perturbation.yaml"),
        "--model.classifier", "timm:vit_tiny_patch16_224", "--model.pretrained", "false",
        "--model.model_kwargs", TINY_MODEL, "--model.methods", "[rollout, gradcam]",
        "--data.init_args.root", str(root), "--data.init_args.image_size", "32",
        "--data.init_args.batch_size", "2", "--data.init_args.num_workers", "0",
        "--trainer.logger", "false", "--trainer.default_root_dir", str(run.parent), "--output_dir", str(run),
        "--progress_every", "1", *extra])


# ------------------------------------------------------------------------------------------ images
@pytest.mark.parametrize("damage", ["corrupt", "empty", "truncated"])
def test_unreadable_image(tmp_path, damage):
    from datamodules.imagenet import ImageNetDataModule

    paths = _imagenet(tmp_path / "imagenet")
    data = paths[1].read_bytes()
    paths[1].write_bytes({"corrupt": b"\xff\xd8 not really a jpeg" * 8, "empty": b"",
                          "truncated": data[: len(data) // 2]}[damage])
    dataset = ImageNetDataModule(str(tmp_path / "imagenet"), image_size=16).dataset("eval")
    assert dataset[0]["image"].shape == (3, 16, 16)
    with pytest.raises(RuntimeError, match=rf"cannot read image '{paths[1]}' \(corrupt or not an image\)"):
        dataset[1]


def test_unreadable_image_mid_run_loses_nothing(tmp_path, monkeypatch):
    """A truncated image in the second batch stops the run with its path; the first batch's progress stays, and
    after the file is replaced ``--resume`` writes the metrics of a run that never failed."""
    root = tmp_path / "imagenet"
    paths = _imagenet(root)
    _evaluate(monkeypatch, root, tmp_path / "clean")
    clean = json.loads((tmp_path / "clean" / "metrics.json").read_text())
    good = paths[2].read_bytes()
    paths[2].write_bytes(good[: len(good) // 3])
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match=rf"cannot read image '{paths[2]}'"):
        _evaluate(monkeypatch, root, run)
    done = torch.load(run / "progress" / "rank0.pt", weights_only=True)["done"].tolist()
    assert done == [0, 1] and not (run / "metrics.json").exists()
    paths[2].write_bytes(good)
    import evaluate

    evaluate.main(["--resume", str(run)])
    assert json.loads((run / "metrics.json").read_text()) == clean


# ------------------------------------------------------------------------------------------ .mat
@pytest.mark.parametrize("keep", [0.05, 0.5, 0.99])
def test_truncated_mat(tmp_path, keep):
    from datamodules.imagenet_segmentation import ImageNetSegmentationDataModule

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (6, 10, 3), dtype=np.uint8) for _ in range(3)]
    path = tmp_path / "gtsegs_ijcv.mat"
    write_gtsegs(path, images, [np.ones((6, 10), np.uint8)] * 3, [WNIDS[0]] * 3)
    full = path.read_bytes()
    path.write_bytes(full[: int(len(full) * keep)])
    with pytest.raises(ValueError, match=rf"'{path}' is not an HDF5 / MATLAB v7.3 file .*truncated file"):
        ImageNetSegmentationDataModule(str(path)).setup("test")


# ------------------------------------------------------------------------------------------ labels and values
def test_labels_outside_the_classes(tmp_path, monkeypatch):
    """Class 999 on a 4-class model: the error names the labels and the samples; the batch before is kept."""
    root = tmp_path / "imagenet"
    _imagenet(root, wnids=[WNIDS[0], OUT_OF_RANGE_WNID], per_class=2)   # positions 2, 3 are class 999
    run = tmp_path / "run"
    with pytest.raises(ValueError, match=r"labels \[999, 999\] \(samples \[2, 3\]\) lie outside the classifier's 4 "
                                         r"classes"):
        _evaluate(monkeypatch, root, run)
    assert torch.load(run / "progress" / "rank0.pt", weights_only=True)["done"].tolist() == [0, 1]


class _Images(pl.LightningDataModule):
    """4 random images; ``poison`` sets one value of sample 1."""

    def __init__(self, poison: float) -> None:
        super().__init__()
        self.poison = poison

    def test_dataloader(self):
        g = torch.Generator().manual_seed(0)
        items = [{"image": torch.rand(3, 32, 32, generator=g), "label": torch.tensor(i % 4), "index": torch.tensor(i)}
                 for i in range(4)]
        items[1]["image"][0, 3, 3] = self.poison
        return torch.utils.data.DataLoader(items, batch_size=2)


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_non_finite_inputs(poison):
    from callbacks.perturbation import PerturbationTest
    from callbacks.reporter import ResultsReporter
    from datamodules.unrepeated import UnrepeatedTestData
    from lightning_modules.evaluation import AttributionEvaluationModule

    torch.set_num_threads(1)
    kwargs = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4)
    module = AttributionEvaluationModule("timm:vit_tiny_patch16_224", pretrained=False, model_kwargs=kwargs,
                                         methods=["rollout"], class_settings=("predicted", "target"))
    callbacks = [PerturbationTest(), ResultsReporter(None, print_results=False)]
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, inference_mode=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
    with pytest.raises(ValueError, match=r"sample.* 1\b.*(NaN|finite|Inf)"):
        trainer.test(module, datamodule=UnrepeatedTestData(_Images(poison)), verbose=False)


def test_non_finite_metric_is_never_written_silently(tmp_path):
    """evaluate.py's metrics.json holds a non-finite metric as ``null`` (strict JSON) with a warning naming every
    such key (and point of a curve) and its value; finite results write without one."""
    import warnings

    from evaluation.reporting import write_metrics_json

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_metrics_json({"accuracy": 0.5, "perturbation/m/positive/predicted/curve": [1.0, 0.5]}, tmp_path / "a")
    results = {"accuracy": 0.5, "segmentation/m/miou": float("nan"), "segmentation/m/map": float("-inf"),
               "perturbation/m/positive/predicted/curve": [1.0, float("inf"), 0.2]}
    with pytest.warns(RuntimeWarning, match=r"3 non-finite .*perturbation/m/positive/predicted/curve\[1\]=inf, "
                                            r"segmentation/m/map=-inf, segmentation/m/miou=nan"):
        path = write_metrics_json(results, tmp_path / "metrics.json")
    assert json.loads(path.read_text())["segmentation/m/miou"] is None


# ------------------------------------------------------------------------------------------ configs
def test_unknown_method(tmp_path, monkeypatch):
    root = tmp_path / "imagenet"
    _imagenet(root, per_class=1)
    with pytest.raises(KeyError, match="unknown attribution method 'nope'; available methods: .*rollout"):
        _evaluate(monkeypatch, root, tmp_path / "run", "--model.methods", "[rollout, nope]")
    with pytest.raises(TypeError, match="bad options for attribution method 'rollout'.*'nope'"):
        _evaluate(monkeypatch, root, tmp_path / "run", "--model.method_options", "{rollout: {nope: 1}}")


def test_missing_files(tmp_path, monkeypatch):
    import evaluate

    monkeypatch.setenv("WANDB_MODE", "offline")
    root = tmp_path / "imagenet"
    _imagenet(root, per_class=1)
    missing = tmp_path / "missing"
    with pytest.raises(SystemExit, match=f"data folder '{missing}' does not exist; pass it with "
                                         "--data.init_args.root"):
        _evaluate(monkeypatch, missing, tmp_path / "run")
    with pytest.raises(FileNotFoundError, match=f"'{missing / 'classifier.pt'}' is neither .* nor an existing "
                                                "classifier file"):
        _evaluate(monkeypatch, root, tmp_path / "run", "--model.classifier", str(missing / "classifier.pt"))
    with pytest.raises(FileNotFoundError, match=f"concept file '{missing / 'concepts.pt'}' does not exist"):
        _evaluate(monkeypatch, root, tmp_path / "run", "--model.concepts", f"[{missing / 'concepts.pt'}]")
    with pytest.raises(SystemExit, match=f"data file '{missing / 'g.mat'}' does not exist"):
        evaluate.main(["--config", str(ROOT / "configs" / "evaluate" / "imagenet_segmentation.yaml"),
                       "--model.classifier", "timm:vit_tiny_patch16_224", "--model.pretrained", "false",
                       "--model.model_kwargs", TINY_MODEL, "--model.methods", "[rollout]",
                       "--data.init_args.path", str(missing / "g.mat"), "--trainer.logger", "false"])
    with pytest.raises(SystemExit):   # jsonargparse: 'error: ... File does not exist: <path>' on stderr
        evaluate.main(["--config", str(missing / "config.yaml")])


def test_missing_weights_file_is_named(tmp_path, monkeypatch):
    root = tmp_path / "imagenet"
    _imagenet(root, per_class=1)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    weights = tmp_path / "missing" / "vit.safetensors"
    with pytest.raises(Exception, match=str(weights)):
        _evaluate(monkeypatch, root, tmp_path / "run", "--model.pretrained", "true",
                  "--model.model_kwargs", f"{{pretrained_cfg_overlay: {{file: {weights}}}}}")


def test_method_returning_nan_is_named():
    """A map with NaN for one sample stops the batch with an error naming the method, setting and sample."""
    from lightning_modules.evaluation import check_finite_relevance

    rel = torch.zeros(3, 5)
    check_finite_relevance("rollout", "predicted", rel, torch.tensor([7, 8, 9]))
    rel[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"method 'rollout' \(predicted class\) returned NaN or Inf scores for "
                                         r"samples \[8\]"):
        check_finite_relevance("rollout", "predicted", rel, torch.tensor([7, 8, 9]))


# ------------------------------------------------------------------------------------------ class sets
def _tiny_text_classifier(folder, names):
    """A tiny random BERT classifier with the MiniLM tokenizer, its classes named ``names`` (id2label)."""
    import transformers

    from tests.shared_resources import minilm_folder

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_folder()), local_files_only=True)
    config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32, num_labels=len(names),
                                     id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def _test_on_sst2(folder, **module_options):
    from datamodules.sst2 import SST2DataModule
    from lightning_modules.evaluation import AttributionEvaluationModule
    from tests.shared_resources import SHARED_DATA

    module = AttributionEvaluationModule(classifier=f"hf:{folder}", methods=["random"],
                                         class_settings=["target"], **module_options)
    data = SST2DataModule(str(SHARED_DATA / "sst2" / "SST-2-val.parquet"), tokenizer=str(folder), max_length=32,
                          batch_size=4, eval_subset=4)
    seen = []

    class Labels(pl.Callback):
        def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            seen.append((batch["label"].clone(), outputs["targets"]["target"].clone()))

    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False, inference_mode=False,
                         callbacks=[Labels()])
    trainer.test(module, datamodule=data, verbose=False)
    return seen


def test_a_model_of_other_classes_is_refused_before_the_first_batch(tmp_path):
    """A 20-class model on 2-class SST-2 used to run to the end (accuracy 0.5 and AUCs); now an error names both
    class lists before any batch. Same count, other names: an error that says how to map them."""
    from datamodules.newsgroups import NEWSGROUPS

    twenty = _tiny_text_classifier(tmp_path / "twenty", list(NEWSGROUPS))
    with pytest.raises(ValueError, match=r"the model has \['alt.atheism', .*\(20 classes\) but the data has "
                                         r"\['negative', 'positive'\] \(2 classes\)"):
        _test_on_sst2(twenty)
    other = _tiny_text_classifier(tmp_path / "other", ["NEG", "POS"])
    with pytest.raises(ValueError, match=r"classes \['NEG', 'POS'\].* are not the data's \['negative', 'positive'\]"
                                         r".*--model.class_map"):
        _test_on_sst2(other)


def test_class_map_translates_the_labels_and_names_match_case_insensitively(tmp_path):
    same = _tiny_text_classifier(tmp_path / "same", ["NEGATIVE", "POSITIVE"])
    plain = _test_on_sst2(same)
    assert all(torch.equal(label, target) for label, target in plain)
    swapped = _tiny_text_classifier(tmp_path / "swapped", ["pos", "neg"])
    mapped = _test_on_sst2(swapped, class_map={"negative": "neg", "positive": "pos"})
    assert [m[0].tolist() for m in mapped] == [(1 - p[0]).tolist() for p in plain]   # 0 <-> 1 in the model's order
    with pytest.raises(ValueError, match=r"model.class_map: the model has no class \['negative', 'good'\]"):
        _test_on_sst2(swapped, class_map={"positive": "good"})


def test_generic_model_class_names_warn_and_only_the_count_is_checked():
    from evaluation.class_sets import label_translation

    warnings = []
    assert label_translation(["LABEL_0", "LABEL_1"], 2, ["negative", "positive"], warn=warnings.append) is None
    assert "generic names" in warnings[0]
    with pytest.raises(ValueError, match=r"the model has \['LABEL_0', 'LABEL_1', 'LABEL_2'\] \(3 classes\)"):
        label_translation(["LABEL_0", "LABEL_1", "LABEL_2"], 3, ["negative", "positive"])
    with pytest.raises(ValueError, match=r"the model has 4 classes but the data has"):
        label_translation(None, 4, ["a", "b"])   # a timm classifier names no classes: its count is checked
    assert label_translation(None, 2, ["a", "b"]) is None


# ------------------------------------------------------------------------------------------ output folders
def test_output_dir_of_an_earlier_run_is_refused_and_foreign_files_survive(tmp_path, monkeypatch):
    """An ``--output_dir`` with an earlier ``metrics.json`` or a foreign file in ``progress/`` is refused, naming
    the file and ``--overwrite``, and left as it was; with ``--overwrite true`` the run replaces the results and
    removes only the progress files it wrote."""
    root = tmp_path / "imagenet"
    _imagenet(root, per_class=1)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text('{"earlier": 1.0}')
    with pytest.raises(SystemExit, match=rf"earlier run \('{run / 'metrics.json'}'\).*--overwrite true"):
        _evaluate(monkeypatch, root, run)
    assert json.loads((run / "metrics.json").read_text()) == {"earlier": 1.0} and not (run / "progress").exists()
    (run / "metrics.json").unlink()
    foreign = run / "progress" / "notes.txt"
    foreign.parent.mkdir()
    foreign.write_text("mine")
    with pytest.raises(SystemExit, match=rf"'{run / 'progress'}' holds files that no evaluate.py run wrote "
                                         r"\(notes.txt\).*--overwrite true"):
        _evaluate(monkeypatch, root, run)
    (run / "metrics.json").write_text('{"earlier": 1.0}')
    _evaluate(monkeypatch, root, run, "--overwrite", "true")
    assert "earlier" not in json.loads((run / "metrics.json").read_text())
    assert sorted(p.name for p in (run / "progress").iterdir()) == ["notes.txt"] and foreign.read_text() == "mine"


# ------------------------------------------------------------------------------------------ data readers
def test_sst2_file_with_bad_bytes_or_idx_is_named(tmp_path):
    from datamodules.sst2 import read_sst2

    path = tmp_path / "dev.tsv"
    path.write_bytes(b"sentence\tlabel\tidx\na fine film\t1\t0\nbad \xff\xfe bytes\t0\t1\n")
    with pytest.raises(ValueError, match=rf"{path}:3: not UTF-8 text"):
        read_sst2(path)
    path.write_bytes(b"sentence\tlabel\tidx\na fine film\t1\tseven\n")
    with pytest.raises(ValueError, match=rf"{path}:2: idx 'seven' is not an integer"):
        read_sst2(path)
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "dev.parquet"
    pq.write_table(pa.table({"sentence": ["a fine film", "dull"], "label": [1, 0], "idx": ["0", None]}), path)
    with pytest.raises(ValueError, match=rf"'{path}', row 0: idx '0' is not an integer"):
        read_sst2(path)


@pytest.mark.parametrize("damage", ["bytes", "evidence", "evidences", "label", "docids"])
def test_movie_reviews_bad_annotation_is_named(tmp_path, damage):
    from datamodules.movie_reviews import load_split
    from tests.test_datamodules_text import write_movies

    root = write_movies(tmp_path / "movies")
    jsonl = root / "test.jsonl"
    good, second = jsonl.read_bytes().splitlines()
    ann = json.loads(second)
    if damage == "bytes":
        line = b'{"annotation_id": "\xff\xfe"}'
    else:
        ann.update({"evidence": {"evidences": [[7]]}, "evidences": {"evidences": [7]},
                    "label": {"classification": ["NEG"]}, "docids": {"docids": 7}}[damage])
        line = json.dumps(ann).encode()
    jsonl.write_bytes(good + b"\n" + line + b"\n")
    with pytest.raises(ValueError, match=rf"{jsonl}:2: .*(not UTF-8|evidences must be|classification \['NEG'\])"):
        load_split(root, "test")



def test_archive_with_a_corrupt_compressed_stream_is_named(tmp_path):
    """Bytes flipped inside a .tar.gz: tar's members may still extract; gzip's checksum, read to the end, fails."""
    import tarfile

    from datamodules.text_common import extract_archive

    (tmp_path / "movies").mkdir()
    (tmp_path / "movies" / "doc.txt").write_bytes(bytes(np.random.default_rng(0).integers(97, 123, 200_000,
                                                                                          dtype=np.uint8)))
    archive = tmp_path / "movies.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "movies", arcname="movies")
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0x55
    archive.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"cannot extract archive '{archive}' \(corrupt"):
        extract_archive(archive, tmp_path / "cache")
    assert not list((tmp_path / "cache" / "datasets").iterdir())

@pytest.mark.parametrize("name", ["metrics.json", "config.yaml"])
def test_run_folder_file_with_bad_bytes_is_named(tmp_path, name):
    from comparison.runs import RunLoadError, load_run

    (tmp_path / "metrics.json").write_text('{"perturbation/rollout/auc": 0.5}')
    (tmp_path / "config.yaml").write_text("model: {classifier: synthetic}\n")
    (tmp_path / name).write_bytes(b"{\n\xff\xfe\n")
    with pytest.raises(RunLoadError, match=rf"{tmp_path / name}:2: not UTF-8 text"):
        load_run(tmp_path)


def test_concept_file_without_names_is_named(tmp_path):
    from models.concepts import FORMAT, ConceptHead

    path = tmp_path / "concepts.pt"
    torch.save({"format": FORMAT, "kind": "mean", "vectors": torch.zeros(2, 4)}, path)
    with pytest.raises(RuntimeError, match=rf"concept file '{path}' lacks \['names'\]"):
        ConceptHead.load(path)


class _Pickled:
    """An object that only unpickling can read."""


def test_pickled_weights_of_an_hf_folder_are_named(tmp_path):
    from transformers import BertConfig

    from models.sources import load_hf_classifier

    BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
               num_labels=2).save_pretrained(tmp_path)
    torch.save({"weights": _Pickled()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=rf"weights file {tmp_path / 'pytorch_model.bin'} .*Unsupported global"):
        load_hf_classifier(str(tmp_path))


@pytest.mark.parametrize("huge, mismatch", [
    ({"embed_dim": 10 ** 6}, r"cls_token: \(1, 1, 32\) in the weights, \(1, 1, 1000000\) from the kwargs"),
    ({"depth": 10 ** 6}, "the weights hold 2 blocks, its kwargs ask for depth 1000000")], ids=["embed_dim", "depth"])
def test_classifier_file_asking_for_a_huge_model_is_refused_before_building_it(tmp_path, huge, mismatch):
    """kwargs of a huge model next to the weights of a tiny one: refused from shapes alone (meta device)."""
    import time

    from timm.models.vision_transformer import VisionTransformer

    from models.classifier_file import FORMAT, load_classifier

    kwargs = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4)
    payload = {"format": FORMAT, "kwargs": {**kwargs, **huge}, "pretrained_cfg": {},
               "state_dict": VisionTransformer(**kwargs).state_dict()}
    path = tmp_path / "huge.pt"
    torch.save(payload, path)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"classifier file '{path}' does not rebuild: .*{mismatch}"):
        load_classifier(path)
    assert time.monotonic() - start < 5


def test_config_file_with_bad_bytes_is_named(tmp_path, monkeypatch):
    import evaluate

    monkeypatch.setenv("WANDB_MODE", "offline")
    path = tmp_path / "config.yaml"
    path.write_bytes(b"model: {\n\xff\xfe: 1}\n")
    with pytest.raises(ValueError, match=rf"config file '{path}' is not valid UTF-8 YAML"):
        evaluate.main(["--config", str(path)])


@pytest.mark.parametrize("content", [b"\xff\xfe{}", b'{"image_mean": [0.5,'])
def test_clip_image_processor_config_with_bad_bytes_or_json_is_named(tmp_path, content):
    from models.clip import image_processor_config

    (tmp_path / "preprocessor_config.json").write_bytes(content)
    with pytest.raises(ValueError, match=rf"image processor config '{tmp_path / 'preprocessor_config.json'}'"):
        image_processor_config(str(tmp_path))


def test_subset_index_file_that_is_no_array_is_named(tmp_path):
    from datamodules.clip_zero_shot import subset_by_index

    path = tmp_path / "indices.npy"
    path.write_bytes(b"not an array at all")
    with pytest.raises(ValueError, match=rf"subset index file '{path}' is not a .npy array"):
        subset_by_index(list(range(4)), path, tmp_path)
