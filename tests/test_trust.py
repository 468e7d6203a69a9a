"""The trust model (README, "Trust model"): configs and the command line are code; run folders, model files and
Hugging Face folders are data, which runs code only through a named opt-in. One test per route, each with a
payload that would write a marker file:

* a ``{class_path: subprocess.Popen, ...}`` mapping in every free-form argument of the LightningModules,
  DataModules and callbacks stays plain data (``methods.config_values``), given with ``--config`` or as a resumed
  run's config (``test_class_path_in_free_form_arguments_stays_data``,
  ``test_class_path_in_a_resumed_config_stays_data_even_when_trusted``);
* ``--resume``: the saved config may not switch on ``allow_pickle`` / ``trust_remote_code`` nor name a class
  outside the project and Lightning's loggers and callbacks, unless the command line repeats the setting or
  passes ``--trust_run_config`` (``test_resume_refuses_code_switches_of_the_saved_config``,
  ``test_resume_refuses_foreign_classes_of_the_saved_config``);
* ``--resume``: a model spec that trains on first use with a config outside ``configs/`` is refused too
  (``test_resume_refuses_training_configs_outside_the_project``);
* a Hugging Face folder's own Python (``auto_map``) runs only with ``trust_remote_code=True``, never through
  ``model_kwargs`` / ``config_overrides`` (``test_remote_code_runs_only_with_the_named_opt_in``).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import pytest
import pytorch_lightning as pl
import yaml

TINY = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2, "num_classes": 4}
TIMM = "timm:vit_tiny_patch16_224"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("CI", "1")


def popen(marker: Path) -> dict:
    """A config entry that, if jsonargparse instantiated it, would run ``touch <marker>``."""
    return {"class_path": "subprocess.Popen", "init_args": {"args": f"touch {marker}", "shell": True}}


def appeared(markers, wait: float = 1.0) -> list:
    """The markers that exist after at most ``wait`` seconds (a started shell needs a moment)."""
    deadline = time.monotonic() + wait
    while True:
        found = [str(m) for m in markers if Path(m).exists()]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def try_cli(cli_class, args) -> None:
    """Build the CLI (parse, instantiate); the payloads make the classes fail, which is not what is tested."""
    try:
        cli_class(args)
    except (Exception, SystemExit):
        pass


def _tiny_evaluate_config(tmp_path, data: Optional[dict] = None, callbacks: Optional[list] = None, **model) -> dict:
    return {"trainer": {"logger": False, "default_root_dir": str(tmp_path), "inference_mode": False,
                        "callbacks": callbacks},
            "model": {"classifier": TIMM, "pretrained": False, "model_kwargs": TINY, "methods": ["rollout"], **model},
            "data": data or _data("synthetic_shapes.SyntheticShapesDataModule", image_size=32, test_size=4)}


def _tiny_train_config(tmp_path, class_path: str, **init_args) -> dict:
    return {"trainer": {"logger": False, "default_root_dir": str(tmp_path)},
            "model": {"class_path": f"lightning_modules.{class_path}", "init_args": init_args},
            "data": {"class_path": "datamodules.synthetic_shapes.SyntheticShapesDataModule"}}


def _callback(class_path: str, payload: dict) -> list:
    return [{"class_path": f"callbacks.{class_path}", "init_args": {"masking_options": payload}}]


def _data(class_path: str, **init_args) -> dict:
    return {"class_path": f"datamodules.{class_path}", "init_args": init_args}


#: every free-form argument: ``name: (entry point, config holding the payload dict p)``, one payload a config so
#: that nothing else fails before it is reached
FREE_FORM = {
    "model_kwargs": ("evaluate", lambda t, p: _tiny_evaluate_config(t, model_kwargs={**TINY, **p})),
    "methods": ("evaluate", lambda t, p: _tiny_evaluate_config(t, methods={"rollout": p})),
    "method_options": ("evaluate", lambda t, p: _tiny_evaluate_config(t, method_options={"rollout": p})),
    "PerturbationTest.masking_options": ("evaluate", lambda t, p: _tiny_evaluate_config(
        t, callbacks=_callback("perturbation.PerturbationTest", p))),
    "ERASERFaithfulnessTest.masking_options": ("evaluate", lambda t, p: _tiny_evaluate_config(
        t, callbacks=_callback("faithfulness.ERASERFaithfulnessTest", p))),
    "CLIPZeroShotDataModule.classnames": ("evaluate", lambda t, p: _tiny_evaluate_config(
        t, data=_data("clip_zero_shot.CLIPZeroShotDataModule", images="synthetic", classnames=p))),
    "CLIPZeroShotDataModule.synthetic_options": ("evaluate", lambda t, p: _tiny_evaluate_config(
        t, data=_data("clip_zero_shot.CLIPZeroShotDataModule", images="synthetic", synthetic_options=p))),
    "ImageNetDataModule.data_config": ("evaluate", lambda t, p: _tiny_evaluate_config(
        t, data=_data("imagenet.ImageNetDataModule", root=str(t), data_config=p))),
    "LinearProbe.backbone_kwargs": ("train", lambda t, p: _tiny_train_config(
        t, "probe.LinearProbe", backbone="vit_tiny_patch16_224", pretrained=False, backbone_kwargs=p)),
    "TextClassifierModule.config_overrides": ("train", lambda t, p: _tiny_train_config(
        t, "text_classifier.TextClassifierModule", pretrained=False, config_overrides=p)),
    "CLIPContrastiveModule.vision": ("train", lambda t, p: _tiny_train_config(
        t, "clip_contrastive.CLIPContrastiveModule", vision=p)),
    "CLIPContrastiveModule.text": ("train", lambda t, p: _tiny_train_config(
        t, "clip_contrastive.CLIPContrastiveModule", text=p)),
}


@pytest.mark.parametrize("argument", list(FREE_FORM))
def test_class_path_in_free_form_arguments_stays_data(argument, tmp_path):
    from cli import EvaluateCLI, TrainCLI

    entry_point, config = FREE_FORM[argument]
    marker = tmp_path / "marker"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path, {"x": popen(marker)})))
    try_cli(EvaluateCLI if entry_point == "evaluate" else TrainCLI, ["--config", str(path)])
    assert not appeared([marker])


def _run_folder(tmp_path, config: dict) -> Path:
    """A folder that ``--resume`` takes: ``progress/config.yaml`` holding ``config``."""
    run = tmp_path / "run"
    (run / "progress").mkdir(parents=True)
    (run / "progress" / "config.yaml").write_text(yaml.safe_dump(config))
    return run


@pytest.mark.parametrize("argument", [name for name, (entry, _) in FREE_FORM.items() if entry == "evaluate"])
def test_class_path_in_a_resumed_config_stays_data_even_when_trusted(argument, tmp_path):
    from cli import EvaluateCLI

    marker = tmp_path / "marker"
    run = _run_folder(tmp_path, FREE_FORM[argument][1](tmp_path, {"x": popen(marker)}))
    with pytest.raises(SystemExit, match=r"\.x\.class_path: 'subprocess\.Popen'.*--trust_run_config"):
        EvaluateCLI(["--resume", str(run)])
    try_cli(EvaluateCLI, ["--resume", str(run), "--trust_run_config"])   # accepted, and still plain data
    assert not appeared([marker])


def test_resume_refuses_code_switches_of_the_saved_config(tmp_path):
    from cli import EvaluateCLI

    run = _run_folder(tmp_path, _tiny_evaluate_config(tmp_path, allow_pickle=True))
    with pytest.raises(SystemExit, match=r"model\.allow_pickle: True.*repeating it on the command line "
                                         r"\(--model\.allow_pickle true\) or the whole saved config with "
                                         r"--trust_run_config"):
        EvaluateCLI(["--resume", str(run)])
    assert EvaluateCLI(["--resume", str(run), "--model.allow_pickle", "true"]).model.hparams.allow_pickle
    assert EvaluateCLI(["--resume", str(run), "--trust_run_config"]).model.hparams.allow_pickle

    remote = _run_folder(tmp_path / "remote", _tiny_evaluate_config(tmp_path, trust_remote_code=True))
    with pytest.raises(SystemExit, match=r"model\.trust_remote_code: True.*--model\.trust_remote_code true"):
        EvaluateCLI(["--resume", str(remote)])
    assert EvaluateCLI(["--resume", str(remote), "--model.trust_remote_code", "true"]).model.hparams.trust_remote_code
    saved_kwargs = _tiny_evaluate_config(tmp_path, model_kwargs={**TINY, "trust_remote_code": True})
    nested = _run_folder(tmp_path / "nested", saved_kwargs)
    with pytest.raises(SystemExit, match=r"model\.model_kwargs\.trust_remote_code: True"):
        EvaluateCLI(["--resume", str(nested)])


class TouchMarker(pl.Callback):
    """A callback outside the project's packages: constructing it writes ``marker``."""

    def __init__(self, marker: str) -> None:
        Path(marker).touch()


