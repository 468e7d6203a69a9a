"""Prompted classification with a decoder LM on real text: a template with a ``{text}`` slot around each document
(``datamodules/prompts.py``), the LM read as a classifier over its verbalizer tokens
(``AnswerTokenClassifier.from_verbalizer``), and evaluate.py end to end on Movie Reviews and SST-2 with a tiny
random ``LlamaForCausalLM`` and a byte-level BPE tokenizer trained offline in the test."""
import json
from pathlib import Path

import pytest
import torch
import yaml
from shared_resources import MOVIES, SHARED_DATA

from datamodules.prompts import PromptTemplate, encode_prompt
from datamodules.text_common import TextDocument, TokenizedTextDataset, collate_text
from evaluation.classifier import AnswerTokenClassifier, classifier_for
from evaluation.words import document_word_scores

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = "Review: {text}\nSentiment:"
VERBALIZER = {"NEG": " negative", "POS": " positive"}
CORPUS = ["the film is a wonderful and moving story , the acting is superb",
          "a dull , tedious mess ; the plot makes no sense and the jokes fall flat",
          "it was neither good nor bad , just a movie with some nice moments"]
DOCS = [TextDocument(words="a truly wonderful film".split(), label=1, docid="a"),
        TextDocument(words="bad".split(), label=0, docid="b"),
        TextDocument(words="the plot was dull and the acting unbelievably worse , sadly".split(), label=0, docid="c")]


def byte_level_tokenizer():
    """A GPT-2-style byte-level BPE (the space before a word inside its first token) with a BOS added to every
    text, as Llama's tokenizers do; trained offline on a few sentences and the prompt's words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(CORPUS * 5 + ["Review: x\nSentiment: negative", "Review: y\nSentiment: positive"] * 20,
                             trainer)
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", pad_token="<pad>")


@pytest.fixture(scope="module")
def tokenizer():
    return byte_level_tokenizer()


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory, tokenizer):
    """A tiny random LlamaForCausalLM saved with the tokenizer (save_pretrained layout)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id, eos_token_id=None)
    folder = tmp_path_factory.mktemp("tiny_llama")
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def lm(lm_dir):
    from models.sources import load_model

    return load_model(f"hf:{lm_dir}")


# ----------------------------------------------------------------------------------------------- tokens
def test_prompt_is_tokenized_as_one_string_with_word_alignment(tokenizer):
    template = PromptTemplate(TEMPLATE)
    words = DOCS[2].words
    enc = encode_prompt(tokenizer, template, words, max_length=128)
    prompt = "Review: " + " ".join(words) + "\nSentiment:"
    assert enc["input_ids"] == tokenizer(prompt)["input_ids"] and enc["num_kept_words"] == len(words)
    tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"])
    assert tokens[0] == "<s>" and enc["special_tokens_mask"][0] == 1 and enc["template_mask"][0] == 0
    template_ids = [i for i, t in zip(enc["input_ids"], enc["template_mask"]) if t]
    assert tokenizer.decode(template_ids) == "Review:\nSentiment:" and enc["template_mask"][-1] == 1
    for position, template_token in enumerate(enc["template_mask"]):
        if template_token:   # special, without a word
            assert enc["special_tokens_mask"][position] == 1 and enc["word_ids"][position] == -1
    for w, word in enumerate(words):   # each word's tokens are its text with the space before it
        ids = [i for i, o in zip(enc["input_ids"], enc["word_ids"]) if o == w]
        assert tokenizer.decode(ids) == " " + word
    assert len(tokenizer.tokenize(" unbelievably")) > 1   # a word of several tokens is among them


