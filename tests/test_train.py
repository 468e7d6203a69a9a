"""LinearProbe, export to stock timm, classifier files, concepts, train.py end to end (subprocess), the synthetic
classifier cache (trained in-process)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

timm = pytest.importorskip("timm")
import pytorch_lightning as pl  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

from datamodules.synthetic_shapes import SyntheticShapesDataModule, SyntheticShapesDataset  # noqa: E402
from lightning_modules.probe import LinearProbe  # noqa: E402
from models.classifier_file import load_classifier, save_classifier  # noqa: E402
from models.concepts import ConceptHead, latents  # noqa: E402
from models.sources import CACHE_ENV  # noqa: E402
from training import cached_training, synthetic  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
TINY_ARGS = ["--model.backbone_kwargs", "{img_size: 32, patch_size: 8, embed_dim: 32, depth: 1, num_heads: 2}",
             "--data.init_args.image_size", "32", "--data.init_args.train_size", "32", "--data.init_args.val_size",
             "16", "--data.init_args.batch_size", "16", "--trainer.max_epochs", "1"]


def _probe(features="cls", **kw):
    torch.manual_seed(0)
    kw.setdefault("backbone_kwargs", TINY)
    return LinearProbe("vit_tiny_patch16_224", num_classes=4, features=features, pretrained=False, **kw)


def _images(n=6, size=32, seed=0):
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def test_frozen_probe_learns_and_backbone_is_unchanged():
    torch.set_num_threads(1)
    pl.seed_everything(0)
    probe = _probe("cls+mean_patch", lr=3e-2, augment="none", mean=(0.5,) * 3, std=(0.5,) * 3)
    before = {k: v.clone() for k, v in probe.backbone.state_dict().items()}
    head_before = probe.head.weight.detach().clone()
    assert not any(p.requires_grad for p in probe.backbone.parameters())
    dm = SyntheticShapesDataModule(image_size=32, train_size=64, val_size=64, batch_size=32)
    dm.setup("fit")
    data = next(iter(torch.utils.data.DataLoader(dm.dataset("train"), batch_size=64)))

    def acc():
        probe.eval()
        with torch.no_grad():
            return (probe(data["image"]).argmax(-1) == data["label"]).float().mean().item()

    start = acc()
    trainer = pl.Trainer(max_epochs=60, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(probe, datamodule=dm)
    end = acc()
    # fitting the (tiny) training set with a linear head on frozen random features: clearly above chance (0.25)
    assert end > 0.6 and end > start + 0.2, (start, end)
    after = probe.backbone.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not torch.equal(head_before, probe.head.weight)
    assert "train/loss_epoch" in trainer.callback_metrics or "train/loss" in trainer.callback_metrics


def test_finetune_mode_trains_backbone():
    probe = _probe(finetune=True)
    assert all(p.requires_grad for p in probe.backbone.parameters())
    probe.train()
    assert probe.backbone.training
    frozen = _probe()
    frozen.train()
    assert not frozen.backbone.training  # frozen backbone stays in eval mode


@pytest.mark.parametrize("features,pool", [("cls", "token"), ("mean_patch", "avg")])
def test_export_matches_probe_logits_and_reloads(tmp_path, features, pool):
    probe = _probe(features)
    torch.nn.init.normal_(probe.head.weight)
    # give the final norm non-trivial affine weights so a wrong norm/fc_norm placement would show
    torch.nn.init.normal_(probe.backbone.norm.weight)
    torch.nn.init.normal_(probe.backbone.norm.bias)
    probe.eval()
    x = _images()
    model = probe.to_timm()
    assert type(model) is VisionTransformer and model.global_pool == pool
    assert isinstance(model.fc_norm, torch.nn.Identity)
    with torch.no_grad():
        want = probe(x)
        got = model(probe.normalise(x))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(model.head.weight, probe.head.weight)
    path = save_classifier(model, tmp_path / "sub" / "clf.pt", val_acc=0.5)
    loaded = load_classifier(path)
    assert not loaded.training and type(loaded) is VisionTransformer
    with torch.no_grad():
        torch.testing.assert_close(loaded(probe.normalise(x)), want, rtol=0, atol=1e-5)
    cfg = timm.data.resolve_data_config({}, model=loaded)
    assert cfg["mean"] == pytest.approx(probe.mean.flatten().tolist())
    assert cfg["std"] == pytest.approx(probe.std.flatten().tolist())
    assert tuple(cfg["input_size"]) == (3, 32, 32)
    assert loaded.classifier_metadata == {"val_acc": 0.5}


def test_cls_plus_mean_patch_cannot_export():
    with pytest.raises(ValueError, match="cannot be exported"):
        _probe("cls+mean_patch").to_timm()


def test_classifier_file_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        load_classifier(tmp_path / "nope.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(RuntimeError, match="bad.pt"):
        load_classifier(bad)
    other = tmp_path / "other.pt"
    torch.save({"weights": 1}, other)
    with pytest.raises(RuntimeError, match="other.pt"):
        load_classifier(other)


def test_backbone_from_local_checkpoint_and_offline_error(tmp_path, monkeypatch):
    src = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, **TINY)
    path = tmp_path / "dino_like.pth"
    torch.save({"teacher": {f"module.backbone.{k}": v for k, v in src.state_dict().items()}}, path)
    probe = _probe(backbone_checkpoint=str(path))
    for k, v in src.state_dict().items():
        assert torch.equal(probe.backbone.state_dict()[k], v)
    with pytest.raises(FileNotFoundError, match="missing.pth"):
        _probe(backbone_checkpoint=str(tmp_path / "missing.pth"))

    def offline(*args, pretrained=False, **kwargs):
        if pretrained:
            raise OSError("We couldn't connect to 'https://huggingface.co'")
        return real(*args, **kwargs)

    real = timm.create_model
    monkeypatch.setattr(timm, "create_model", offline)
    with pytest.raises(RuntimeError, match="backbone_checkpoint"):
        LinearProbe("vit_tiny_patch16_224", num_classes=4, pretrained=True, backbone_kwargs=TINY)


def _direct_cls_latent(model, x):
    """Final-norm [CLS] token computed block by block, without forward_head."""
    t = model._pos_embed(model.patch_embed(x))
    for block in model.blocks:
        t = block(t)
    return model.norm(t)[:, 0]


def test_concept_vectors_are_mean_latents(tmp_path):
    model = _probe().to_timm()
    ds = SyntheticShapesDataset(40, image_size=32, split="val")
    head = ConceptHead.from_dataset(model, ds, classes=[0, 2], per_concept=5, names=["square", "triangle"])
    mean = torch.tensor(model.pretrained_cfg["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(model.pretrained_cfg["std"]).view(1, 3, 1, 1)
    for name, cls in (("square", 0), ("triangle", 2)):
        imgs = torch.stack([ds[i]["image"] for i in range(len(ds)) if ds[i]["label"] == cls][:5])
        with torch.no_grad():
            direct = _direct_cls_latent(model, (imgs - mean) / std).mean(0)
        torch.testing.assert_close(head.vector(name), direct, rtol=1e-5, atol=1e-5)
    head.save(tmp_path / "c.pt", source="synthetic")
    again = ConceptHead.load(tmp_path / "c.pt")
    assert again.names == head.names and torch.equal(again.vectors, head.vectors) and again.kind == "mean"
    with pytest.raises(KeyError, match="circle"):
        head.vector("circle")


def test_learned_concept_direction_separates(tmp_path):
    from PIL import Image

    model = _probe().to_timm()
    # folder per concept: bright vs dark images
    g = torch.Generator().manual_seed(0)
    for name, lo in (("bright", 0.6), ("dark", 0.0)):
        (tmp_path / name).mkdir()
        for i in range(6):
            arr = (lo + 0.4 * torch.rand(40, 40, 3, generator=g)).mul(255).byte().numpy()
            Image.fromarray(arr).save(tmp_path / name / f"{i}.png")
    head = ConceptHead.from_folders(model, tmp_path, kind="cav")
    assert head.names == ["bright", "dark"]
    torch.testing.assert_close(head.vectors.norm(dim=1), torch.ones(2))
    from models.concepts import load_image_folder

    z_b = latents(model, load_image_folder(tmp_path / "bright", (32, 32)))
    z_d = latents(model, load_image_folder(tmp_path / "dark", (32, 32)))
    v = head.vector("bright")
    assert (z_b @ v).min() > (z_d @ v).max()
    with pytest.raises(FileNotFoundError, match="nowhere"):
        ConceptHead.from_folders(model, tmp_path / "nowhere")


def test_cdam_of_a_reloaded_concept_equals_a_direct_computation(tmp_path):
    """cdam with a concept file's vector = sum over channels of (last block's norm1 output) x (its gradient) of
    <final [CLS] latent, v>, computed here with a plain hook and autograd, patch tokens only."""
    model = _probe().to_timm()
    torch.nn.init.normal_(model.norm.weight)
    ConceptHead(["c"], torch.randn(1, model.num_features, generator=torch.Generator().manual_seed(1))).save(
        tmp_path / "c.pt")
    head = ConceptHead.load(tmp_path / "c.pt")
    x = _images(2)
    rel = head.method("c")(model, x, target=None)
    assert rel.shape == (2, 16)

    seen = {}
    handle = model.blocks[-1].norm1.register_forward_hook(lambda m, i, o: seen.setdefault("t", o))
    try:
        latent = _direct_cls_latent(model, x)
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad((latent @ head.vector("c")).sum(), seen["t"])
    direct = (seen["t"] * grad).sum(-1)[:, 1:].detach()
    torch.testing.assert_close(rel, direct, rtol=1e-4, atol=1e-6)
    assert not any(p.grad is not None for p in model.parameters())


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in cached_training._DIST_ENV}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1")
    return env


@pytest.fixture(scope="module")
def tiny_synthetic(tmp_path_factory):
    """``ensure_synthetic_classifier`` with TINY_ARGS, called as rank 1 of a 2-process DDP run would call it (its
    environment, Lightning's rank flag) and with subprocesses forbidden: what training saw and left behind."""
    from lightning_utilities.core.rank_zero import rank_zero_only

    import training.fit

    cache = tmp_path_factory.mktemp("synthetic_cache")
    args = tuple(TINY_ARGS) + ("--trainer.logger", "false")
    ddp_env = dict(LOCAL_RANK="1", RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29555")
    seen = {}
    real_fit_and_export = training.fit.fit_and_export

    def spy(trainer, *a, **kw):
        seen.update(pid=os.getpid(), env={k: os.environ.get(k) for k in ddp_env}, rank=rank_zero_only.rank,
                    devices=trainer.num_devices, world_size=trainer.world_size)
        return real_fit_and_export(trainer, *a, **kw)

    def no_subprocess(*a, **kw):
        raise AssertionError(f"the synthetic classifier must train in-process, not via {a[:1]}")

    with pytest.MonkeyPatch.context() as mp:
        for key, value in ddp_env.items():
            mp.setenv(key, value)
        mp.setattr(rank_zero_only, "rank", 1)
        mp.setattr(training.fit, "fit_and_export", spy)
        mp.setattr(subprocess, "run", no_subprocess)
        mp.setattr(subprocess, "Popen", no_subprocess)
        wandb_mode = os.environ.get("WANDB_MODE")
        torch.manual_seed(123)
        rng = torch.get_rng_state()
        path = synthetic.ensure_synthetic_classifier(cache_dir=cache, extra_args=args)
        after = dict(env={k: os.environ.get(k) for k in ddp_env}, rank=rank_zero_only.rank,
                     rng_kept=torch.equal(rng, torch.get_rng_state()), wandb_mode=os.environ.get("WANDB_MODE"),
                     wandb_mode_before=wandb_mode)
    return dict(cache=cache, args=args, path=path, seen=seen, after=after, ddp_env=ddp_env)


def test_ensure_synthetic_classifier_trains_in_process_once(tiny_synthetic):
    path, seen, after = tiny_synthetic["path"], tiny_synthetic["seen"], tiny_synthetic["after"]
    assert path.parent == tiny_synthetic["cache"] and path.is_file()
    # one plain process on one device, although the caller was a DDP rank
    assert seen["pid"] == os.getpid()
    assert seen["env"] == {k: None for k in tiny_synthetic["ddp_env"]} and seen["rank"] == 0
    assert seen["devices"] == 1 and seen["world_size"] == 1
    # the caller's state is as before: environment, rank flag, random numbers, W&B mode
    assert after["env"] == tiny_synthetic["ddp_env"] and after["rank"] == 1 and after["rng_kept"]
    assert after["wandb_mode"] == after["wandb_mode_before"]
    stamp = path.stat().st_mtime_ns
    assert synthetic.ensure_synthetic_classifier(cache_dir=tiny_synthetic["cache"],
                                                 extra_args=tiny_synthetic["args"]) == path
    assert path.stat().st_mtime_ns == stamp  # cached, not retrained
    assert isinstance(load_classifier(path), VisionTransformer)
    torch.load(path, weights_only=True)  # plain values and tensors only


def test_train_py_end_to_end(tmp_path, tiny_synthetic):
    out = tmp_path / "clf.pt"
    cmd = [sys.executable, str(ROOT / "train.py"), *TINY_ARGS, "--trainer.default_root_dir", str(tmp_path / "run"),
           "--output", str(out)]
    res = subprocess.run(cmd, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"saved classifier: {out.resolve()}" in res.stdout
    model = load_classifier(out)
    assert model.patch_embed.img_size == (32, 32) and model.head.out_features == 4
    assert "val/acc" in model.classifier_metadata["val_metrics"]
    assert list((tmp_path / "run").rglob("*.ckpt")), "best checkpoint kept"
    assert list((tmp_path / "run").rglob("wandb")), "W&B (offline) run written under default_root_dir"
    # the same arguments trained in-process by the cache give bit-identical weights
    cached = load_classifier(tiny_synthetic["path"]).state_dict()
    assert all(torch.equal(value, cached[key]) for key, value in model.state_dict().items())


def test_train_py_missing_data_or_weights_errors(tmp_path):
    cmd = [sys.executable, str(ROOT / "train.py"), *TINY_ARGS, "--model.pretrained", "true",
           "--trainer.default_root_dir", str(tmp_path)]
    res = subprocess.run(cmd, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert res.returncode != 0 and "backbone_checkpoint" in res.stderr, res.stderr[-2000:]


def test_synthetic_classifier_overrides_train_their_own_model(tiny_synthetic):
    """'synthetic:<overrides.yaml>': train.py keys over the default config, cached under a hash of their content."""
    cache, args, default = tiny_synthetic["cache"], tiny_synthetic["args"], tiny_synthetic["path"]
    overrides = cache / "avgpool.yaml"
    overrides.write_text("model:\n  features: mean_patch\n")
    avg = synthetic.ensure_synthetic_classifier(cache_dir=cache, extra_args=args, overrides=overrides)
    assert avg != default
    assert load_classifier(default).global_pool == "token"  # the default config reads [CLS]
    assert load_classifier(avg).global_pool == "avg"
    overrides.write_text("model:\n  features: cls\n")  # same path, new content: a new model
    again = synthetic.ensure_synthetic_classifier(cache_dir=cache, extra_args=args, overrides=overrides)
    assert again not in (avg, default)
    with pytest.raises(FileNotFoundError, match="no_such.yaml"):
        synthetic.resolve_synthetic_spec("synthetic:no_such.yaml", cache_dir=cache)
    with pytest.raises(ValueError, match="synthetic:<overrides.yaml>"):
        synthetic.resolve_synthetic_spec("synthetic:", cache_dir=cache)


def test_cache_key_covers_the_files_a_config_builds_on(tmp_path):
    """The key hashes the contents of every config file in the order they apply (bases first), then the extra
    arguments: a standalone config keeps the key it always had; changing a base file changes it."""
    import hashlib

    base, config = tmp_path / "base.yaml", tmp_path / "config.yaml"
    base.write_text("trainer:\n  max_epochs: 1\n")
    config.write_text("model:\n  lr: 0.1\n")
    standalone = cached_training.cache_key(config, extra_args=("--x", "1"))
    assert standalone == hashlib.sha256(config.read_bytes() + b"--x 1").hexdigest()[:10]
    config.write_text("base: base.yaml\nmodel:\n  lr: 0.1\n")
    composed = cached_training.cache_key(config)
    assert composed == hashlib.sha256(base.read_bytes() + config.read_bytes()).hexdigest()[:10]
    base.write_text("trainer:\n  max_epochs: 2\n")
    assert cached_training.cache_key(config) != composed
    # the default: configs/base/wandb.yaml, configs/base/train.yaml, configs/train/synthetic_vit.yaml
    files = [ROOT / "configs" / "base" / "wandb.yaml", ROOT / "configs" / "base" / "train.yaml",
             synthetic.SYNTHETIC_CONFIG]
    want = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:10]
    assert cached_training.cache_key(synthetic.SYNTHETIC_CONFIG) == want


def test_evaluate_trains_a_missing_synthetic_classifier_in_process(tmp_path, monkeypatch):
    """evaluate.py with 'synthetic:<overrides.yaml>' and an empty cache: the classifier trains inside evaluate's
    own command-line parsing (a command line within a command line), then the evaluation runs on it."""
    import evaluate

    overrides = tmp_path / "tiny.yaml"
    overrides.write_text(
        "trainer: {max_epochs: 1, logger: false}\n"
        "model: {backbone_kwargs: {img_size: 32, patch_size: 8, embed_dim: 32, depth: 1, num_heads: 2}}\n"
        "data: {init_args: {image_size: 32, train_size: 32, val_size: 16, batch_size: 16}}\n")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("CI", "1")
    monkeypatch.setenv("WANDB_MODE", os.environ.get("WANDB_MODE", "offline"))
    results = evaluate.main([
        "--model.classifier", f"synthetic:{overrides}", "--model.methods", "[rollout, random]",
        "--data.init_args.image_size", "32", "--data.init_args.test_size", "4", "--data.init_args.batch_size", "2",
        "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path),
        "--output_dir", str(tmp_path / "run")])
    assert len(list((tmp_path / "cache").glob("synthetic_vit-*.pt"))) == 1
    assert "accuracy" in results and (tmp_path / "run" / "metrics.json").is_file()


def test_train_py_ddp_two_cpu_processes(tmp_path):
    """2 CPU processes, DDP, launched as a subprocess (never inside pytest)."""
    out = tmp_path / "ddp.pt"
    cmd = [sys.executable, str(ROOT / "train.py"), *TINY_ARGS, "--trainer.devices", "2", "--trainer.accelerator",
           "cpu", "--trainer.strategy", "ddp", "--trainer.logger", "false",
           "--trainer.default_root_dir", str(tmp_path / "run"), "--output", str(out)]
    res = subprocess.run(cmd, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("saved classifier:") == 1
    assert isinstance(load_classifier(out), VisionTransformer)


def test_train_py_builds_concepts_that_evaluate_py_explains(tmp_path):
    """train.py --concepts writes one concept file per kind next to the classifier (vectors = what the exported
    classifier gives directly); evaluate.py --model.concepts explains them with cdam and reports the CDAM analyses."""
    import json

    from datamodules.synthetic_shapes import SHAPES

    out = tmp_path / "clf.pt"
    cmd = [sys.executable, str(ROOT / "train.py"), *TINY_ARGS, "--trainer.logger", "false",
           "--trainer.default_root_dir", str(tmp_path / "run"), "--output", str(out),
           "--concepts.kinds", "[mean, cav]", "--concepts.per_concept", "3"]
    res = subprocess.run(cmd, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    files = {kind: out.with_name(f"concepts_{kind}.pt") for kind in ("mean", "cav")}
    for kind, path in files.items():
        assert f"saved {kind} concepts" in res.stdout and path.is_file()
    model = load_classifier(out)
    mean_head, cav_head = ConceptHead.load(files["mean"]), ConceptHead.load(files["cav"])
    assert mean_head.names == list(SHAPES[:4]) and mean_head.kind == "mean" and cav_head.kind == "cav"
    # the mean concept = mean latent of the first 3 validation images of the class, computed here directly
    dm = SyntheticShapesDataModule(image_size=32, train_size=32, val_size=16, batch_size=16,
                                   object_scale=(0.2, 0.25))  # train.py's default config
    dm.setup("validate")
    val = dm.val_dataloader().dataset
    for k, name in enumerate(mean_head.names):
        imgs = torch.stack([val[i]["image"] for i in range(len(val)) if val[i]["label"] == k][:3])
        torch.testing.assert_close(mean_head.vector(name), latents(model, imgs).mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cav_head.vectors.norm(dim=1), torch.ones(4))

    config = tmp_path / "eval.yaml"
    config.write_text(
        "trainer:\n  callbacks:\n    - class_path: callbacks.cdam_analysis.CDAMAnalysis\n"
        "      init_args: {class_setting: target, discrimination: true}\n"
        "model:\n  methods: [cdam, raw_attention]\n  class_settings: [target]\n"
        f"  concepts: ['{files['mean']}', '{files['cav']}']\n  concept_methods: true\n"
        "data:\n  class_path: datamodules.synthetic_shapes.SyntheticShapesDataModule\n"
        "  init_args: {image_size: 32, test_size: 6, batch_size: 3, two_objects: true}\n")
    cmd = [sys.executable, str(ROOT / "evaluate.py"), "--config", str(config), "--model.classifier", str(out),
           "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path), "--output_dir",
           str(tmp_path / "eval")]
    res = subprocess.run(cmd, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    for kind in ("mean", "cav"):
        for name in mean_head.names:
            method = f"cdam_{kind}_concept_{name}"
            assert 0.0 <= metrics[f"cdam_analysis/sparsity/{method}"] <= 1.0
            assert -1.0 <= metrics[f"cdam_analysis/pearson/cdam__vs__{method}"] <= 1.0


def test_evaluation_module_resolves_concepts_and_names_errors(tmp_path):
    from lightning_modules.evaluation import AttributionEvaluationModule
    from methods import build_method
    from models.concepts import resolve_concept

    kwargs = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4)
    g = torch.Generator().manual_seed(0)
    mean_file = ConceptHead(["red", "blue"], torch.randn(2, 32, generator=g), kind="mean").save(tmp_path / "m.pt")
    cav_file = ConceptHead(["red"], torch.randn(1, 32, generator=g), kind="cav").save(tmp_path / "c.pt")
    torch.manual_seed(0)
    module = AttributionEvaluationModule("timm:vit_tiny_patch16_224", pretrained=False, model_kwargs=kwargs,
                                         methods={"blue": {"method": "cdam", "concept": "blue"},
                                                  "red_cav": {"method": "cdam", "concept": "cav:red"}},
                                         concepts=[str(mean_file), str(cav_file)])
    x = _images(2)
    heads = module.concept_heads
    for name, vector in (("blue", heads["mean"].vector("blue")), ("red_cav", heads["cav"].vector("red"))):
        got = module.methods[name](module.model, x)
        torch.testing.assert_close(got, build_method("cdam", concept=vector)(module.model, x))
    with pytest.raises(KeyError, match="ambiguous"):
        resolve_concept(heads, "red")
    with pytest.raises(KeyError, match="unknown.*mean:blue"):
        resolve_concept(heads, "green")
    with pytest.raises(ValueError, match="no concept file"):
        resolve_concept({}, "red")
    wrong = ConceptHead(["x"], torch.randn(1, 8), kind="mean").save(tmp_path / "w.pt")
    with pytest.raises(ValueError, match="another model"):
        AttributionEvaluationModule("timm:vit_tiny_patch16_224", pretrained=False, model_kwargs=kwargs,
                                    methods={"x": {"method": "cdam", "concept": "x"}}, concepts=str(wrong))
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        AttributionEvaluationModule("timm:vit_tiny_patch16_224", pretrained=False, model_kwargs=kwargs,
                                    methods=["cdam"], concepts=str(tmp_path / "nope.pt"))


def test_concept_heads_from_dataset_classes_with_random_negatives(tmp_path):
    from PIL import Image

    from models.concepts import ConceptsConfig, build_concept_heads, learned_direction, load_image_folder

    model = _probe().to_timm()
    ds = SyntheticShapesDataset(24, image_size=32, split="val")
    (tmp_path / "random").mkdir()
    g = torch.Generator().manual_seed(0)
    for i in range(5):
        pixels = torch.rand(32, 32, 3, generator=g).mul(255).byte().numpy()
        Image.fromarray(pixels).save(tmp_path / "random" / f"{i}.png")
    spec = ConceptsConfig(kinds=["mean", "cav"], classes=[0, 1], per_concept=3,
                          negatives_folder=str(tmp_path / "random"))
    heads = build_concept_heads(model, spec, dataset=ds, class_names=["square", "circle"])
    assert heads["mean"].names == heads["cav"].names == ["square", "circle"]
    negatives = latents(model, load_image_folder(tmp_path / "random", (32, 32)))
    squares = torch.stack([ds[i]["image"] for i in range(len(ds)) if ds[i]["label"] == 0][:3])
    torch.testing.assert_close(heads["cav"].vector("square"), learned_direction(latents(model, squares), negatives))
    spec.negatives_folder = str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="missing"):
        build_concept_heads(model, spec, dataset=ds)