def test_resume_refuses_foreign_classes_of_the_saved_config(tmp_path):
    from cli import EvaluateCLI

    marker = tmp_path / "marker"
    config = _tiny_evaluate_config(tmp_path)
    config["trainer"]["callbacks"] = [
        {"class_path": "pytorch_lightning.callbacks.LearningRateMonitor"},   # Lightning's callbacks are trusted
        {"class_path": "callbacks.accuracy.CleanAccuracyTest"},              # and the project's
        {"class_path": "tests.test_trust.TouchMarker", "init_args": {"marker": str(marker)}}]
    run = _run_folder(tmp_path, config)
    with pytest.raises(SystemExit, match=r"\(trainer\.callbacks\[2\]\.class_path: 'tests\.test_trust\.TouchMarker'\)"
                                         r"\. A run folder is data: accept the whole saved config with "
                                         r"--trust_run_config$"):
        EvaluateCLI(["--resume", str(run)])
    assert not marker.exists()
    EvaluateCLI(["--resume", str(run), "--trust_run_config"])
    assert marker.exists()


def test_resume_refuses_training_configs_outside_the_project(tmp_path):
    from cli import EvaluateCLI
    from cli.commands import untrusted_settings

    evil = tmp_path / "evil.yaml"   # a train.py config is code: it could name any class
    evil.write_text("trainer:\n  callbacks: [{class_path: tests.test_trust.TouchMarker}]\n")
    run = _run_folder(tmp_path, _tiny_evaluate_config(tmp_path, classifier=f"trained:{evil}"))
    with pytest.raises(SystemExit, match=rf"model\.classifier: 'trained:{evil}'.*--trust_run_config"):
        EvaluateCLI(["--resume", str(run)])
    ours = {"classifier": "synthetic", "a": "trained:configs/train/planted_words_bert.yaml",
            "b": "clip:trained:configs/train/synthetic_clip.yaml", "c": "synthetic:configs/train/synthetic_vit.yaml"}
    assert untrusted_settings({"model": ours}) == []
    lam = {"class_path": "pytorch_lightning.callbacks.LambdaCallback", "init_args": {"on_test_start": "os.system"}}
    assert untrusted_settings({"trainer": {"callbacks": [lam]}}) == [
        ("trainer.callbacks[0].class_path", "pytorch_lightning.callbacks.LambdaCallback")]   # hooks by import path
    theirs = {"a": f"synthetic:{evil}", "b": f"clip:trained:configs/train/synthetic_clip.yaml+{evil}",
              "c": "trained:../outside.yaml"}
    assert [key for key, _ in untrusted_settings({"model": theirs})] == ["model.a", "model.b", "model.c"]


