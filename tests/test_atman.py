"""AtMan (issue 37): the authors' outputs, the score edit of every family that gives one, batching and refusals.

Goldens: ``tests/data/atman_golden/`` (``make_golden.py``: Aleph-Alpha/AtMan's own ``Explainer``, GPT-Neo fork and
``get_delta_cross_entropies`` on a tiny fork whose weights load into stock ``GPT2LMHeadModel``).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from methods import MethodUndefinedError, build_method
from methods.adapters import ActivationRecorder, adapter_for
from methods.atman import suppressed_scores
from tests.families import FAMILIES

GOLDEN = Path(__file__).parent / "data" / "atman_golden"
#: default-tier rows (the full matrix runs in the slow tier, tests/test_method_contract.py)
ROWS = ("timm_vit_cls", "hf_bert_types_special", "hf_clip_vision", "hf_gpt2_left", "hf_llama_gqa_left",
        "hf_qwen3_right", "hf_gemma3_left", "hf_vit", "hf_siglip_text_masked", "hf_modernbert_mean_local_global",
        "open_clip_vision", "open_clip_text", "timm_eva02_rope_glu", "timm_eva02_clip_style", "timm_beit_relpos",
        "hf_deberta_v3", "hf_deberta_v2_pos_proj_types")
REFUSED = ("timm_swin", "hf_swin")
FAMILY = {f.name: f for f in FAMILIES}


def _golden_model(dtype: torch.dtype):
    transformers = pytest.importorskip("transformers")
    meta = json.loads((GOLDEN / "atman_gpt2.cases.json").read_text())
    arrays = np.load(GOLDEN / "atman_gpt2.npz")
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**meta["gpt2_config"])).eval()
    weights = {k[len("weight/"):]: torch.from_numpy(arrays[k]) for k in arrays.files if k.startswith("weight/")}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
    return model.to(dtype), meta, arrays


def _padded(prompts, side: str):
    n = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), n, dtype=torch.long)
    mask = torch.zeros(len(prompts), n, dtype=torch.long)
    for i, p in enumerate(prompts):
        span = slice(n - len(p), n) if side == "left" else slice(0, len(p))
        ids[i, span], mask[i, span] = torch.tensor(p), 1
    return {"input_ids": ids, "attention_mask": mask}, [span_of(len(p), n, side) for p in prompts]


def span_of(length: int, n: int, side: str) -> slice:
    return slice(n - length, n) if side == "left" else slice(0, length)


@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-6), (torch.float32, 1e-4)])
@pytest.mark.parametrize("setting", ["plain", "conceptual", "conceptual_unscaled"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_equals_the_authors_explainer(dtype, rtol, setting, side):
    """The batched, padded call equals the reference's batch-1 scores, per prompt position (its
    ``CE(clean) - CE(suppressed)``) on the three prompts of the golden, with and without conceptual suppression."""
    model, meta, arrays = _golden_model(dtype)
    name = "float64" if dtype == torch.float64 else "float32"
    cases = [c for c in meta["cases"] if c["dtype"] == name and c["key"].split("/")[1] == setting]
    assert len(cases) == 3
    first = cases[0]
    method = build_method("atman", suppression=first["suppression"],
                          conceptual_threshold=first["conceptual_threshold"],
                          conceptual_scaled=first["conceptual_scaled"], chunk=5)
    inputs, spans = _padded([c["prompt"] for c in cases], side)
    out = method(model, inputs, target=torch.tensor([c["target"] for c in cases]))
    assert out.dtype == dtype
    for case, span, row in zip(cases, spans, out):
        expected = torch.from_numpy(arrays[case["key"]]).to(dtype)
        scale = float(expected.abs().max())
        torch.testing.assert_close(row[span], expected, rtol=0, atol=rtol * scale, msg=case["key"])
        assert (row[:span.start] == 0).all() and (row[span.stop:] == 0).all()


@pytest.mark.parametrize("score", ["drop", "squared"])
def test_drop_and_squared_scores_from_the_authors_deltas(score):
    """``score="drop"`` is minus the reference's ``CE(clean) - CE(suppressed)``, ``score="squared"`` its square (the
    reference's ``square_outputs=True``), batched and padded on the golden's plain float64 cases; other positions
    stay exactly 0."""
    model, meta, arrays = _golden_model(torch.float64)
    cases = [c for c in meta["cases"] if c["dtype"] == "float64" and c["key"].split("/")[1] == "plain"]
    inputs, spans = _padded([c["prompt"] for c in cases], "left")
    method = build_method("atman", suppression=cases[0]["suppression"], chunk=5, score=score)
    out = method(model, inputs, target=torch.tensor([c["target"] for c in cases]))
    for case, span, row in zip(cases, spans, out):
        delta = torch.from_numpy(arrays[case["key"]]).double()
        expected = -delta if score == "drop" else delta.square()
        torch.testing.assert_close(row[span], expected, rtol=0, atol=1e-6 * float(expected.abs().max()))
        assert (row[:span.start] == 0).all() and not torch.signbit(row[:span.start]).any()


def test_golden_exercises_conceptual_suppression():
    """The conceptual cases differ from the plain ones (similar tokens were suppressed too), so the golden
    checks the similarity, the threshold and the scaled factor."""
    _, meta, arrays = _golden_model(torch.float64)
    for i in range(3):
        plain = arrays[f"float64/plain/{i}"]
        assert np.abs(arrays[f"float64/conceptual/{i}"] - plain).max() > 1e-3 * np.abs(plain).max()


@pytest.mark.parametrize("row", ROWS)
def test_score_edit_reaches_every_block_before_the_softmax(row):
    """Every block's probabilities under an edit that sets all scores to 0 are uniform over the keys the mask
    allows (so the edit sees the scaled scores before the mask, in every block); the identity edit gives the
    model's own logits exactly; the model is left as it was."""
    family = FAMILY[row]
    model = family.build().eval()
    adapter = adapter_for(model)
    inputs = adapter.inputs.prepare(family.inputs(3))
    with torch.no_grad(), adapter.recording.eager_attention():
        own = adapter.forward(inputs)
        with adapter.recording.score_edit(lambda layer, s: s):
            same = adapter.forward(inputs)
        rec = ActivationRecorder()
        for layer in range(len(adapter.blocks)):
            adapter.recording.attention(rec, layer, layer)
        seen = []
        try:
            with adapter.recording.score_edit(lambda layer, s: seen.append(layer) or torch.zeros_like(s)):
                adapter.forward(inputs)
        finally:
            rec.remove()
    torch.testing.assert_close(same, own, rtol=0, atol=0)
    assert sorted(set(seen)) == list(range(len(adapter.blocks)))
    for layer in range(len(adapter.blocks)):
        probs = rec.outputs[layer]
        allowed = probs > 0
        top = probs.amax(dim=-1, keepdim=True)
        assert torch.allclose(probs[allowed], top.expand_as(probs)[allowed], rtol=1e-12, atol=0), (row, layer)
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == 0


