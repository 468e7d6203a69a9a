"""Text evaluation: the token perturber's removal conventions, the text classifier's chunked forwards, the
evaluation module on text batches and evaluate.py end to end on a tiny BERT over Movie Reviews documents."""
import json
import math
from pathlib import Path

import pytest
import torch
from shared_resources import MOVIES, SHARED_DATA, minilm_folder

from datamodules.text_common import TextDocument, TokenizedTextDataset, collate_text, evenly_spaced
from evaluation.classifier import TextClassifier, model_logits
from evaluation.perturbation import perturbation_correctness
from evaluation.perturbers import TokenPerturber, build_perturber
from evaluation.ranking import removal_counts, removal_masks, removal_ranks
from models.sources import load_tokenizer

torch.set_num_threads(1)
DATA = SHARED_DATA
#: evaluation callbacks of the rationale test added to the 1-vs-2-process run
RATIONALE_CALLBACKS = ({"class_path": "callbacks.rationale.RationaleTest",
                        "init_args": {"class_settings": ["target", "predicted"], "ks": [5, 10, 20]}},)


@pytest.fixture(scope="module")
def tokenizer_path():
    return str(minilm_folder())


@pytest.fixture(scope="module")
def tokenizer(tokenizer_path):
    return load_tokenizer(tokenizer_path)


