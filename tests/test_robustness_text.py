"""Infidelity and max-sensitivity on texts, in embedding space (callbacks/robustness.py, evaluation/embedding_offset):
parity with Captum 0.9.0's ``infidelity`` (``normalize`` both ways) and ``sensitivity_max`` on a tiny BERT and a
tiny Llama LM (answer-token classifier), given a forward over the input embeddings (the model's own forward with the
word embeddings' output replaced) and the same draws; batched == alone with padding; the relative scale and the
special-token option (the offset reaching every forward of a method: tests/test_robustness_offset.py)."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from callbacks.robustness import RobustnessTest, embedding_logits
from evaluation.embedding_offset import embedding_noise, embedding_scale
from lightning_modules.evaluation import AttributionEvaluationModule
from methods import build_method
from methods.adapters import adapter_for
from methods.input_points import point_values
from tests.families.base import _token_batch
from tests.families.text import _tiny_bert
from tests.gloo import gloo_group, run_on_two_processes
from tests.tiny_clip_text import tiny_clip_text_classifier

torch.set_num_threads(1)
RUNS = 3


def _replaced(module, values):
    """The embedding's output replaced by ``values`` (the test's own hook, not the package's)."""
    return module.register_forward_hook(lambda _m, _i, out: values)


def _tiny_llama(folder):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models

    vocab = {"<pad>": 0, "<s>": 1, **{f"t{i}": i for i in range(2, 40)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="t2"))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>")
    config = transformers.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=None,
                                      id2label={0: "t5", 1: "t7", 2: "t9"}, label2id={"t5": 0, "t7": 1, "t9": 2})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).double().eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _module(kind, tmp_path, methods=("input_x_gradient",)):
    folder = tmp_path / kind
    if kind == "bert":
        _tiny_bert().save_pretrained(folder)
    else:
        _tiny_llama(folder)
    module = AttributionEvaluationModule(classifier=f"hf:{folder}", methods=list(methods))
    module.model.double()
    inputs = _token_batch(3, kind == "bert", True)
    batch = dict(inputs, label=torch.tensor([0, 1, 2]), index=torch.tensor([4, 9, 2]))
    return module, batch


def _run(module, batch, **options):
    with torch.enable_grad():
        outputs = module.test_step(dict(batch), 0)
    cb = RobustnessTest(infidelity_runs=RUNS, sensitivity_runs=RUNS, **options)
    cb.update(outputs, batch)
    return cb, outputs


