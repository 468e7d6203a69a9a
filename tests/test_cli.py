"""The shared command line (cli/): composed config files (``base:``), the glue shared by train.py and evaluate.py."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from cli import EvaluateCLI, TrainCLI, config_files, with_default_config

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
FLAT = Path(__file__).resolve().parent / "data" / "flat_configs"


@pytest.fixture(autouse=True)
def _wandb_mode(monkeypatch):
    """The CLI sets WANDB_MODE=offline when unset: keep that inside each test."""
    monkeypatch.setenv("WANDB_MODE", os.environ.get("WANDB_MODE", "offline"))


def _print_config(cli_class, args, capsys) -> dict:
    """The resolved config that ``--print_config`` prints (parsing only: nothing is built)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli_class([*args, "--print_config"])
    assert info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("cli_class,config,flat", [
    (TrainCLI, "train/synthetic_vit.yaml", "train_synthetic_vit.yaml"),
    (EvaluateCLI, "evaluate/synthetic.yaml", "evaluate_synthetic.yaml"),
])
def test_composed_config_resolves_like_the_flat_file_it_replaced(cli_class, config, flat, capsys):
    """configs/<entry>/<name>.yaml (base files + its own keys) gives every value of the one flat file it was
    before the trainer and W&B blocks moved to configs/base/ (tests/data/flat_configs/)."""
    composed = _print_config(cli_class, ["--config", str(CONFIGS / config)], capsys)
    before = _print_config(cli_class, ["--config", str(FLAT / flat)], capsys)
    assert composed == before
    assert "base" not in composed


def test_every_config_parses_and_names_its_run(capsys):
    for cli_class, folder in ((TrainCLI, "train"), (EvaluateCLI, "evaluate")):
        for config in sorted((CONFIGS / folder).glob("*.yaml")):
            if config.name == "synthetic_vit_avgpool.yaml":  # an overrides file of synthetic_vit.yaml
                args = ["--config", str(CONFIGS / "train" / "synthetic_vit.yaml"), "--config", str(config)]
            else:
                args = ["--config", str(config)]
            resolved = _print_config(cli_class, args, capsys)
            logger = resolved["trainer"]["logger"]
            assert logger["class_path"] == "pytorch_lightning.loggers.WandbLogger", config
            assert logger["init_args"]["project"] == "token-attributions", config
            assert logger["init_args"]["name"], config


def test_base_files_apply_first_and_in_order(tmp_path, capsys):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "logger.yaml").write_text("trainer:\n  max_epochs: 3\n  logger: false\n")
    (tmp_path / "base" / "trainer.yaml").write_text("base: logger.yaml\ntrainer:\n  max_epochs: 5\n  devices: 1\n")
    (tmp_path / "other.yaml").write_text("trainer:\n  log_every_n_steps: 7\n")
    exp = tmp_path / "exp.yaml"
    exp.write_text("base: [base/trainer.yaml, other.yaml]\ntrainer:\n  devices: 2\n")
    assert config_files(exp) == [(tmp_path / p).resolve() for p in
                                 ("base/logger.yaml", "base/trainer.yaml", "other.yaml", "exp.yaml")]
    resolved = _print_config(TrainCLI, ["--config", str(exp)], capsys)["trainer"]
    assert (resolved["max_epochs"], resolved["devices"], resolved["log_every_n_steps"]) == (5, 2, 7)
    assert resolved["logger"] is False
    # the command line still wins over every file
    resolved = _print_config(TrainCLI, ["--config", str(exp), "--trainer.max_epochs", "9"], capsys)["trainer"]
    assert resolved["max_epochs"] == 9


def test_base_errors_name_the_files(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("base: b.yaml\n")
    b.write_text("base: a.yaml\n")
    with pytest.raises(ValueError, match="cycle.*a.yaml.*b.yaml.*a.yaml"):
        config_files(a)
    a.write_text("base: missing.yaml\n")
    with pytest.raises(FileNotFoundError, match="a.yaml.*missing.yaml"):
        config_files(a)
    a.write_text("base: {x: 1}\n")
    with pytest.raises(ValueError, match="a path or a list of paths"):
        config_files(a)


def test_default_config_unless_one_is_given():
    default = Path("configs/x.yaml")
    assert with_default_config(["--trainer.max_epochs", "1"], default) == ["--config", str(default),
                                                                        "--trainer.max_epochs", "1"]
    for given in (["--config", "y.yaml"], ["-c", "y.yaml"], ["--config=y.yaml"], ["--help"]):
        assert with_default_config(given, default) == given


def test_saved_config_reruns_without_its_base_files(tmp_path, monkeypatch):
    """The config a run saves is the resolved one (no 'base:' key): it re-runs on its own, from any folder."""
    monkeypatch.setenv("CI", "1")
    args = ["--config", str(CONFIGS / "train" / "synthetic_vit.yaml"), "--trainer.logger", "false",
            "--model.backbone_kwargs", "{img_size: 32, patch_size: 8, embed_dim: 32, depth: 1, num_heads: 2}",
            "--trainer.default_root_dir", str(tmp_path)]
    cli = TrainCLI(args)
    assert cli.trainer.max_epochs == 12 and not cli.trainer.progress_bar_callback  # hidden in CI
    saved = tmp_path / "config.yaml"
    saved.write_text(cli.parser.dump(cli.config))
    assert "base" not in yaml.safe_load(saved.read_text())
    again = TrainCLI(["--config", str(saved)])
    assert again.parser.dump(again.config) == cli.parser.dump(cli.config)


def test_evaluate_cli_forces_autograd_and_defaults_its_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CI", "1")
    cli = EvaluateCLI(["--config", str(CONFIGS / "evaluate" / "synthetic.yaml"), "--trainer.inference_mode", "true",
                       "--trainer.default_root_dir", "", "--trainer.logger", "false",
                       "--model.classifier", "timm:vit_tiny_patch16_224", "--model.pretrained", "false",
                       "--model.model_kwargs", "{img_size: 32, patch_size: 8, embed_dim: 32, depth: 4, num_heads: 2,"
                                               " num_classes: 4}",
                       "--model.methods", "[rollout]"])
    assert cli.trainer.test_loop.inference_mode is False and cli.config["trainer"]["inference_mode"] is False
    assert Path(cli.trainer.default_root_dir) == Path("outputs")