def save_tiny_bert(folder, tokenizer, num_labels=2):
    """A random 2-layer BERT classifier saved with the MiniLM tokenizer (save_pretrained layout)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, num_labels=num_labels)
    BertForSequenceClassification(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory, tokenizer):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), tokenizer)


@pytest.fixture(scope="module")
def tiny_bert(tiny_bert_dir):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(tiny_bert_dir, local_files_only=True).eval()


@pytest.fixture(scope="module")
def batch(tokenizer):
    docs = [TextDocument(words="a truly wonderful film".split(), label=1, docid="a"),
            TextDocument(words="bad".split(), label=0, docid="b"),
            TextDocument(words="the plot was dull and the acting worse , sadly".split(), label=0, docid="c")]
    dataset = TokenizedTextDataset(docs, tokenizer, max_length=32)
    return collate_text([dataset[i] for i in range(3)], tokenizer.pad_token_id)


def classifier_for(model, tokenizer, batch_size=2):
    return TextClassifier(model, tokenizer.pad_token_id, tokenizer.mask_token_id, batch_size)


# ----------------------------------------------------------------------------------------------- perturber
def test_pad_removal_sets_pad_and_mask_zero_and_keeps_special_tokens(batch, tokenizer, tiny_bert):
    perturber = build_perturber("pad")
    real, special = batch["attention_mask"].bool(), batch["special_tokens_mask"].bool() & batch["attention_mask"].bool()
    removed = torch.ones((1,) + batch["input_ids"].shape, dtype=torch.bool)   # ask for everything
    out = perturber.perturb(batch, removed, classifier_for(tiny_bert, tokenizer))
    gone = real & ~special
    assert torch.equal(out["attention_mask"].bool(), special)                 # only [CLS]/[SEP] stay
    assert (out["input_ids"][gone] == tokenizer.pad_token_id).all()
    assert torch.equal(out["input_ids"][special], batch["input_ids"][special])
    assert torch.equal(perturber.num_units(batch), gone.sum(dim=1))


def test_special_tokens_removable_on_request(batch, tokenizer, tiny_bert):
    perturber = TokenPerturber("pad", remove_special_tokens=True)
    assert torch.equal(perturber.num_units(batch), batch["attention_mask"].sum(dim=1))
    removed = torch.ones((1,) + batch["input_ids"].shape, dtype=torch.bool)
    out = perturber.perturb(batch, removed, classifier_for(tiny_bert, tokenizer))
    assert not out["attention_mask"].any()


def test_mask_removal_uses_mask_token_and_keeps_attention(batch, tokenizer, tiny_bert):
    perturber = build_perturber("mask")
    removed = torch.zeros((1,) + batch["input_ids"].shape, dtype=torch.bool)
    removed[0, 0, 2] = True
    out = perturber.perturb(batch, removed, classifier_for(tiny_bert, tokenizer))
    assert out["input_ids"][0, 2] == tokenizer.mask_token_id
    assert torch.equal(out["attention_mask"], batch["attention_mask"])
    no_mask = TextClassifier(tiny_bert, tokenizer.pad_token_id, None)
    with pytest.raises(ValueError, match="MASK"):
        perturber.perturb(batch, removed, no_mask)
    with pytest.raises(ValueError, match="padded"):
        TokenPerturber("mask", fraction_of="padded")


def test_delete_removal_equals_the_shortened_text_alone(batch, tokenizer, tiny_bert):
    """Deleting tokens gives the logits of the sequence written without them."""
    perturber = build_perturber("delete")
    clf = classifier_for(tiny_bert, tokenizer)
    removed = torch.zeros((1,) + batch["input_ids"].shape, dtype=torch.bool)
    removed[0, 2, [2, 4, 5]] = True                         # three words of the third document
    out = perturber.perturb(batch, removed, clf)
    got = clf.logits(out)[2]
    ids = batch["input_ids"][2][batch["attention_mask"][2].bool()]
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[[2, 4, 5]] = False
    alone = tiny_bert(input_ids=ids[keep][None]).logits[0]
    torch.testing.assert_close(got, alone, atol=1e-5, rtol=1e-5)
    assert int(out["attention_mask"][2].sum()) == int(batch["attention_mask"][2].sum()) - 3


def test_collate_pads_to_a_fixed_length(tokenizer):
    docs = [TextDocument(words="one two".split(), label=0, docid="x")]
    dataset = TokenizedTextDataset(docs, tokenizer, max_length=16)
    batch = collate_text([dataset[0]], tokenizer.pad_token_id, pad_to=16)
    assert batch["input_ids"].shape == (1, 16) and int(batch["attention_mask"].sum()) == 4
    with pytest.raises(ValueError, match="cannot pad to 3"):
        collate_text([dataset[0]], tokenizer.pad_token_id, pad_to=3)


def test_padded_fraction_counts_the_padded_length(batch):
    perturber = TokenPerturber("pad", fraction_of="padded")
    n = batch["input_ids"].shape[1]
    assert perturber.num_units(batch) == n
    removable = perturber.removable(batch)
    assert removable[1, -1] and not removable[1, 0]         # padding takes part, [CLS] does not


def test_tie_order_does_not_depend_on_padding(tokenizer):
    """The random tie-breaking map of a sample is a function of its id and positions, not of the batch."""
    perturber = build_perturber("pad")
    docs = [TextDocument(words="one two three".split(), label=0, docid="x"),
            TextDocument(words=("long " * 20).split(), label=1, docid="y")]
    dataset = TokenizedTextDataset(docs, tokenizer, max_length=32)
    alone = collate_text([dataset[0]], tokenizer.pad_token_id)
    padded = collate_text([dataset[0], dataset[1]], tokenizer.pad_token_id)
    ids = torch.tensor([7])
    a = perturber.tie_scores(ids, alone, None, seed=0)[0]
    b = perturber.tie_scores(torch.tensor([7, 8]), padded, None, seed=0)[0, : a.shape[0]]
    assert torch.equal(a, b)


def test_scores_are_clamped_and_shape_checked(batch):
    perturber = build_perturber("pad")
    scores = torch.randn(batch["input_ids"].shape)
    assert (perturber.unit_scores(scores, batch) >= 0).all()
    assert torch.equal(TokenPerturber("pad", clamp=False).unit_scores(scores, batch), scores.double())
    with pytest.raises(ValueError, match="token scores"):
        perturber.unit_scores(scores[:, :-1], batch)


def test_unknown_masking_and_option_are_named():
    with pytest.raises(ValueError, match="unknown masking"):
        build_perturber("blank")
    with pytest.raises(TypeError, match="fraction"):
        build_perturber("chefer", fraction_of="real")


def test_perturbation_curve_removes_int_p_n_of_each_sample(batch, tokenizer, tiny_bert):
    """Step p removes int(p * n) of each sample's real non-special tokens, the top-scored ones first."""
    perturber = build_perturber("pad")
    clf = classifier_for(tiny_bert, tokenizer)
    scores = torch.arange(batch["input_ids"].numel(), dtype=torch.float64).reshape(batch["input_ids"].shape)
    fractions = [0.5, 1.0]
    ranks = removal_ranks(scores, None, perturber.removable(batch))
    removed = removal_masks(ranks, removal_counts(fractions, perturber.num_units(batch))) & perturber.removable(batch)
    n = perturber.num_units(batch)
    assert torch.equal(removed[0].sum(dim=1), (0.5 * n).long())
    assert torch.equal(removed[1].sum(dim=1), n)
    for b in range(3):  # the highest scores (the last real positions) go first
        real = perturber.removable(batch)[b].nonzero().flatten()
        assert removed[0, b, real[-1]] and not removed[0, b, real[0]] or n[b] < 2
    labels = batch["label"]
    clean = clf.predict(batch) == labels
    correct = perturbation_correctness(perturber, batch, scores.float(), labels, clean, fractions, "positive", clf)
    assert correct.shape == (3, 3)