@pytest.mark.parametrize("kind,normalize", [("bert", True), ("bert", False), ("llama", True)])
def test_text_matches_captum_infidelity_and_sensitivity_max(kind, normalize, tmp_path):
    captum_metrics = pytest.importorskip("captum.metrics")
    module, batch = _module(kind, tmp_path)
    cb, outputs = _run(module, batch, normalize=normalize, noise_std=0.1, radius=0.05)
    cb.compute()
    scores = cb.per_sample_scores()
    index, _ = scores["robustness/input_x_gradient/predicted/infidelity"]
    order = [int((index == i).nonzero()) for i in batch["index"].tolist()]     # sorted by index -> batch order
    ours_infid = scores["robustness/input_x_gradient/predicted/infidelity"][1].numpy()[order]
    ours_sens = scores["robustness/input_x_gradient/predicted/max_sensitivity"][1].numpy()[order]
    model, classifier = module.model, module.classifier
    embedding = adapter_for(model).rule_map.input_embedding()
    tensors = {k: v for k, v in classifier.model_inputs(batch).items()}
    real = batch["attention_mask"].bool()
    perturbable = real & ~batch["special_tokens_mask"].bool()
    with torch.no_grad():
        clean = embedding(batch["input_ids"]).detach()
    b, n, d = clean.shape
    # the relative scale by hand: mean norm over the content tokens / sqrt(D)
    by_hand = torch.stack([clean[i][perturbable[i]].norm(dim=-1).mean() / d ** 0.5 for i in range(b)])
    scales = embedding_scale(clean, perturbable)
    torch.testing.assert_close(scales, by_hand.double())
    ids = batch["index"].tolist()
    noise = embedding_noise(ids, perturbable, d, RUNS, 0, "infidelity", 0.1, scales)
    assert bool((noise[:, ~perturbable] == 0).all()) and bool((noise[:, perturbable] != 0).all())
    target = outputs["targets"]["predicted"]
    classes = classifier.method_targets(torch.arange(outputs["logits"].shape[-1]))

    def rows_for(x):
        times = x.shape[0] // b
        return {k: v.repeat_interleave(times, dim=0) for k, v in tensors.items()}

    def forward(x):
        handle = _replaced(embedding, x)
        try:
            if kind == "bert":
                return model(**{k: v for k, v in rows_for(x).items() if k != "special_tokens_mask"}).logits
            rows = rows_for(x)
            mask = rows["attention_mask"]
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=rows["input_ids"], attention_mask=mask, position_ids=positions).logits
            last = mask.sum(-1) - 1                      # right padding: each row's last real token
            return logits[torch.arange(len(last)), last][:, classes]
        finally:
            handle.remove()

    sample_major = noise.transpose(0, 1).reshape(-1, n, d)

    def perturb(x):
        return sample_major, x - sample_major

    rel = outputs["relevance"]["input_x_gradient"]["predicted"].detach()
    attributions = rel[..., None].expand(-1, -1, d)
    expected = captum_metrics.infidelity(forward, perturb, clean, attributions, target=target,
                                         n_perturb_samples=RUNS, normalize=normalize).numpy()
    # relative tolerances: the LM's infidelities are about 1e-6 themselves
    assert np.abs(ours_infid - expected).max() <= 1e-6 * np.abs(expected).max(), (ours_infid, expected)
    delta = embedding_noise(ids, perturbable, d, RUNS, 0, "sensitivity", 0.05, scales).transpose(0, 1)

    def shake(x, perturb_radius=None):
        return x + delta.reshape(-1, n, d)

    method = module.methods["input_x_gradient"]

    def explanation(x, target):
        x = x[0] if isinstance(x, tuple) else x
        rows = rows_for(x)
        handle = _replaced(embedding, x)
        try:
            with torch.enable_grad():
                maps = method(model, rows, target=classifier.method_targets(target)).detach()
        finally:
            handle.remove()
        return (maps * rows["attention_mask"],)

    expected = captum_metrics.sensitivity_max(explanation, clean, perturb_func=shake, n_perturb_samples=RUNS,
                                              target=target).numpy()
    assert np.abs(ours_sens - expected).max() <= 1e-6 * np.abs(expected).max(), (ours_sens, expected)
    assert expected.min() > 0 and np.ptp(ours_infid) > 0
    counts = cb.compute()
    assert counts["robustness/forwards"] == (RUNS + 1) * b and counts["robustness/reexplanations"] == RUNS * b


def test_text_batched_equals_alone_and_special_tokens_option(tmp_path):
    module, batch = _module("bert", tmp_path, methods=("input_x_gradient", "atman"))
    together, _ = _run(module, batch)
    together.compute()
    full = together.per_sample_scores()
    for i in range(3):
        length = int(batch["attention_mask"][i].sum())
        alone = {k: v[i:i + 1, :length] if v.dim() == 2 else v[i:i + 1] for k, v in batch.items()}
        cb, _ = _run(module, alone)
        cb.compute()
        for key, (_index, values) in cb.per_sample_scores().items():
            row = int((full[key][0] == int(batch["index"][i])).nonzero())
            assert abs(float(values[0]) - float(full[key][1][row])) <= 1e-9 * max(1.0, abs(float(values[0]))), key
    special, _ = _run(module, batch, perturb_special_tokens=True)
    assert special.conventions()["perturb_special_tokens"] is True
    a, b = special.compute(), together.compute()
    assert a["robustness/atman/predicted/max_sensitivity"] != b["robustness/atman/predicted/max_sensitivity"]
    with pytest.raises(ValueError, match="embedding_scale"):
        RobustnessTest(embedding_scale="pixels")


def _text_batches(module, n=4):
    """``n`` padded batches of 3 texts (content ids shifted per batch) with the module's outputs."""
    out = []
    for k in range(n):
        inputs = _token_batch(3, True, True)
        content = inputs["special_tokens_mask"] == 0
        inputs["input_ids"] = torch.where(content, (inputs["input_ids"] + 5 * k - 3) % 37 + 3, inputs["input_ids"])
        batch = dict(inputs, label=torch.tensor([0, 1, 2]), index=torch.arange(3 * k, 3 * k + 3) + 20)
        with torch.enable_grad():
            out.append((module.test_step(dict(batch), 0), batch))
    return out


