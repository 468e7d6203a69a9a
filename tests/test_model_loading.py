"""Loading real classifier weights offline: a timm name plus a local weights file (the README's recipe)."""
from __future__ import annotations

import pytest
import torch

timm = pytest.importorskip("timm")

from lightning_modules.evaluation import load_model  # noqa: E402


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
    with pytest.raises(ValueError, match="vit_tiny_patch16_224"):
        load_model("timm:vit_tiny_patch16_224", pretrained=True,
                   model_kwargs={"pretrained_cfg_overlay": {"file": str(missing)}})


def test_unknown_classifier_is_named():
    with pytest.raises(FileNotFoundError, match="no_such_classifier.pt"):
        load_model("no_such_classifier.pt")
