"""ALTI and ALTI-Logit (``methods/alti.py``): the authors' outputs, the decomposition, the options.

Goldens: ``tests/data/alti_golden/`` (``REFERENCE.json``: the two repositories and commits; ``generate.py`` ran them
offline, batch 1, on the tiny stock BERT and GPT-2 stored beside them). Here the batched, padded call must give
them: float64 within 1e-6 of the largest score, float32 within 1e-4.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import methods.alti as alti_module
from methods import MethodUndefinedError, build_method
from methods.adapters import ActivationRecorder, adapter_for, linear_weight
from methods.alti import decomposed_vectors
from tests import test_method_contract as contract
from tests.families import FAMILIES

transformers = pytest.importorskip("transformers")
GOLDEN = Path(__file__).resolve().parent / "data" / "alti_golden"
ROWS = {family.name: family for family in FAMILIES}


@pytest.fixture(scope="module")
def goldens():
    return torch.load(GOLDEN / "goldens.pt")


def _model(kind: str, dtype: torch.dtype):
    cls = transformers.BertForSequenceClassification if kind == "bert" else transformers.GPT2LMHeadModel
    return cls.from_pretrained(GOLDEN / "models" / kind, dtype=dtype).eval()


def _padded(sentences, left: bool):
    """The sentences in one batch, padded (left for the decoder, right for the encoder), and each one's slice."""
    n = max(map(len, sentences))
    ids = torch.zeros(len(sentences), n, dtype=torch.long)
    mask = torch.zeros_like(ids)
    slices = []
    for i, sentence in enumerate(sentences):
        where = slice(n - len(sentence), n) if left else slice(0, len(sentence))
        ids[i, where], mask[i, where] = torch.tensor(sentence), 1
        slices.append(where)
    return {"input_ids": ids, "attention_mask": mask}, slices


CASES = {   # golden key: (method, options, model, contrastive)
    "alti_bert": ("alti", {}, "bert", False),
    "alti_gpt2": ("alti", {}, "gpt2", False),
    "alti_logit_gpt2": ("alti_logit", {}, "gpt2", False),
    "alti_logit_gpt2_contrast": ("alti_logit", {"explain": "logit_difference"}, "gpt2", True),
}


def test_golden_files_name_the_references():
    reference = json.loads((GOLDEN / "REFERENCE.json").read_text())
    assert reference["alti"]["repository"] == "mt-upc/transformer-contributions"
    assert reference["alti_logit"]["repository"] == "mt-upc/logit-explanations"
    assert all(len(reference[m]["commit"]) == 40 for m in ("alti", "alti_logit"))


@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, 1e-6), (torch.float32, 1e-4)], ids=["f64", "f32"])
@pytest.mark.parametrize("key", list(CASES))
def test_batched_padded_call_equals_the_authors_outputs(goldens, key, dtype, tolerance):
    name, options, kind, contrastive = CASES[key]
    sentences = goldens[f"{kind}_ids"]
    inputs, slices = _padded(sentences, left=kind == "gpt2")
    extra = {}
    if name == "alti_logit":
        extra["target"] = torch.tensor(goldens["gpt2_targets"])
        if contrastive:
            extra["foil"] = torch.tensor(goldens["gpt2_foils"])
    out = build_method(name, **options)(_model(kind, dtype), inputs, **extra)
    assert out.dtype == dtype
    padding = inputs["attention_mask"] == 0
    assert padding.any() and (out[padding] == 0).all()
    for i, reference in enumerate(goldens[key]):
        scale = float(reference.abs().max())
        torch.testing.assert_close(out[i, slices[i]].double(), reference.double(), rtol=0, atol=tolerance * scale,
                                   msg=f"{key}: sentence {i}")


DECOMPOSED = ("hf_bert", "hf_distilbert_special", "hf_deberta_v3", "hf_modernbert_mean_local_global",
              "hf_gpt2_left", "hf_llama_gqa_left",
              # pre-norm encoders; layer scale on the attention output: the timm DINOv2-reg row, HF DINOv2, open_clip
              "timm_vit_reg4_dinov2", "hf_dinov2", "hf_clip_vision", "open_clip_text_eos_linear_proj_layerscale",
              # EVA-02's sub-LN on the merged heads before proj (linearised with its token's scale), BEiT
              "timm_eva02_clip_style", "timm_eva02_rope_glu", "timm_beit_relpos",
              # Gemma 3's RMSNorm on the attention output before the residual sum (``1 + w``)
              "hf_gemma3_left")