def _robustness(batches):
    cb = RobustnessTest(infidelity_runs=2, sensitivity_runs=2, class_settings=["predicted", "target"])
    for outputs, batch in batches:
        cb.update(outputs, batch)
    return cb


def test_text_resumed_from_a_progress_state_equals_one_run(tmp_path):
    module, _ = _module("bert", tmp_path, methods=("input_x_gradient", "rollout"))
    module.add_class_settings(["target"])
    batches = _text_batches(module)
    one = _robustness(batches).compute()
    assert one["robustness/reexplanations"] == 2 * 12 * 2 + 2 * 12       # rollout: class-agnostic, once
    saved = io.BytesIO()
    torch.save(_robustness(batches[:2]).progress_state(), saved)
    saved.seek(0)
    resumed = RobustnessTest(infidelity_runs=2, sensitivity_runs=2, class_settings=["predicted", "target"])
    resumed.build_from_progress(torch.load(saved, weights_only=True))
    for outputs, batch in batches[2:]:
        resumed.update(outputs, batch)
    again = resumed.compute()
    assert again.keys() == one.keys() and all(np.array_equal(again[k], one[k]) for k in one)


def _gloo_worker(rank: int, world: int, port: int, folder: str, path: str) -> None:
    torch.set_num_threads(1)
    with gloo_group(rank, world, port):
        module = AttributionEvaluationModule(classifier=f"hf:{folder}", methods=["input_x_gradient", "rollout"])
        module.model.double()
        module.add_class_settings(["target"])
        results = _robustness(_text_batches(module)[rank::world]).compute()
        if rank == 0:
            with open(path, "w") as f:
                json.dump(results, f)


@pytest.mark.slow
def test_text_two_gloo_processes_equal_one_process(tmp_path):
    module, _ = _module("bert", tmp_path, methods=("input_x_gradient", "rollout"))
    module.add_class_settings(["target"])
    one = _robustness(_text_batches(module)).compute()
    run_on_two_processes(_gloo_worker, str(tmp_path / "bert"), str(tmp_path / "two.json"), base_port=29700)
    two = json.loads((tmp_path / "two.json").read_text())
    assert two.keys() == one.keys() and len(one) > 6
    assert all(np.array_equal(two[k], one[k]) for k in one), {k: (one[k], two[k]) for k in one}


def test_clip_text_tower_through_the_prompt_scorer():
    """CLIP's text tower (a tiny random CLIP's PromptScorer, texts -> fixed images as classes): the forward from the
    embedding gives the text classifier's logits exactly at zero noise, and both metrics run with their counts."""
    scorer, classifier, batch = tiny_clip_text_classifier()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    logits = classifier.logits({"input_ids": ids, "attention_mask": mask})
    adapter, method = adapter_for(scorer), build_method("input_x_gradient")
    inputs = classifier.model_inputs(batch)
    prepared = adapter.inputs.prepare(inputs)
    clean = point_values(adapter, prepared, "embedding")
    assert torch.equal(embedding_logits(adapter, classifier, prepared, clean, 7, 3), logits)

    def explain(name, inputs, target, sample_ids, embedding_offset=None):
        return method(scorer, inputs, target=target, embedding_offset=embedding_offset).detach()

    pred = logits.argmax(-1)
    outputs = {"relevance": {"ixg": {"predicted": method(scorer, inputs, target=pred).detach()}},
               "targets": {"predicted": pred}, "logits": logits, "classifier": classifier, "explain": explain,
               "model": scorer, "class_specific": {"ixg": True}}
    cb = RobustnessTest(infidelity_runs=3, sensitivity_runs=2)
    cb.update(outputs, batch)
    res = cb.compute()
    assert res["robustness/forwards"] == 4 * 2 and res["robustness/reexplanations"] == 2 * 2
    assert res["robustness/ixg/predicted/max_sensitivity"] > 0 and res["robustness/ixg/predicted/infidelity"] > 0