def test_truncation_keeps_whole_words_and_the_answer_cue(tokenizer):
    template = PromptTemplate(TEMPLATE)
    words = DOCS[2].words
    full = encode_prompt(tokenizer, template, words, max_length=128)
    cue = full["input_ids"][-3:]
    for max_length in (12, 16, 20):
        enc = encode_prompt(tokenizer, template, words, max_length=max_length)
        kept = enc["num_kept_words"]
        assert 0 < kept < len(words) and len(enc["input_ids"]) <= max_length
        assert enc["input_ids"] == tokenizer("Review: " + " ".join(words[:kept]) + "\nSentiment:")["input_ids"]
        assert enc["input_ids"][-3:] == cue and sum(enc["template_mask"]) == sum(full["template_mask"])
        longer = encode_prompt(tokenizer, template, words[:kept + 1], max_length=1000)
        assert len(longer["input_ids"]) > max_length   # the next whole word would not fit
    dataset = TokenizedTextDataset(DOCS, tokenizer, max_length=14, prompt=TEMPLATE)
    kept = [encode_prompt(tokenizer, template, doc.words, 14)["num_kept_words"] for doc in DOCS]
    assert kept[1] == 1 and kept[2] < len(words)
    assert dataset.coverage().tolist() == [k / len(doc.words) for k, doc in zip(kept, DOCS)]
    assert [len(dataset[i]["input_ids"]) <= 14 for i in range(3)] == [True] * 3
    with pytest.raises(ValueError, match="max_length must leave room"):
        TokenizedTextDataset(DOCS, tokenizer, max_length=6, prompt=TEMPLATE)
    with pytest.raises(ValueError, match="first word"):
        encode_prompt(tokenizer, template, ["unbelievably"], max_length=8)


