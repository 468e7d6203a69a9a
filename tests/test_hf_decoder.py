"""The decoder adapters (``methods/adapters/hf_decoder.py``): logits equal to the stock model's at each row's last
real token, with left and right padding (position ids from the mask, as ``generate``), a padded row equal to the
row alone, the attention probabilities and values the methods read, the read-out option, refused inputs, and the
relevance rules of decoders (RMSNorm, gated MLP, GPT-2's fused ``Conv1D``) on AttnLRP / CP-LRP."""
from __future__ import annotations

import pytest
import torch

from methods import build_method
from methods.adapters import ActivationRecorder, adapter_for
from tests.families import DECODER_KINDS, _decoder_batch, _decoder_logits, _tiny_decoder
from tests.lrp_passes import assert_cp_lrp_conserves_and_attnlrp_does_not, head_relevance

transformers = pytest.importorskip("transformers")


def _adapter_logits(model, inputs, **extra):
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare({**inputs, **extra})
    context = adapter.inputs.context(batch)
    with torch.no_grad():
        return adapter.head(adapter.run_blocks(adapter.embed(batch), context), context)


@torch.no_grad()
def _rows_alone(model, inputs):
    """The stock logits of each row alone, unpadded."""
    rows = []
    for i, real in enumerate(inputs["attention_mask"].bool()):
        alone = {k: v[i:i + 1][:, real] for k, v in inputs.items() if k != "special_tokens_mask"}
        rows.append(_decoder_logits(model, alone))
    return torch.cat(rows)


@pytest.mark.parametrize("head", ["lm", "seq_cls"])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("kind", DECODER_KINDS)
def test_logits_are_the_models(kind, side, head):
    """float32 and float64: the adapter's logits equal ``model(input_ids, attention_mask, position_ids)`` at the
    last real token (LM heads on the read-out rows only: <= 1e-6 relative; sequence classifiers: exactly), and
    each row's logits equal the row's alone. The stock float64 RoPE models give NaN with left padding (a fully
    masked padding query: the float32 softmax of a -inf row): there the row alone is the reference."""
    inputs = _decoder_batch(3, side)
    for dtype in (torch.float32, torch.float64):
        model = _tiny_decoder(kind, head).to(dtype).eval()
        ours = _adapter_logits(model, inputs)
        assert torch.isfinite(ours).all()
        stock = _decoder_logits(model, inputs)
        alone = _rows_alone(model, inputs)
        scale = float(alone.abs().max())
        if bool(torch.isfinite(stock).all()):
            tol = 0 if head == "seq_cls" else 1e-6 * scale
            torch.testing.assert_close(ours, stock, rtol=0, atol=tol)
        else:
            assert dtype == torch.float64 and side == "left" and kind != "gpt2"
        torch.testing.assert_close(ours, alone, rtol=0, atol=(1e-5 if dtype == torch.float32 else 1e-12) * scale)


def test_gpt2_left_padding_needs_the_position_ids_from_the_mask():
    model = _tiny_decoder("gpt2").eval()
    inputs = _decoder_batch(3, "left")
    ours = _adapter_logits(model, inputs)
    plain = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits[:, -1]
    torch.testing.assert_close(ours, _rows_alone(model, inputs), rtol=0, atol=1e-12)
    assert (plain[2] - ours[2]).abs().max() > 1e-3    # the padded row, counted from column 0, is another text