def _remote_code_folder(tmp_path, marker: Path) -> Path:
    """A Hugging Face folder whose ``config.json`` names its own Python (``auto_map``), which writes ``marker``."""
    folder = tmp_path / "remote_code_model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "marker_bert", "architectures": ["MarkerModel"], "vocab_size": 16, "hidden_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 8,
        "auto_map": {"AutoConfig": "marker_code.MarkerConfig",
                     "AutoModelForSequenceClassification": "marker_code.MarkerModel"}}))
    (folder / "marker_code.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n\n"
        "from transformers import BertConfig, BertForSequenceClassification\n\n\n"
        "class MarkerConfig(BertConfig):\n    model_type = 'marker_bert'\n\n\n"
        "class MarkerModel(BertForSequenceClassification):\n    config_class = MarkerConfig\n")
    return folder


def test_remote_code_runs_only_with_the_named_opt_in(tmp_path, monkeypatch):
    import transformers.dynamic_module_utils as dynamic

    from lightning_modules.text_classifier import TextClassifierModule
    from models.sources import load_hf_classifier, load_model

    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "hf_modules"))
    marker = tmp_path / "marker"
    folder = _remote_code_folder(tmp_path, marker)
    opt_in = r"named opt-in trust_remote_code=True \(command line: --model\.trust_remote_code true\)"
    for kwargs in ({"trust_remote_code": True}, {"code_revision": "main"}):
        with pytest.raises(ValueError, match=rf"model_kwargs\.{next(iter(kwargs))}: .*{opt_in}"):
            load_model(f"hf:{folder}", model_kwargs=kwargs)
        with pytest.raises(ValueError, match=rf"model_kwargs\.{next(iter(kwargs))}: .*{opt_in}"):
            load_hf_classifier(str(folder), pretrained=False, model_kwargs=kwargs)
    with pytest.raises(ValueError, match=rf"config_overrides\.trust_remote_code: .*{opt_in}"):
        TextClassifierModule(str(folder), pretrained=False, config_overrides={"trust_remote_code": True})
    with pytest.raises(ValueError, match="custom code"):   # transformers refuses without the opt-in
        load_model(f"hf:{folder}", pretrained=False)
    with pytest.raises(ValueError, match="custom code"):
        load_model(f"hf:{folder}", model_kwargs={"num_labels": 2})
    assert not marker.exists()
    # the opt-in is what runs the folder's code (so the refusals above are what kept it from running)
    model = load_model(f"hf:{folder}", pretrained=False, trust_remote_code=True, model_kwargs={"num_labels": 3})
    assert type(model).__name__ == "MarkerModel" and model.config.num_labels == 3 and marker.exists()