@pytest.mark.parametrize("row", DECOMPOSED)
def test_the_decomposed_vectors_sum_to_the_blocks_own_output(row):
    """With the exact LayerNorm scale, ``y_i = sum_j T_i(x_j) + biases`` is the block's own tensor: the attention's
    LayerNorm output in a post-norm block, the residual sum after the attention in a pre-norm one (the
    adapter's ``decomposition.record_post_attention_residual``; its norms by its ``block_norms``)."""
    family = ROWS[row]
    model = family.build().eval()
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare(family.inputs(3))
    layout = adapter.inputs.layout(batch)
    real = layout.real_positions(torch.zeros(3, layout.num_positions, dtype=torch.long)).bool()
    with adapter.recording.eager_attention(), ActivationRecorder() as rec, torch.no_grad():
        for layer in range(len(adapter.blocks)):
            adapter.recording.block_input(rec, layer, ("x", layer))
            adapter.recording.attention(rec, layer, ("a", layer))
            adapter.recording.values(rec, layer, ("v", layer))
            adapter.decomposition.record_post_attention_residual(rec, layer, ("r", layer))
            rec.output(adapter.decomposition.block_norms(layer)[0], ("n", layer))
            if adapter.decomposition.attention_output_norm(layer) is not None:
                rec.input(adapter.decomposition.attention_output_norm(layer)[0], ("inner", layer))
            adapter.decomposition.record_block_output(rec, layer, ("out", layer))
        adapter.forward(batch, grad_from_block=len(adapter.blocks))
    inner_norms = 0
    for layer in range(len(adapter.blocks)):
        post_norm = None if adapter.decomposition.pre_norm else adapter.decomposition.block_norms(layer)[0]
        where = adapter.decomposition.attention_output_norm(layer)
        inner = None if where is None else (*where, rec[("inner", layer)])
        inner_norms += inner is not None
        _, resultant = decomposed_vectors(rec[("x", layer)], rec[("a", layer)], rec[("v", layer)],
                                          adapter.linears(layer).attention.out, post_norm, rec[("r", layer)],
                                          "exact", "test", adapter.decomposition.attention_output_scale(layer), inner)
        expected = rec[("r", layer)] if adapter.decomposition.pre_norm else rec[("n", layer)]
        # Gemma3RMSNorm computes in float32 whatever the model's dtype (``x.float()``), so its own output carries
        # float32 rounding; every other row: float64
        tolerance = 1e-5 if row == "hf_gemma3_left" else 1e-10
        torch.testing.assert_close(resultant[real], expected[real], rtol=tolerance, atol=tolerance)
        if layer + 1 < len(adapter.blocks):
            torch.testing.assert_close(rec[("out", layer)], rec[("x", layer + 1)], rtol=0, atol=0)
    assert inner_norms == (len(adapter.blocks) if row in ("timm_eva02_clip_style", "hf_gemma3_left") else 0)