def test_readout_position_option_and_layout():
    model = _tiny_decoder("llama").eval()
    inputs = _decoder_batch(3, "left")
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare(inputs)
    mask = inputs["attention_mask"]
    assert adapter.inputs.context(batch).readout_positions.tolist() == [8, 8, 8]
    assert adapter.inputs.context(batch).position_ids[2].tolist() == [0, 0, 0, 0, 1, 2, 3, 4, 5]
    logits = model(**{k: v for k, v in inputs.items()}, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    ours = _adapter_logits(model, inputs, readout_position=torch.tensor([4, 5, 6]))
    torch.testing.assert_close(ours, logits[torch.arange(3), torch.tensor([4, 5, 6])], rtol=0, atol=1e-10)
    layout = adapter.inputs.layout(batch)
    first = mask.argmax(dim=1)
    assert not layout.content_mask[torch.arange(3), first].any()          # the BOS (config.bos_token_id)
    assert layout.content_mask.sum().item() == mask.sum().item() - 3
    with pytest.raises(ValueError, match="real \\(attended\\) position"):
        adapter.inputs.prepare({**inputs, "readout_position": torch.tensor([5, 5, 0])})
    holes = {**inputs, "attention_mask": torch.ones_like(mask)}
    holes["attention_mask"][0, 4] = 0
    with pytest.raises(ValueError, match="contiguous"):
        adapter.inputs.prepare(holes)


def test_record_values_repeat_the_key_value_heads():
    """With grouped-query attention (4 query heads, 2 key/value heads) the recorded values have the width of
    the attention output, head h reading key/value head h // 2; attention probabilities of every query head."""
    model = _tiny_decoder("llama").eval()
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare(_decoder_batch(2, "right"))
    with adapter.recording.eager_attention(), ActivationRecorder() as rec:
        adapter.recording.values(rec, 1, "v")
        adapter.recording.attention(rec, 1, "a")
        vproj = ActivationRecorder()
        vproj.output(adapter.blocks[1].self_attn.v_proj, "raw")
        adapter.forward(batch)
        vproj.remove()
    v, raw = rec["v"], vproj["raw"]
    assert v.shape == (2, 9, 16) and raw.shape == (2, 9, 8)
    for h in range(4):
        torch.testing.assert_close(v[..., 4 * h:4 * h + 4], raw[..., 4 * (h // 2):4 * (h // 2) + 4], rtol=0, atol=0)
    assert rec["a"].shape == (2, 4, 9, 9)


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gemma3", "gpt2"])
def test_cp_lrp_conserves_exactly_on_bias_free_decoders(kind):
    """CP-LRP on a bias-free decoder (no position embeddings for GPT-2) is linear in the embeddings: the relevance
    entering every block and the input scores' sum equal the explained logit (the README's unit test for
    Llama). RMSNorm's identity rule and the detached gate keep it so; AttnLRP's (softmax by its gradient, the
    gated product by 1/2) does not."""
    model = _tiny_decoder(kind, bias_free=True).eval()
    if kind == "gemma3":
        model.config.final_logit_softcapping = None
    inputs = _decoder_batch(3, "left")
    target = torch.tensor([1, 4, 0])
    assert_cp_lrp_conserves_and_attnlrp_does_not(model, inputs, target, 1e-6)


@pytest.mark.parametrize("variant", ["attnlrp", "cp_lrp"])
def test_decoder_rules_leave_the_model_and_the_logits(variant):
    """No class patched, no hook left, the logits inside the call the stock model's, sdpa kept."""
    from transformers.models.llama import modeling_llama

    model = _tiny_decoder("llama", attn_implementation="sdpa").eval()
    inputs = _decoder_batch(3, "right")
    classes = {cls: dict(vars(cls)) for cls in (modeling_llama.LlamaRMSNorm, modeling_llama.LlamaMLP,
                                                 modeling_llama.LlamaAttention, torch.nn.Linear)}
    report = build_method(variant).relevance_by_layer(model, inputs, target=torch.tensor([0, 3, 1]))
    torch.testing.assert_close(report["logit"], _decoder_logits(model, inputs)[torch.arange(3), [0, 3, 1]],
                               rtol=0, atol=1e-12)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert {cls: dict(vars(cls)) for cls in classes} == classes
    assert model.config._attn_implementation == "sdpa"


def test_gated_mlp_rules_change_the_map():
    """The 1/2 on the gated product and the identity rule on the gate's activation are in force (AttnLRP): the
    map differs from CP-LRP's, whose gate is detached."""
    model = _tiny_decoder("qwen2").eval()
    inputs = _decoder_batch(3, "left")
    target = torch.tensor([1, 4, 0])
    attn = build_method("attnlrp")(model, inputs, target=target)
    cp = build_method("cp_lrp")(model, inputs, target=target)
    assert (attn - cp).abs().max() > 1e-3 * attn.abs().max()
    assert (attn[inputs["attention_mask"] == 0] == 0).all()


def test_gamma_option_reaches_gpt2_conv1d():
    model = _tiny_decoder("gpt2").eval()
    inputs = _decoder_batch(2, "right")
    plain = build_method("attnlrp")(model, inputs, target=torch.tensor([1, 2]))
    tuned = build_method("attnlrp", gamma=0.25)(model, inputs, target=torch.tensor([1, 2]))
    assert (tuned - plain).abs().max() > 1e-2 * plain.abs().max()


@pytest.mark.parametrize("kind", DECODER_KINDS)
@pytest.mark.parametrize("head", ["lm", "seq_cls"])
def test_lrp_conserves_relevance_on_decoders(kind, head):
    """No reference exists for LRP on decoders: with the conservative ``"ours"`` rules the relevance entering
    every block sums to the one-hot target (1) per sample (float64, left padding), as for CLIP's towers; full
    LRP to the encoder input sums to 1 as well (GPT-2: to the embedding sum; at its word embeddings the position
    share is dropped)."""

    model = _tiny_decoder(kind, head).eval()
    inputs = _decoder_batch(3, "left")
    start = head_relevance(model, inputs, readout_positions=True)
    adapter, engine, topology, acts, r = start.adapter, start.engine, start.topology, start.acts, start.relevance
    ones = torch.ones(3, dtype=torch.float64)
    torch.testing.assert_close(r.sum(dim=(1, 2)), ones, rtol=0, atol=1e-6)
    for l in reversed(range(len(adapter.blocks))):
        r, cam = topology.block_relprop(engine.rules, acts, l, r, True)
        torch.testing.assert_close(r.sum(dim=(1, 2)), ones, rtol=0, atol=1e-6, msg=f"block {l}")
        assert cam.shape == (3, adapter.token_flow.heads, 9, 9)
        assert (r[inputs["attention_mask"] == 0] == 0).all()
    full = build_method("lrp", rules="ours", class_token_score="keep")(model, inputs, target=1)
    torch.testing.assert_close(full.sum(dim=1), ones, rtol=0, atol=1e-6)
    words = build_method("lrp", rules="ours", text_input="word_embeddings")(model, inputs, target=1)
    assert torch.isfinite(words).all() and (words[inputs["attention_mask"] == 0] == 0).all()


def test_sequence_length_limits():
    """GPT-2's learned positions bound the length (``n_positions``); rotary positions do not."""
    ids = torch.randint(3, 40, (1, 40))
    with pytest.raises(ValueError, match="exceed"):
        adapter_for(_tiny_decoder("gpt2")).inputs.prepare(ids)
    assert adapter_for(_tiny_decoder("llama")).inputs.prepare(ids).batch_size == 1