# ----------------------------------------------------------------------------------------------- classifier
def test_text_classifier_chunks_equal_one_forward(batch, tokenizer, tiny_bert):
    clf = classifier_for(tiny_bert, tokenizer, batch_size=1)
    full = model_logits(tiny_bert, batch)
    torch.testing.assert_close(clf.logits(batch), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(clf.probabilities(batch).sum(dim=1), torch.ones(3, dtype=torch.float64))
    assert torch.equal(clf.predict(batch, batch_size=3), full.argmax(dim=1))


def test_evenly_spaced_subset_covers_both_ends():
    assert evenly_spaced(199, 5) == [0, 50, 99, 148, 198]
    assert evenly_spaced(3, 10) == [0, 1, 2]
    assert evenly_spaced(10, 1) == [0]


# ----------------------------------------------------------------------------------------------- module
def test_module_explains_text_batches_with_padding_zero(tiny_bert_dir, batch):
    from lightning_modules.evaluation import AttributionEvaluationModule

    module = AttributionEvaluationModule(classifier=f"hf:{tiny_bert_dir}", methods=["gradcam", "random"],
                                         class_settings=["target", "predicted"])
    assert module.data_config()["tokenizer"] == str(tiny_bert_dir)
    assert isinstance(module.classifier, TextClassifier)
    out = module.test_step(batch, 0)
    rel = out["relevance"]["gradcam"]["target"]
    assert rel.shape == batch["input_ids"].shape
    assert (rel[batch["attention_mask"] == 0] == 0).all()
    assert torch.equal(out["targets"]["target"], batch["label"])
    bad = dict(batch, label=torch.tensor([0, 5, 1]))
    with pytest.raises(ValueError, match="outside the classifier's 2 classes"):
        module.test_step(bad, 0)


def test_settings_with_equal_targets_reuse_the_map(tiny_bert_dir, batch):
    """``predicted`` and ``target``: samples whose two targets agree are explained once, the others again as a
    smaller batch; every map equals the method's own call for that setting."""
    from lightning_modules.evaluation import AttributionEvaluationModule
    from methods import build_method

    module = AttributionEvaluationModule(classifier=f"hf:{tiny_bert_dir}", methods=["transformer_attribution"],
                                         class_settings=["target", "predicted"])
    with torch.no_grad():
        predicted = module.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.argmax(-1)
    inputs = module.model_inputs(batch)
    method = build_method("transformer_attribution")
    for labels in (predicted, 1 - predicted, torch.stack([predicted[0], 1 - predicted[1], predicted[2]])):
        sizes = []
        inner = module.methods["transformer_attribution"]
        module.methods["transformer_attribution"] = (
            lambda model, x, target=None, sample_ids=None, sizes=sizes, inner=inner:
            sizes.append(len(target)) or inner(model, x, target=target, sample_ids=sample_ids))
        module.methods["transformer_attribution"].class_specific = True
        out = module.test_step(dict(batch, label=labels), 0)
        module.methods["transformer_attribution"] = inner
        differ = int((labels != predicted).sum())
        assert sizes == [3] + ([differ] if differ else [])
        for setting, target in (("target", labels), ("predicted", predicted)):
            expected = method(module.model, inputs, target=target)
            torch.testing.assert_close(out["relevance"]["transformer_attribution"][setting], expected,
                                       atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------------------------- end to end
def test_evaluate_movie_reviews_end_to_end(tiny_bert_dir, tmp_path, monkeypatch):
    """evaluate.py on a tiny BERT and 6 Movie Reviews test documents: the model's tokenizer reaches the
    datamodule, the perturbation test runs with [PAD] removal, heatmaps are written and escaped."""
    if not MOVIES.is_file():
        pytest.skip(f"{MOVIES} not found")
    import evaluate

    monkeypatch.setenv("TOKEN_ATTRIBUTIONS_CACHE", str(tmp_path / "cache"))
    config = tmp_path / "mr.yaml"
    config.write_text(json.dumps({
        "base": str(Path(evaluate.__file__).parent / "configs" / "base" / "evaluate.yaml"),
        "trainer": {"logger": False, "callbacks": [
            {"class_path": "callbacks.perturbation.PerturbationTest",
             "init_args": {"class_settings": ["target"], "masking": "pad", "fractions": [0.1, 0.5]}},
            {"class_path": "callbacks.text_heatmaps.TextHeatmaps", "init_args": {"num_examples": 2,
                                                                                "max_words": 40}}]},
        "model": {"classifier": f"hf:{tiny_bert_dir}", "methods": ["gradcam", "random"]},
        "data": {"class_path": "datamodules.movie_reviews.MovieReviewsDataModule",
                 "init_args": {"path": str(MOVIES), "max_length": 64, "eval_subset": 5, "batch_size": 2}},
    }))
    results = evaluate.main(["--config", str(config), "--output_dir", str(tmp_path / "run")])
    assert set(results) >= {"perturbation/gradcam/positive/target/auc", "perturbation/random/negative/target/auc",
                            "accuracy"}
    curve = results["perturbation/gradcam/positive/target/curve"]
    assert len(curve) == 3 and curve[0] == results["accuracy"]
    html = (tmp_path / "run" / "text_heatmaps.html").read_text(encoding="utf-8")
    assert html.count('class="ta-example"') == 2 and "gradcam" in html


# ----------------------------------------------------------------------------------------------- ERASER faithfulness
def test_eraser_faithfulness_matches_a_direct_computation(batch, tokenizer, tiny_bert):
    """comprehensiveness@q = p(y|x) - p(y|x without the top int(q*n) tokens), sufficiency@q = p(y|x) - p(y|top
    tokens alone), computed here by writing the shortened texts out and classifying each alone."""
    from callbacks.faithfulness import ERASERFaithfulnessTest

    clf = classifier_for(tiny_bert, tokenizer)
    torch.manual_seed(1)
    scores = torch.rand(batch["input_ids"].shape) * batch["attention_mask"]
    with torch.no_grad():
        logits = model_logits(tiny_bert, batch)
    targets = logits.argmax(dim=1)
    test = ERASERFaithfulnessTest(bins=[0.2, 0.5], ties="index")
    outputs = {"relevance": {"m": {"predicted": scores}}, "targets": {"predicted": targets}, "logits": logits,
               "classifier": clf, "layout": None}
    test.update(outputs, batch)
    results = test.compute()
    comp, suff = torch.zeros(2), torch.zeros(2)
    for b in range(3):
        real = (batch["attention_mask"][b].bool() & ~batch["special_tokens_mask"][b].bool()).nonzero().flatten()
        ids = batch["input_ids"][b]
        n = len(real)
        order = real[torch.sort(scores[b, real], descending=True, stable=True).indices]
        p = torch.softmax(logits[b].double(), 0)[targets[b]]
        for j, q in enumerate([0.2, 0.5]):
            top = set(order[: int(q * n)].tolist())
            length = int(batch["attention_mask"][b].sum())
            without = [int(ids[i]) for i in range(length) if i not in top]
            alone = [int(ids[i]) for i in range(length) if i in top or i not in set(real.tolist())]
            for kept, acc in ((without, comp), (alone, suff)):
                with torch.no_grad():
                    probs = torch.softmax(tiny_bert(input_ids=torch.tensor([kept])).logits[0].double(), 0)
                acc[j] += float(p - probs[targets[b]]) / 3
    for j, q in enumerate([0.2, 0.5]):
        assert results[f"eraser/m/predicted/comprehensiveness@{q:g}"] == pytest.approx(float(comp[j]), abs=1e-5)
        assert results[f"eraser/m/predicted/sufficiency@{q:g}"] == pytest.approx(float(suff[j]), abs=1e-5)
    assert results["eraser/m/predicted/aopc_comprehensiveness"] == pytest.approx(float(comp.mean()), abs=1e-5)
    declared = test.higher_is_better()
    assert declared["eraser/m/predicted/aopc_comprehensiveness"] is True
    assert declared["eraser/m/predicted/aopc_sufficiency"] is False


# ----------------------------------------------------------------------------------------------- 1 vs 2 processes
def text_config(path, tiny_bert_dir, extra_callbacks=()):
    callbacks = [
        {"class_path": "callbacks.perturbation.PerturbationTest",
         "init_args": {"class_settings": ["target", "predicted"], "masking": "pad", "fractions": [0.2, 0.5]}},
        {"class_path": "callbacks.faithfulness.ERASERFaithfulnessTest",
         "init_args": {"class_settings": ["predicted"], "bins": [0.1, 0.5]}},
        *extra_callbacks,
    ]
    path.write_text(json.dumps({
        "base": str(Path(__file__).resolve().parent.parent / "configs" / "base" / "evaluate.yaml"),
        "trainer": {"logger": False, "callbacks": callbacks},
        "model": {"classifier": f"hf:{tiny_bert_dir}", "methods": ["gradcam", "random", "transformer_attribution"]},
        "data": {"class_path": "datamodules.movie_reviews.MovieReviewsDataModule",
                 "init_args": {"path": str(MOVIES), "max_length": 48, "eval_subset": 5, "batch_size": 2}},
    }))
    return path


def test_text_metrics_on_two_processes_match_one_process(tiny_bert_dir, tmp_path):
    """5 documents (uneven over 2 processes, batches padded differently): every metric equal within 1e-6."""
    if not MOVIES.is_file():
        pytest.skip(f"{MOVIES} not found")
    from tests.test_evaluate import assert_same_metrics, metrics_on_one_and_two_processes

    config = text_config(tmp_path / "text.yaml", tiny_bert_dir, RATIONALE_CALLBACKS)
    one, two = metrics_on_one_and_two_processes(["--config", str(config), "--trainer.default_root_dir",
                                                 str(tmp_path)], tmp_path)
    runs = {1: one, 2: two}
    assert any(k.startswith("eraser/") for k in runs[1]) and any(k.startswith("perturbation/") for k in runs[1])
    assert "rationale/gradcam/target/token_f1@10" in runs[1]
    from comparison.directions import declared_directions

    declared = declared_directions(runs[1])   # what compare.py marks as best, as the callbacks declare it
    assert declared["rationale/gradcam/target/token_f1@10"] is True
    assert declared["eraser/gradcam/predicted/aopc_sufficiency"] is False
    assert declared["perturbation/gradcam/positive/target/auc"] is False
    assert_same_metrics(one, two)


@pytest.mark.parametrize("dataset", ["newsgroups", "sst2"])
def test_newsgroups_and_sst2_end_to_end(dataset, tokenizer, tmp_path, monkeypatch):
    """evaluate.py on a few documents of the real 20 Newsgroups release (20 classes, BI's seeded test subset)
    and of SST-2's validation parquet, with the perturbation test in BI's padded-length convention for 20NG."""
    data = {"newsgroups": DATA / "20newsgroups" / "20news-19997.tar.gz", "sst2": DATA / "sst2" / "SST-2-val.parquet"}
    if not data[dataset].is_file():
        pytest.skip(f"{data[dataset]} not found")
    import evaluate

    monkeypatch.setenv("TOKEN_ATTRIBUTIONS_CACHE", str(tmp_path / "cache"))
    num_labels = 20 if dataset == "newsgroups" else 2
    model_dir = save_tiny_bert(tmp_path / "bert", tokenizer, num_labels)
    if dataset == "newsgroups":
        data_cfg = {"class_path": "datamodules.newsgroups.TwentyNewsgroupsDataModule",
                    "init_args": {"path": str(data[dataset]), "test_subset": 3, "max_length": 64, "batch_size": 2,
                                  "pad_to_max_length": True}}
        options = {"fraction_of": "padded"}
    else:
        data_cfg = {"class_path": "datamodules.sst2.SST2DataModule",
                    "init_args": {"path": str(data[dataset]), "eval_subset": 3, "max_length": 64, "batch_size": 2}}
        options = {}
    config = tmp_path / "cfg.yaml"
    config.write_text(json.dumps({
        "base": str(Path(evaluate.__file__).parent / "configs" / "base" / "evaluate.yaml"),
        "trainer": {"logger": False, "callbacks": [
            {"class_path": "callbacks.perturbation.PerturbationTest",
             "init_args": {"class_settings": ["target"], "masking": "pad", "masking_options": options,
                           "fractions": [0.3, 0.6]}}]},
        "model": {"classifier": f"hf:{model_dir}", "methods": ["rollout", "random"]},
        "data": data_cfg,
    }))
    results = evaluate.main(["--config", str(config), "--output_dir", str(tmp_path / "run")])
    curve = results["perturbation/rollout/positive/target/curve"]
    assert len(curve) == 3 and curve[0] == pytest.approx(results["accuracy"])
    assert math.isclose(results["accuracy"] * 3, round(results["accuracy"] * 3), abs_tol=1e-9)