@pytest.mark.parametrize("row", ["hf_gpt2_left", "hf_llama_gqa_left", "hf_gemma3_left"])
def test_alti_logit_totals_are_the_attention_updates_of_the_logit(row):
    """ALTI's rows sum to 1, so the rollout keeps totals: the scores of a row sum to the attention sub-layers'
    updates of the explained logit at the read-out position (output projection bias left out), each through the
    final norm's linear part (LayerNorm: centred; RMSNorm: not) with the scale of the last hidden state: the
    decomposition is exact on RMSNorm decoders too. Rows 0 and 1: in the tiny Llama's row 2, token 6 of block 0 has no
    input closer to its output than the output's norm (a zero row of ``C``, where the reference divides 0 by 0), so
    its share of the total is lost there. Gemma 3 (its soft-capping off: a soft-capped head is refused): the
    updates are its ``post_attention_layernorm`` outputs, the final norm's weight ``1 + w``."""
    family = ROWS[row]
    model = family.build().eval()
    if row == "hf_gemma3_left":
        with pytest.raises(MethodUndefinedError, match="not linear after its final norm"):
            build_method("alti_logit").check(model)
        model.config.final_logit_softcapping = None
    adapter = adapter_for(model)
    inputs = family.inputs(3)
    targets = torch.tensor([1, 4, 0])
    scores = build_method("alti_logit")(model, inputs, target=targets)
    batch = adapter.inputs.prepare(inputs)
    positions = adapter.inputs.context(batch).readout_positions
    rows = torch.arange(3)
    with adapter.recording.eager_attention(), ActivationRecorder() as rec, torch.no_grad():
        for layer in range(len(adapter.blocks)):
            inner = adapter.decomposition.attention_output_norm(layer)
            rec.output(adapter.linears(layer).attention.out if inner is None else inner[0], layer)
        rec.output(adapter.decoder.final_norm(), "normed")
        rec.input(adapter.decoder.final_norm(), "last")
        adapter.forward(batch, grad_from_block=len(adapter.blocks))
    final = adapter.decoder.final_norm()
    last = rec["last"][rows, positions]
    layer_norm = isinstance(final, torch.nn.LayerNorm)
    centred = last - last.mean(-1, keepdim=True) if layer_norm else last
    eps = final.eps if layer_norm or row == "hf_gemma3_left" else final.variance_epsilon
    scale = torch.rsqrt(centred.pow(2).mean(-1) + eps)
    gain = final.weight + 1 if row == "hf_gemma3_left" else final.weight
    direction = (linear_weight(adapter.classifier())[targets] * gain).detach()
    if layer_norm:
        direction = direction - direction.mean(-1, keepdim=True)
    total = torch.zeros(3, dtype=torch.float64)
    for layer in range(len(adapter.blocks)):
        out = adapter.linears(layer).attention.out
        inner = adapter.decomposition.attention_output_norm(layer)
        update = rec[layer][rows, positions] - (0 if out.bias is None or inner else out.bias)
        total += (update * direction).sum(-1) * scale
    total = total.detach()   # the output projection's bias is a parameter
    tolerance = 1e-5 if row == "hf_gemma3_left" else 1e-9    # Gemma3RMSNorm's own float32 outputs
    torch.testing.assert_close(scores.sum(-1)[:2], total[:2], rtol=tolerance,
                               atol=tolerance * float(total.abs().max()))


def test_the_layer_norm_scale_conventions_differ_only_by_eps():
    """``shifted_std`` drops the LayerNorm's eps (the reference's ``std(x + eps)``), ``exact`` keeps it: with an
    eps of 0 both are the same map; with a large eps they differ (BERT's 1e-12 hides it)."""
    model = _model("bert", torch.float64)
    inputs, _ = _padded([[1, 5, 7, 9, 2], [1, 8, 2]], left=False)
    maps = {}
    for eps in (0.0, 0.5):
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.eps = eps
        maps[eps] = [build_method("alti", layer_norm_scale=s)(model, inputs) for s in ("shifted_std", "exact")]
    torch.testing.assert_close(maps[0.0][0], maps[0.0][1], rtol=1e-12, atol=1e-12)
    assert (maps[0.5][0] - maps[0.5][1]).abs().max() > 1e-3


def test_bad_options_and_calls_are_named():
    with pytest.raises(ValueError, match="layer_norm_scale must be one of"):
        build_method("alti", layer_norm_scale="biased")
    with pytest.raises(ValueError, match="distance_eps"):
        build_method("alti", distance_eps=-1)
    with pytest.raises(ValueError, match="explain must be one of"):
        build_method("alti_logit", explain="probability")
    model = ROWS["hf_gpt2_left"].build().eval()
    inputs = ROWS["hf_gpt2_left"].inputs(2)
    with pytest.raises(ValueError, match="give foil="):
        build_method("alti_logit", explain="logit_difference")(model, inputs, target=1)
    with pytest.raises(ValueError, match="foil= is read only"):
        build_method("alti_logit")(model, inputs, target=1, foil=2)
    with pytest.raises(MethodUndefinedError, match="needs a pre-norm decoder"):
        build_method("alti_logit").check(ROWS["hf_bert"].build())
    with pytest.raises(MethodUndefinedError, match="does not decompose its blocks"):
        build_method("alti").check(ROWS["timm_swin"].build())


#: default-tier cells of the conformance matrix (the full matrix: the slow tier of tests/test_method_contract.py)
CELLS = [("hf_bert", "alti"), ("hf_distilbert_special", "alti"), ("hf_gpt2_left", "alti_logit"),
         ("hf_llama_gqa_left", "alti_logit"), ("hf_qwen3_right", "alti"), ("timm_vit_cls", "alti"),
         ("hf_bert", "alti_logit"), ("timm_vit_map_reg2", "alti"), ("hf_siglip_text_masked", "alti"),
         ("open_clip_text_eos_linear_proj_layerscale", "alti"), ("hf_clip_text", "alti_logit"),
         ("timm_eva02_clip_style", "alti")]


