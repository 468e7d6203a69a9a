"""DecompX (``methods/decompx.py``): the authors' outputs, conservation, the options, the matrix cells.

Goldens: ``tests/data/decompx_golden/`` (``REFERENCE.json``: the repository, commit and configurations;
``generate.py`` ran the authors' BERT and RoBERTa forks offline, batch 1, on the tiny stock classifiers stored
beside them). Here the batched, padded call with per-sample targets must give them: float64 within 1e-6 of the
largest score, float32 within 1e-4.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import methods.decompx as decompx_module
from methods import MethodUndefinedError, build_method
from methods.adapters import ActivationRecorder, adapter_for
from tests import test_method_contract as contract
from tests.families import FAMILIES
from tests.families.decompositions import DECOMPX_ROWS

transformers = pytest.importorskip("transformers")
GOLDEN = Path(__file__).resolve().parent / "data" / "decompx_golden"
ROWS = {family.name: family for family in FAMILIES}
#: the reference's configurations (``generate.py``'s ``CONFIGS``) as this method's options
OPTIONS = {
    "default": {},
    "linear": {"ffn_approximation": "gelu_la", "head_approximation": "la"},
    "norm_relu": {"bias_decomposition": "norm", "ffn_approximation": "relu"},
    "no_biases": {"include_biases": False},
}
#: each model's padding id (RoBERTa's positions count from it)
PAD = {"bert": 0, "roberta": 1}


@pytest.fixture(scope="module")
def goldens():
    return torch.load(GOLDEN / "goldens.pt")


def _model(kind: str, dtype: torch.dtype):
    cls = {"bert": transformers.BertForSequenceClassification,
           "roberta": transformers.RobertaForSequenceClassification}[kind]
    return cls.from_pretrained(GOLDEN / "models" / kind, dtype=dtype).eval()


def _padded(sentences, pad: int):
    """The sentences in one right-padded batch."""
    n = max(map(len, sentences))
    ids = torch.full((len(sentences), n), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, sentence in enumerate(sentences):
        ids[i, :len(sentence)], mask[i, :len(sentence)] = torch.tensor(sentence), 1
    return {"input_ids": ids, "attention_mask": mask}


def test_golden_files_name_the_reference():
    reference = json.loads((GOLDEN / "REFERENCE.json").read_text())
    assert reference["repository"] == "mohsenfayyaz/DecompX" and len(reference["commit"]) == 40
    assert set(reference["configs"]) == set(OPTIONS)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, 1e-6), (torch.float32, 1e-4)], ids=["f64", "f32"])
@pytest.mark.parametrize("config", list(OPTIONS))
@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_batched_padded_call_equals_the_authors_outputs(goldens, kind, config, dtype, tolerance):
    sentences = goldens[f"{kind}_ids"]
    inputs = _padded(sentences, PAD[kind])
    targets = torch.tensor([2, 0, 1])                 # one class per sample, none the same
    out = build_method("decompx", **OPTIONS[config])(_model(kind, dtype), inputs, target=targets)
    assert out.dtype == dtype
    padding = inputs["attention_mask"] == 0
    assert padding.any() and (out[padding] == 0).all()
    for i, sentence in enumerate(sentences):
        reference = goldens[f"{kind}_{config}"][i][:, int(targets[i])]
        scale = float(reference.abs().max())
        torch.testing.assert_close(out[i, :len(sentence)].double(), reference.double(), rtol=0,
                                   atol=tolerance * scale, msg=f"{kind} {config}: sentence {i}")


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_rows_formed_in_chunks_give_the_same_maps(goldens, kind, monkeypatch):
    """One output row at a time (the chunks of a long sequence; each block's rows overwrite the previous
    block's in place) equals the authors' outputs too."""
    monkeypatch.setattr(decompx_module, "CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(decompx_module, "ATTENTION_CHUNK_ELEMENTS", 1)
    test_batched_padded_call_equals_the_authors_outputs(goldens, kind, "default", torch.float64, 1e-6)


@pytest.mark.parametrize("row", DECOMPX_ROWS)
def test_the_parts_sum_to_the_logit(row):
    """With the biases shared (the default), every bias goes to the tokens: the parts of a logit sum to the
    model's logit, up to the reference's 1e-12 shifts (the zero-origin slopes, the bias weights' sums); without
    the biases they do not."""
    family = ROWS[row]
    model = family.build().eval()
    inputs = family.inputs(3)
    with torch.no_grad():
        logits = family.logits(model, inputs)
    for target in range(logits.shape[-1]):
        scores = build_method("decompx")(model, inputs, target=target)
        torch.testing.assert_close(scores.sum(-1), logits[:, target], rtol=1e-9, atol=1e-9, msg=f"class {target}")
    unshared = build_method("decompx", include_biases=False)(model, inputs, target=0)
    assert (unshared.sum(-1) - logits[:, 0]).abs().max() > 1e-3


@pytest.mark.parametrize("row", DECOMPX_ROWS)
def test_the_head_layers_are_the_models_head(row):
    """The capability's ``head_layers``: ``last(activation(first(h_0)))`` on the last block's output at position 0
    gives the model's logits (eval mode: dropout is the identity)."""
    family = ROWS[row]
    model = family.build().eval()
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare(family.inputs(3))
    with ActivationRecorder() as rec, torch.no_grad():
        adapter.decomposition.record_block_output(rec, len(adapter.blocks) - 1, "last")
        logits = adapter.forward(batch)
        head = adapter.decomposition.head_layers()
        ours = head.last(head.activation(head.first(rec["last"][:, 0])))
    torch.testing.assert_close(ours, logits, rtol=0, atol=1e-12)


def test_the_goldens_conserve_the_logits_too(goldens):
    """The reference's own parts (default configuration) sum to the logits it computed."""
    for kind in ("bert", "roberta"):
        for parts, logits in zip(goldens[f"{kind}_default"], goldens[f"{kind}_logits"]):
            torch.testing.assert_close(parts.sum(0), logits, rtol=0, atol=1e-10)


def test_the_logit_difference_is_the_difference_of_the_two_maps():
    family = ROWS["hf_roberta_types"]
    model = family.build().eval()
    inputs = family.inputs(3)
    target, foil = torch.tensor([1, 4, 0]), torch.tensor([2, 2, 3])
    contrast = build_method("decompx", explain="logit_difference")(model, inputs, target=target, foil=foil)
    plain = build_method("decompx")
    torch.testing.assert_close(contrast, plain(model, inputs, target=target) - plain(model, inputs, target=foil),
                               rtol=0, atol=1e-12)


def test_bad_options_and_models_are_named():
    with pytest.raises(ValueError, match="bias_decomposition must be one of"):
        build_method("decompx", bias_decomposition="dot")
    with pytest.raises(ValueError, match="ffn_approximation must be one of"):
        build_method("decompx", ffn_approximation="GeLU_ZO")
    with pytest.raises(ValueError, match="head_approximation must be one of"):
        build_method("decompx", head_approximation="exact")
    with pytest.raises(ValueError, match="include_biases must be True or False"):
        build_method("decompx", include_biases="yes")
    with pytest.raises(ValueError, match="explain must be one of"):
        build_method("decompx", explain="probability")
    for row in ("hf_deberta_v3", "hf_modernbert_cls", "hf_gpt2_left", "timm_vit_cls"):
        with pytest.raises(MethodUndefinedError, match="does not decompose its whole network"):
            build_method("decompx").check(ROWS[row].build())


#: default-tier cells of the conformance matrix (the full matrix: the slow tier of tests/test_method_contract.py)
CELLS = [("hf_bert", "decompx"), ("hf_roberta_types", "decompx"), ("hf_distilbert_special", "decompx"),
         ("hf_electra_types", "decompx"), ("hf_modernbert_cls", "decompx"), ("hf_llama_gqa_left", "decompx")]


@pytest.mark.parametrize("row,name", CELLS)
def test_matrix_cells(row, name):
    contract.test_method_contract(ROWS[row], name)


def test_default_target_is_the_prediction():
    contract.test_default_target_is_the_prediction(ROWS["hf_bert_types_special"], "decompx")