def test_malformed_templates_and_options_are_named(tokenizer):
    for bad, match in (("Review: {text} and {text}:", "exactly once"), ("Review:", "exactly once"),
                       ("Review: {text}\n ", "no answer cue")):
        with pytest.raises(ValueError, match=match):
            PromptTemplate(bad)
    with pytest.raises(ValueError, match="sliding windows"):
        TokenizedTextDataset(DOCS, tokenizer, max_length=32, stride=8, prompt=TEMPLATE)
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({"<unk>": 0, "Review:": 1, "Sentiment:": 2}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words_only = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>")
    with pytest.raises(ValueError, match="separate \\{text\\}"):   # 'Review:great' is one token
        encode_prompt(words_only, PromptTemplate("Review:{text} Sentiment:"), ["great"], 16)
    assert encode_prompt(words_only, PromptTemplate(TEMPLATE), ["great"], 16)["word_ids"] == [-1, 0, -1]
    with pytest.raises(ValueError, match="padding_side"):
        collate_text([TokenizedTextDataset(DOCS, tokenizer, prompt=TEMPLATE)[0]], padding_side="middle")


def test_left_and_right_padded_batches_hold_the_same_rows(tokenizer):
    dataset = TokenizedTextDataset(DOCS, tokenizer, max_length=64, prompt=TEMPLATE)
    items = [dataset[i] for i in range(3)]
    right = collate_text(items, tokenizer.pad_token_id)
    left = collate_text(items, tokenizer.pad_token_id, padding_side="left")
    for i, item in enumerate(items):
        n = len(item["input_ids"])
        for key in ("input_ids", "attention_mask", "special_tokens_mask", "template_mask", "word_ids"):
            assert right[key][i, :n].tolist() == item[key] == left[key][i, -n:].tolist()
        assert left["attention_mask"][i, :-n].sum() == 0 and left["template_mask"][i, :-n].sum() == 0


# ----------------------------------------------------------------------------------------------- classifier
def test_verbalizer_classifier_reads_the_cue_on_either_padding_side(lm, tokenizer):
    clf = classifier_for(lm, 2, verbalizer=VERBALIZER)
    assert isinstance(clf, AnswerTokenClassifier) and clf.class_names() == ["NEG", "POS"]
    assert clf.answer_tokens() == ["Ġnegative", "Ġpositive"]
    assert clf.method_targets(torch.tensor([1, 0])).tolist() == [tokenizer.convert_tokens_to_ids("Ġpositive"),
                                                                 tokenizer.convert_tokens_to_ids("Ġnegative")]
    dataset = TokenizedTextDataset(DOCS, tokenizer, max_length=64, prompt=TEMPLATE)
    items = [dataset[i] for i in range(3)]
    expected = []
    with torch.no_grad():
        for item in items:   # the model's own next-token logits after the whole prompt, alone
            logits = lm(input_ids=torch.tensor([item["input_ids"]])).logits[0, -1]
            expected.append(logits[clf.answer_ids])
    expected = torch.stack(expected)
    for side in ("right", "left"):
        batch = collate_text(items, tokenizer.pad_token_id, padding_side=side)
        torch.testing.assert_close(clf.logits(clf.model_inputs(batch)), expected, atol=1e-5, rtol=1e-5)
    holed = collate_text(items, tokenizer.pad_token_id, padding_side="left")   # token 3 of row 2 removed by [PAD]
    holed["attention_mask"][2, -len(items[2]["input_ids"]) + 3] = 0
    deleted = {"input_ids": torch.tensor([items[2]["input_ids"][:3] + items[2]["input_ids"][4:]])}
    torch.testing.assert_close(clf.logits(holed)[2], clf.logits(deleted)[0], atol=1e-5, rtol=1e-5)
    batch = collate_text(items, tokenizer.pad_token_id)
    batch["template_mask"][1, int(batch["attention_mask"][1].sum()) - 1] = 0
    batch["index"] = torch.tensor([7, 8, 9])
    with pytest.raises(ValueError, match=r"samples \[8\].*answer cue"):
        clf.model_inputs(batch)


def test_verbalizer_words_of_several_tokens(lm, tokenizer):
    several = {"NEG": " negative", "POS": " unbelievably"}
    with pytest.raises(ValueError, match="unbelievably.*tokens.*verbalizer_multi_token first"):
        classifier_for(lm, verbalizer=several)
    clf = classifier_for(lm, verbalizer=several, verbalizer_multi_token="first")
    assert clf.answer_ids[1] == tokenizer(" unbelievably", add_special_tokens=False)["input_ids"][0]
    with pytest.raises(ValueError, match="same token"):
        classifier_for(lm, verbalizer={"NEG": " unbelievably", "POS": " unbelievable"}, verbalizer_multi_token="first")
    with pytest.raises(ValueError, match="error.*first"):
        classifier_for(lm, verbalizer=VERBALIZER, verbalizer_multi_token="last")
    with pytest.raises(ValueError, match="verbalizer"):
        classifier_for(lm)   # a random LM's config names no answer tokens
    from transformers import LlamaForSequenceClassification

    with pytest.raises(ValueError, match="leave model.verbalizer unset"):
        classifier_for(LlamaForSequenceClassification(lm.config).eval(), verbalizer=VERBALIZER)


def test_module_maps_are_the_same_batched_alone_and_on_either_side(lm_dir, tokenizer):
    """test_step on a left-padded batch, a right-padded one and each prompt alone: the same logits and token
    maps; template positions reach no word score and are never removable."""
    from evaluation.perturbers import TokenPerturber
    from lightning_modules.evaluation import AttributionEvaluationModule

    module = AttributionEvaluationModule(f"hf:{lm_dir}", methods=["attnlrp", "gradcam", "token_ablation"],
                                         class_settings=("target", "predicted"), verbalizer=VERBALIZER,
                                         forward_batch_size=8)
    dataset = TokenizedTextDataset(DOCS, tokenizer, max_length=64, prompt=TEMPLATE)
    items = [dataset[i] for i in range(3)]
    lengths = [len(item["input_ids"]) for item in items]
    runs = {side: module.test_step(collate_text(items, tokenizer.pad_token_id, padding_side=side), 0)
            for side in ("left", "right")}
    alone = [module.test_step(collate_text([item], tokenizer.pad_token_id), 0) for item in items]
    width = max(lengths)
    for i, n in enumerate(lengths):
        columns = {"right": slice(0, n), "left": slice(width - n, width)}
        for side, out in runs.items():
            torch.testing.assert_close(out["logits"][i], alone[i]["logits"][0], atol=1e-5, rtol=1e-5)
            for method, maps in out["relevance"].items():
                for setting, rel in maps.items():
                    torch.testing.assert_close(rel[i, columns[side]], alone[i]["relevance"][method][setting][0],
                                               atol=1e-5, rtol=1e-4, msg=f"{method} {setting} {side}")
                    assert rel[i, :width - n].abs().sum() == 0 if side == "left" else rel[i, n:].abs().sum() == 0
    batch = collate_text(items, tokenizer.pad_token_id, padding_side="left")
    template = batch["template_mask"].bool()
    assert not bool((TokenPerturber("delete").removable(batch) & template).any())
    rel = runs["left"]["relevance"]["attnlrp"]["target"]
    words = document_word_scores(rel, batch["word_ids"], None, batch["num_words"], "max")
    loud = document_word_scores(rel.masked_fill(template, 1e6), batch["word_ids"], None, batch["num_words"], "max")
    torch.testing.assert_close(words[0], loud[0])   # template scores reach no word


# ----------------------------------------------------------------------------------------------- end to end
class Spy:
    """Every token input the classifier classified (clean and perturbed)."""

    def __init__(self, monkeypatch):
        self.inputs = []
        forward = AnswerTokenClassifier.forward

        def recording(clf, inputs):
            self.inputs.append({k: inputs[k].clone() for k in ("input_ids", "attention_mask")})
            return forward(clf, inputs)

        monkeypatch.setattr(AnswerTokenClassifier, "forward", recording)

    def real_rows(self):
        for inputs in self.inputs:
            for ids, mask in zip(inputs["input_ids"], inputs["attention_mask"]):
                yield ids[mask.bool()].tolist()


def _evaluate(config_name, overrides, lm_dir, tmp_path, monkeypatch):
    import evaluate

    monkeypatch.setenv("TOKEN_ATTRIBUTIONS_CACHE", str(tmp_path / "cache"))
    config = yaml.safe_load((ROOT / "configs" / "evaluate" / config_name).read_text())
    config["base"] = str(ROOT / "configs" / "base" / "evaluate.yaml")
    config["trainer"]["logger"] = False
    config["model"].update(classifier=f"hf:{lm_dir}", methods=["attnlrp", "gradcam", "random"],
                           forward_batch_size=16)
    for callback in config["trainer"]["callbacks"]:
        if callback["class_path"].endswith("PerturbationTest"):
            callback["init_args"]["fractions"] = [0.2, 0.5]
        if callback["class_path"].endswith("ERASERFaithfulnessTest"):
            callback["init_args"]["bins"] = [0.1, 0.5]
        if callback["class_path"].endswith("RationaleTest"):
            callback["init_args"]["ks"] = [5, 10]
    config["data"]["init_args"].update(overrides)
    path = tmp_path / "prompted.yaml"
    path.write_text(json.dumps(config))
    return evaluate.main(["--config", str(path), "--output_dir", str(tmp_path / "run"),
                          "--trainer.default_root_dir", str(tmp_path)])


@pytest.mark.parametrize("dataset", ["movie_reviews", "sst2"])
def test_prompted_evaluation_end_to_end(dataset, lm_dir, tokenizer, tmp_path, monkeypatch):
    """The shipped decoder configs on a few real documents (Movie Reviews truncated to 80 tokens): every test
    reports, and no classified input ever lost a template token (the clean and every perturbed prompt start with
    the BOS and the template's head and end with its answer cue)."""
    data = {"movie_reviews": MOVIES, "sst2": SHARED_DATA / "sst2" / "SST-2-val.parquet"}[dataset]
    if not data.is_file():
        pytest.skip(f"{data} not found")
    spy = Spy(monkeypatch)
    overrides = {"path": str(data), "eval_subset": 4, "batch_size": 2, "max_length": 80}
    results = _evaluate(f"{dataset}_decoder.yaml", overrides, lm_dir, tmp_path, monkeypatch)
    methods = ("attnlrp", "gradcam", "random")
    for method in methods:
        assert f"eraser/{method}/predicted/aopc_comprehensiveness" in results
        assert f"perturbation/{method}/positive/target/auc" in results
        if dataset == "movie_reviews":
            assert 0.0 <= results[f"rationale/{method}/target/token_f1@5"] <= 1.0
    assert results["accuracy"] * 4 == pytest.approx(round(results["accuracy"] * 4))
    if dataset == "movie_reviews":
        assert 0.0 < results["rationale/coverage"] < 1.0   # reviews cut to whole words, the template kept
    prompt = yaml.safe_load((ROOT / "configs" / "evaluate" / f"{dataset}_decoder.yaml").read_text())["data"][
        "init_args"]["prompt"]
    head, cue = prompt.split("{text}")
    head_ids, cue_ids = tokenizer(head.rstrip(" "))["input_ids"], tokenizer(cue, add_special_tokens=False)["input_ids"]
    rows = list(spy.real_rows())
    assert len(rows) > 4 * (1 + 2 * 2 + 2 * 2)   # the clean prompts and the perturbed ones
    for row in rows:
        assert row[:len(head_ids)] == head_ids and row[-len(cue_ids):] == cue_ids
    html = (tmp_path / "run" / "text_heatmaps.html").read_text(encoding="utf-8")
    assert "Prompt template: <code>" in html and "Sentiment:</code>" in html