@pytest.mark.parametrize("row,name", CELLS)
def test_matrix_cells(row, name):
    contract.test_method_contract(ROWS[row], name)


def test_alti_logit_default_target_is_the_prediction():
    contract.test_default_target_is_the_prediction(ROWS["hf_gpt2_left"], "alti_logit")


@pytest.mark.parametrize("key", ["alti_bert", "alti_logit_gpt2"])
def test_rows_formed_in_chunks_give_the_same_maps(goldens, key, monkeypatch):
    """One query row at a time (the chunks of a long sequence) equals the authors' outputs too."""
    monkeypatch.setattr(alti_module, "CHUNK_ELEMENTS", 1)
    test_batched_padded_call_equals_the_authors_outputs(goldens, key, torch.float64, 1e-6)


def _alti_by_hand(model, images, readout):
    """ALTI on a timm ``VisionTransformer`` re-derived from the paper's equations (Ferrando et al. 2022, eq. 7-11),
    one sample, one pair ``(i, j)`` at a time from the block's own modules: ``T_i(x_j) = gamma * sum_h A^h_ij
    v^h_j W_O^h + [i = j] x_j``, ``y_i = sum_j T_i(x_j) + gamma * b_O`` (the residual sum after the attention),
    ``c_ij = max(0, ||y_i||_1 - ||T_i(x_j) - y_i + 1e-6||_1)`` over its row sum; ``C_{L-1} ... C_0`` read at the
    [CLS] row (``readout="cls"``) or the mean patch row (``"mean"``); the patch columns."""
    maps = []
    for image in images:
        x = model.norm_pre(model._pos_embed(model.patch_embed(image[None])))[0]
        n, width = x.shape
        rollout = torch.eye(n, dtype=x.dtype)
        for block in model.blocks:
            attn, heads = block.attn, block.attn.num_heads
            gamma = block.ls1.gamma if hasattr(block.ls1, "gamma") else torch.ones(width, dtype=x.dtype)
            q, k, v = attn.qkv(block.norm1(x)).reshape(n, 3, heads, width // heads).unbind(1)
            probs = torch.softmax(torch.einsum("ihz,jhz->hij", q, k) * attn.scale, dim=-1)
            w_o = attn.proj.weight.reshape(width, heads, width // heads)
            y = x + gamma * attn.proj(torch.einsum("hij,jhz->ihz", probs, v).reshape(n, width))
            c = torch.zeros(n, n, dtype=x.dtype)
            for i in range(n):
                for j in range(n):
                    t = gamma * sum(probs[h, i, j] * (w_o[:, h] @ v[j, h]) for h in range(heads)) + (x[j] if i == j
                                                                                                   else 0)
                    c[i, j] = max(0.0, float(y[i].abs().sum() - (t - y[i] + 1e-6).abs().sum()))
            rollout = (c / c.sum(-1, keepdim=True)) @ rollout
            x = block(x[None])[0]
        prefix = model.num_prefix_tokens
        row = rollout[0] if readout == "cls" else rollout[prefix:].mean(0)
        maps.append(row[prefix:])
    return torch.stack(maps)


@pytest.mark.parametrize("row,readout", [("timm_vit_reg4_dinov2", "cls"), ("timm_vit_avgpool", "mean")])
def test_alti_on_a_timm_vit_is_the_papers_equation_by_hand(row, readout):
    """The batched call on a tiny timm ViT ([CLS] with registers and layer scale; average pooling) equals the
    pairwise re-derivation of :func:`_alti_by_hand`; every row of each block's ``C`` sums to 1 (checked there by
    the division) and the rolled-out [CLS] / mean row over all positions, prefix tokens included, sums to 1."""
    family = ROWS[row]
    model = family.build().eval()
    images = family.inputs(2)
    scores = build_method("alti")(model, images)
    with torch.no_grad():
        expected = _alti_by_hand(model, images, readout)
    torch.testing.assert_close(scores, expected, rtol=1e-10, atol=1e-12)
    assert (scores >= 0).all() and float(scores.sum(-1).max()) <= 1 + 1e-12
