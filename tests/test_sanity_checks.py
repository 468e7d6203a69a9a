"""The randomisation sanity checks (callbacks/sanity.py) on the synthetic ViT: the test of the tests (the
input-only edge map fails MPRT, Grad-CAM and CDAM pass), the user's model untouched, sMPRT's seeded noise,
determinism (halves merged, resumed, two gloo processes), and the refusals."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from callbacks.sanity import INPUT_ONLY, RandomisationTest, input_only_map, other_classes
from tests.gloo import gloo_group, run_on_two_processes

METHODS = ["gradcam", "cdam", "random"]


def _module():
    import training  # noqa: F401  (registers the 'synthetic' source: the cached small ViT)
    from lightning_modules.evaluation import AttributionEvaluationModule

    return AttributionEvaluationModule("synthetic", methods=METHODS, class_settings=["predicted"])


def _batches(n: int = 8, batch_size: int = 4) -> list:
    from datamodules.synthetic_shapes import SyntheticShapesDataModule

    data = SyntheticShapesDataModule(image_size=64, test_size=n, batch_size=batch_size, object_scale=(0.2, 0.25))
    data.setup("test")
    return list(data.test_dataloader())


@pytest.fixture(scope="module")
def synthetic():
    torch.set_num_threads(1)
    module = _module()
    batches = _batches()
    outputs = [module.test_step(batch, i) for i, batch in enumerate(batches)]
    return module, batches, outputs


def _drive(callback, pairs):
    for outputs, batch in pairs:
        callback.update(outputs, batch)
    return callback


def _options(**extra):
    return dict(orders=["top_down", "independent"], input_only=True, seed=0, **extra)


def test_input_only_map_fails_and_gradient_methods_pass(synthetic):
    module, batches, outputs = synthetic
    before = {k: v.clone() for k, v in module.model.state_dict().items()}
    cb = _drive(RandomisationTest(**_options()), zip(outputs, batches))
    results = cb.compute()
    assert all(torch.equal(v, before[k]) for k, v in module.model.state_dict().items()), "the model was written"
    key = "sanity/{}/predicted/{}".format
    edge = results[key(INPUT_ONLY, "mprt_top_down_spearman")]
    assert len(edge) == 6 and min(edge) > 0.9                       # head, 4 blocks, embedding: the map stays
    assert results[key(INPUT_ONLY, "mprt_top_down_pass")] == 0.0
    assert results[key(INPUT_ONLY, "mprt_independent_pass")] == 0.0
    assert results[key(INPUT_ONLY, "random_logit_pass")] == 0.0
    assert results[key("random", "mprt_top_down_pass")] == 0.0      # the seeded null map ignores the model too
    for method in ("gradcam", "cdam"):
        curve = results[key(method, "mprt_top_down_spearman")]
        assert curve[-1] < 0.2, (method, curve)
        assert results[key(method, "mprt_top_down_pass")] == 1.0
        assert results[key(method, "mprt_top_down_ssim")][-1] < results[key(INPUT_ONLY, "mprt_top_down_ssim")][-1]
    assert results[key("gradcam", "random_logit_pass")] == 1.0
    # declarations: every result has a direction, curves have x values, per-sample rows for every sample
    declared = cb.higher_is_better()
    assert set(declared) == set(results)
    assert declared[key("gradcam", "mprt_top_down_spearman")] is False and declared[key("cdam", "emprt")] is True
    assert cb.curve_x()[key("cdam", "mprt_independent_topk")] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    index, values = cb.per_sample_scores()[key("cdam", "mprt_top_down_spearman")]
    assert index.tolist() == list(range(8)) and values.shape == (8, 6)
    assert np.allclose(values.mean(0).tolist(), results[key("cdam", "mprt_top_down_spearman")])
    assert json.loads(json.dumps(cb.conventions())) == cb.conventions()
    assert cb.conventions()["steps"]["top_down"] == ["head", "block_3", "block_2", "block_1", "block_0", "embedding"]


def test_smprt_noise_is_the_same_on_every_model(synthetic):
    module, batches, outputs = synthetic
    cb = _drive(RandomisationTest(methods=["gradcam"], orders=["top_down"], noisy_samples=2, emprt=False,
                                  random_logit=False, input_only=True), zip(outputs[:1], batches[:1]))
    results = cb.compute()
    assert results[f"sanity/{INPUT_ONLY}/predicted/smprt_top_down_spearman"] == [1.0] * 6
    assert results["sanity/gradcam/predicted/smprt_top_down_spearman"][-1] < 0.5
    assert results["sanity/gradcam/predicted/smprt_top_down_pass"] == 1.0


def test_halves_merged_and_resumed_equal_one_run(synthetic, tmp_path):
    from callbacks.progress import write_atomic

    _, batches, outputs = synthetic
    pairs = list(zip(outputs, batches))
    whole = _drive(RandomisationTest(**_options()), pairs).compute()
    a = _drive(RandomisationTest(**_options()), pairs[1:])
    b = _drive(RandomisationTest(**_options()), pairs[:1])
    for ma, mb in zip(a.metrics(), b.metrics()):
        ma.merge_state(mb)                          # what the cat reduction does under DDP
    merged = a.compute()
    assert merged.keys() == whole.keys() and all(np.array_equal(merged[k], whole[k], equal_nan=True) for k in whole)
    first = _drive(RandomisationTest(**_options()), pairs[:1])
    resumed = RandomisationTest(**_options())
    path = write_atomic({"callbacks": [first.progress_state()]}, tmp_path / "state.pt")
    saved = torch.load(path, weights_only=True)["callbacks"][0]      # a progress file: plain values and tensors
    assert saved["build"]["steps"]["top_down"][0] == "head"
    resumed.build_from_progress(saved, torch.device("cpu"))
    again = _drive(resumed, pairs[1:]).compute()
    assert all(np.array_equal(again[k], whole[k], equal_nan=True) for k in whole)


def _gloo_worker(rank: int, world: int, port: int, folder: str) -> None:
    torch.set_num_threads(1)
    with gloo_group(rank, world, port):
        module = _module()
        batches = _batches()[rank::world]
        cb = _drive(RandomisationTest(**_options()), [(module.test_step(b, i), b) for i, b in enumerate(batches)])
        results = cb.compute()
        if rank == 0:
            (Path(folder) / "two.json").write_text(json.dumps(results))


@pytest.mark.slow
def test_two_gloo_processes_give_identical_results(synthetic, tmp_path):
    _, batches, outputs = synthetic
    one = _drive(RandomisationTest(**_options()), zip(outputs, batches)).compute()
    run_on_two_processes(_gloo_worker, str(tmp_path), base_port=29800, timeout=600)
    two = json.loads((tmp_path / "two.json").read_text())
    assert two.keys() == one.keys()
    assert all(np.array_equal(two[k], one[k], equal_nan=True) for k in one)


def test_other_classes_and_input_only_map():
    targets, ids = torch.tensor([0, 1, 2, 2, 1]), torch.tensor([4, 9, 1, 7, 3])
    other = other_classes(targets, ids, 3, seed=0)
    assert bool((other != targets).all()) and bool(((other >= 0) & (other < 3)).all())
    assert torch.equal(other, other_classes(targets, ids, 3, seed=0))
    assert torch.equal(other[1:2], other_classes(targets[1:2], ids[1:2], 3, seed=0))   # per sample, not per batch
    with pytest.raises(ValueError, match="two classes"):
        other_classes(targets, ids, 1, seed=0)
    image = torch.zeros(1, 3, 8, 8)
    image[..., 4:] = 1.0                                                   # one vertical edge
    edges = input_only_map({"image": image})
    assert edges.shape == (1, 8, 8) and float(edges[0, :, :3].abs().sum()) == 0 and float(edges[0, :, 3:5].min()) > 0


def test_refusals_name_the_problem(synthetic):
    _, batches, outputs = synthetic
    with pytest.raises(ValueError, match="orders"):
        RandomisationTest(orders=["sideways"])
    with pytest.raises(ValueError, match="pass_measure"):
        RandomisationTest(measures=["topk"], pass_measure="spearman")
    with pytest.raises(KeyError, match="'model'"):
        RandomisationTest().update({k: v for k, v in outputs[0].items() if k != "model"}, batches[0])
    text = {"input_ids": torch.ones(2, 5, dtype=torch.long), "index": torch.arange(2)}
    with pytest.raises(ValueError, match="sMPRT"):
        RandomisationTest(noisy_samples=2).update(outputs[0], text)


def test_planted_words_input_only_fails_and_gradient_methods_pass(tmp_path):
    """The shipped planted-words config, trimmed: the token-id map fails MPRT, CDAM and Generic Attribution pass
    (the small BERT of configs/train/planted_words_bert.yaml, cached on first use)."""
    import yaml

    import evaluate

    root = Path(__file__).resolve().parent.parent
    config = yaml.safe_load((root / "configs" / "evaluate" / "planted_words_sanity.yaml").read_text())
    config["base"] = str(root / "configs" / "base" / "evaluate.yaml")
    config["trainer"]["logger"] = False
    config["trainer"]["callbacks"][0]["init_args"]["orders"] = ["top_down"]
    config["model"]["methods"] = ["cdam", "generic_attribution", "random"]
    config["data"]["init_args"]["eval_subset"] = 8
    config["data"]["init_args"]["batch_size"] = 4
    path = tmp_path / "planted.yaml"
    path.write_text(json.dumps(config))
    results = evaluate.main(["--config", str(path), "--output_dir", str(tmp_path / "run"),
                             "--trainer.default_root_dir", str(tmp_path)])
    key = "sanity/{}/predicted/{}".format
    assert min(results[key(INPUT_ONLY, "mprt_top_down_spearman")]) > 0.9
    assert results[key(INPUT_ONLY, "mprt_top_down_pass")] == 0.0
    assert results[key("random", "mprt_top_down_pass")] == 0.0
    for method in ("cdam", "generic_attribution"):
        assert results[key(method, "mprt_top_down_spearman")][-1] < 0.5, method
        assert results[key(method, "mprt_top_down_pass")] == 1.0
    assert not any("ssim" in k for k in results)                   # no SSIM on texts


@pytest.mark.parametrize("name", ["open_clip_vision", "timm_beit_relpos", "hf_bert", "hf_gpt2_left",
                                  "open_clip_text"])
def test_every_kind_of_family_runs_and_leaves_the_model_alone(name):
    """The checks on tiny models of the conformance matrix (CLIP towers: another prompt is another class; a
    decoder: another vocabulary token): Grad-CAM re-explained on the randomised copies, the user's model untouched,
    the edge / token-id map fails."""
    from types import SimpleNamespace

    from lightning_modules.evaluation import token_layout
    from methods import build_method
    from tests.families import FAMILIES

    family = next(f for f in FAMILIES if f.name == name)
    model = family.build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inputs = family.inputs(3)
    method = build_method("gradcam", **(family.options or {}).get("gradcam", {}))
    with torch.no_grad():
        logits = family.logits(model, inputs)
    logits = logits if logits.dim() == 2 else logits[:, -1]
    predicted = logits.argmax(-1)

    def explain(name, x, target, sample_ids, model=None):
        with torch.enable_grad():       # the module's explain: model None is the user's model
            return method(user if model is None else model, x, target=target, sample_ids=sample_ids).detach()

    user = model

    index = torch.tensor([5, 6, 7])
    batch = (dict(inputs, index=index) if isinstance(inputs, dict) else
             {"input_ids": inputs, "index": index} if not inputs.is_floating_point() else
             {"image": inputs, "index": index})
    outputs = {"relevance": {"gradcam": {"predicted": explain("gradcam", inputs, predicted, index)}},
               "targets": {"predicted": predicted}, "logits": logits, "class_specific": {"gradcam": True},
               "layout": token_layout(model, inputs), "explain": explain, "model": model,
               "classifier": SimpleNamespace(model_inputs=lambda b: inputs)}
    cb = RandomisationTest(orders=["top_down"], input_only=True)
    cb.update(outputs, batch)
    results = cb.compute()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert cb.conventions()["steps"]["top_down"] == ["head", "block_2", "block_1", "block_0", "embedding"]
    assert results[f"sanity/{INPUT_ONLY}/predicted/mprt_top_down_pass"] == 0.0
    curve = results["sanity/gradcam/predicted/mprt_top_down_spearman"]
    assert len(curve) == 5 and all(v == v for v in curve[-1:])