@pytest.mark.parametrize("row", ROWS)
def test_padded_rows_equal_each_row_alone(row):
    """Batch 3 with mixed padding equals each sample at batch 1 (float64, 1e-6 of the largest score), for chunks
    that split the suppressed copies of one sample across forwards."""
    family = FAMILY[row]
    model = family.build().eval()
    inputs = family.inputs(3)
    targets = torch.tensor([1, 4, 0])
    out = build_method("atman", chunk=4)(model, inputs, target=targets)
    assert out.shape == family.shape(inputs, False) and torch.isfinite(out).all()
    assert float(out.abs().max()) > 0
    for i in range(3):
        alone = build_method("atman", chunk=64)(model, family.single(inputs, i), target=targets[i:i + 1])
        row_out = out[i:i + 1][..., family.positions(inputs, i)]
        torch.testing.assert_close(row_out, alone, rtol=0, atol=1e-6 * float(alone.abs().max()))


@pytest.mark.parametrize("row", REFUSED)
def test_refused_by_name(row):
    model = FAMILY[row].build().eval()
    with pytest.raises(MethodUndefinedError, match="atman: .* has no pre-softmax attention-score edit"):
        build_method("atman").check(model)


def test_the_edit_is_the_references_shift_and_scale():
    """A hand-worked row: scores (2, -1, 3) with key 2 suppressed by 0.1 give (2, -1, -1 + 0.1 * (3 + 1)); the
    softmax of the result equals that of the reference's (S - min) * f; a padded key is left out of the minimum."""
    scores = torch.tensor([2.0, -1.0, 3.0, -7.0], dtype=torch.float64).reshape(1, 1, 1, 4)
    factors = torch.tensor([[1.0, 1.0, 0.1, 1.0]], dtype=torch.float64)
    keys = torch.tensor([[True, True, True, False]])
    out = suppressed_scores(scores, factors, keys)
    torch.testing.assert_close(out.flatten()[:3], torch.tensor([2.0, -1.0, -0.6], dtype=torch.float64))
    reference = (scores[..., :3] - scores[..., :3].min()) * factors[:, None, None, :3]
    torch.testing.assert_close(out[..., :3].softmax(-1), reference.softmax(-1), rtol=0, atol=1e-15)


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="suppression"):
        build_method("atman", suppression=-1)
    with pytest.raises(ValueError, match="conceptual_threshold"):
        build_method("atman", conceptual_threshold=1.5)
    with pytest.raises(ValueError, match="chunk"):
        build_method("atman", chunk=0)
    with pytest.raises(ValueError, match="score must be one of"):
        build_method("atman", score="abs")


@pytest.mark.parametrize("row", ["timm_vit_cls", "hf_clip_vision", "open_clip_vision", "hf_bert_types_special",
                                 "hf_llama_gqa_left"])
def test_conceptual_suppression_on_images_and_text(row):
    """Conceptual suppression reads each family's input embedding (patch or word embeddings): it changes the
    scores, and a padded row still equals the row alone."""
    family = FAMILY[row]
    model = family.build().eval()
    inputs = family.inputs(3)
    targets = torch.tensor([1, 4, 0])
    method = build_method("atman", conceptual_threshold=0.05, chunk=7)
    out = method(model, inputs, target=targets)
    plain = build_method("atman")(model, inputs, target=targets)
    assert not torch.allclose(out, plain, rtol=0, atol=1e-6 * float(plain.abs().max()))
    for i in range(3):
        alone = method(model, family.single(inputs, i), target=targets[i:i + 1])
        torch.testing.assert_close(out[i:i + 1][..., family.positions(inputs, i)], alone, rtol=0,
                                   atol=1e-6 * float(alone.abs().max()))


@pytest.mark.parametrize("row", ["timm_eva02_rope_glu", "timm_eva02_clip_style", "timm_beit_relpos",
                                 "hf_deberta_v3", "hf_deberta_v2_pos_proj_types"])
def test_recomputed_scores_are_each_blocks_own(row):
    """EVA / BEiT compute ``q``, ``k`` functionally (EVA-02 rotates them, BEiT adds relative position biases) and
    DeBERTa its disentangled score ``c2c + c2p + p2c`` in its own code, so the edit recomputes the scores: the
    softmax of the scores it is handed is the block's own attention (1e-12; two unpadded samples), and an edit of
    one key column gives ``softmax(edit(S))`` in every block."""
    family = FAMILY[row]
    model = family.build().eval()
    adapter = adapter_for(model)
    inputs = adapter.inputs.prepare(family.inputs(2))
    seen = {}

    def keep(layer, s):
        seen[layer] = s
        return s

    def scale_column(layer, s):
        seen[layer] = s
        edited = s.clone()
        edited[..., 3] = edited[..., 3] * 0.1 - 2
        return edited

    for edit in (keep, scale_column):
        seen.clear()
        with torch.no_grad(), adapter.recording.eager_attention(), ActivationRecorder() as rec:
            for layer in range(len(adapter.blocks)):
                adapter.recording.attention(rec, layer, layer)
            with adapter.recording.score_edit(edit):
                adapter.forward(inputs)
        for layer in range(len(adapter.blocks)):
            expected = torch.softmax(edit(layer, seen[layer]), dim=-1)
            torch.testing.assert_close(rec.outputs[layer], expected, rtol=0, atol=1e-12)
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == 0


@pytest.mark.parametrize("row", ["timm_eva02_rope_glu", "timm_beit_relpos"])
def test_eva_beit_edit_keeps_a_key_mask(row):
    """With keys masked (token removal's padding: EVA's boolean ``attn_mask``, BEiT's ``-inf`` in the shared bias)
    the identity edit gives the blocks' own output bit for bit, and an edit setting every score to 0 gives uniform
    attention over the kept keys only."""
    family = FAMILY[row]
    model = family.build().eval()
    adapter = adapter_for(model)
    inputs = adapter.inputs.prepare(family.inputs(1))
    removed = torch.tensor([3, 7])
    with torch.no_grad(), adapter.recording.eager_attention():
        hidden, context = adapter.inputs.drop_positions(adapter.embed(inputs), adapter.inputs.context(inputs), removed)
        own = adapter.run_blocks(hidden, context)
        with adapter.recording.score_edit(lambda layer, s: s):
            same = adapter.run_blocks(hidden, context)
        with ActivationRecorder() as rec, adapter.recording.score_edit(lambda layer, s: torch.zeros_like(s)):
            adapter.recording.attention(rec, 0, "a")
            adapter.run_blocks(hidden, context)
    torch.testing.assert_close(same, own, rtol=0, atol=0)
    probs = rec.outputs["a"]                                       # [2, H, N, N]: position 3, then 7 removed
    for copy, position in enumerate(removed.tolist()):
        kept = torch.ones(probs.shape[-1], dtype=torch.bool)
        kept[position] = False
        assert (probs[copy][..., ~kept] == 0).all()
        torch.testing.assert_close(probs[copy][..., kept], torch.full_like(probs[copy][..., kept], 1 / kept.sum()),
                                   rtol=0, atol=1e-12)
