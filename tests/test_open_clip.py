"""open_clip's CLIP through the zero-shot wrappers: attention probabilities and their gradient (against an explicit
attention), LRP conservation, AttnLRP's factors on ``nn.MultiheadAttention``, open_clip's own tokenizer offline,
the ``open_clip:`` source with a local checkpoint, and the variants that are refused with a reason."""
from __future__ import annotations

import json
import math

import pytest
import torch
from torch.nn import functional as F

from methods import MethodUndefinedError, build_method
from methods.adapters import ActivationRecorder, adapter_for
from methods.attnlrp import _attention_inputs_hook
from tests.families.open_clip import (
    EOT,
    _open_clip_classifier,
    _open_clip_ids,
    _open_clip_images,
    _open_clip_scorer,
    _tiny_open_clip,
)
from tests.lrp_passes import head_relevance

open_clip = pytest.importorskip("open_clip")


def _explicit_forward(adapter, prepared, layer: int):
    """The tower's forward with block ``layer``'s attention written out (``A = softmax(q k^T / sqrt(d) + mask)``,
    ``out_proj(A v)``): ``(logits, A)`` with ``A`` a node of the graph."""
    context = adapter.inputs.context(prepared)
    hidden = adapter.run_blocks(adapter.embed(prepared), context, 0, layer)
    block = adapter.blocks[layer]
    attn = block.attn
    batch, tokens, dim = hidden.shape
    heads = attn.num_heads
    q, k, v = F.linear(block.ln_1(hidden), attn.in_proj_weight, attn.in_proj_bias).chunk(3, dim=-1)
    q, k, v = (t.reshape(batch, tokens, heads, dim // heads).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(dim // heads)
    mask = adapter.block_mask(hidden)
    if mask is not None:
        scores = scores + mask.to(scores)
    probabilities = scores.softmax(dim=-1)
    out = F.linear((probabilities @ v).transpose(1, 2).reshape(batch, tokens, dim), attn.out_proj.weight,
                   attn.out_proj.bias)
    hidden = hidden + block.ls_1(out)
    hidden = hidden + block.ls_2(block.mlp(block.ln_2(hidden)))
    hidden = adapter.run_blocks(hidden, context, layer + 1)
    return adapter.head(hidden, context), probabilities


@pytest.mark.parametrize("tower", ["vision", "text"])
def test_attention_and_its_gradient_equal_an_explicit_attention(tower):
    model = (_open_clip_classifier() if tower == "vision" else _open_clip_scorer()).eval()
    inputs = _open_clip_images(3) if tower == "vision" else _open_clip_ids(3)
    adapter = adapter_for(model)
    prepared = adapter.inputs.prepare(inputs)
    layer, target = 1, torch.tensor([1, 4, 0])
    with adapter.recording.eager_attention(), ActivationRecorder() as rec:
        adapter.recording.attention(rec, layer, "a", require_grad=True)
        logits = adapter.forward(prepared, grad_from_block=layer)
        (grad,) = torch.autograd.grad(logits.gather(1, target[:, None]).sum(), rec["a"])
    with torch.enable_grad():
        ref_logits, probabilities = _explicit_forward(adapter, prepared, layer)
        (ref_grad,) = torch.autograd.grad(ref_logits.gather(1, target[:, None]).sum(), probabilities)
    with torch.no_grad():
        own = model(inputs)
    torch.testing.assert_close(logits, own, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ref_logits, own, rtol=1e-10, atol=1e-10)
    n = 17 if tower == "vision" else 12
    assert rec["a"].shape == (3, 2, n, n)
    torch.testing.assert_close(rec["a"], probabilities, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-8, atol=1e-10 * float(ref_grad.abs().max()))
    assert float(ref_grad.abs().max()) > 0
    if tower == "text":   # causal: no probability above the diagonal
        assert (rec["a"].detach().triu(1) == 0).all()


def test_eager_attention_leaves_no_hook_and_does_not_change_the_logits():
    model = _open_clip_classifier().eval()
    x = _open_clip_images(2)
    adapter = adapter_for(model)
    with torch.no_grad():
        fused = adapter.forward(adapter.inputs.prepare(x))
        with adapter.recording.eager_attention():
            eager = adapter.forward(adapter.inputs.prepare(x))
    torch.testing.assert_close(eager, fused, rtol=1e-12, atol=1e-12)
    assert sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules()) == 0


@pytest.mark.parametrize("build, inputs", [
    (lambda: _open_clip_classifier(), lambda: _open_clip_images(3)),
    (lambda: _open_clip_classifier(pool="avg", final_ln_after_pool=True, logit_bias=-2.0),
     lambda: _open_clip_images(3)),
    (lambda: _open_clip_classifier(pool="avg"), lambda: _open_clip_images(3)),
    (lambda: _open_clip_scorer(), lambda: _open_clip_ids(3)),
    (lambda: _open_clip_scorer(text_pool="eos", proj_bias=False), lambda: _open_clip_ids(3)),
    (lambda: _open_clip_classifier(layer_scale=0.5), lambda: _open_clip_images(3)),
    (lambda: _open_clip_scorer(text_pool="eos", layer_scale=0.5), lambda: _open_clip_ids(3)),
], ids=["vision_tok", "vision_avg_ln_after_pool_bias", "vision_avg", "text_argmax", "text_eos",
        "vision_tok_layer_scale", "text_eos_layer_scale"])
def test_lrp_conserves_relevance(build, inputs):
    """With the conservative ``"ours"`` rules the relevance entering every block sums to the one-hot target (1)
    per sample (as for transformers' CLIP, ``tests/test_clip.py``)."""

    model, inputs = build().eval(), inputs()
    start = head_relevance(model, inputs, readout_positions=True)
    adapter, engine, topology, acts, r = start.adapter, start.engine, start.topology, start.acts, start.relevance
    ones = torch.ones(3, dtype=torch.float64)
    torch.testing.assert_close(r.sum(dim=(1, 2)), ones, rtol=0, atol=1e-6)
    for layer in reversed(range(len(adapter.blocks))):
        r, _ = topology.block_relprop(engine.rules, acts, layer, r, True)
        torch.testing.assert_close(r.sum(dim=(1, 2)), ones, rtol=0, atol=1e-6)
    full = build_method("lrp", rules="ours", class_token_score="keep")(model, inputs, target=1)
    if adapter.tower == "vision":
        assert full.shape == (3, 16, 16) and torch.isfinite(full).all()
    else:
        torch.testing.assert_close(full.sum(dim=1), ones, rtol=0, atol=1e-6)


def test_attnlrp_factors_act_on_the_three_inputs_of_multihead_attention():
    """The pre-hook keeps the values and gives the input the gradient ``fq g_q + fk g_k + fv g_v`` (the factors of
    the uniform rule on q, k, v), what a module with separate projections gets from hooks on them."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 5, 8, dtype=torch.float64)
    handle = mha.register_forward_pre_hook(_attention_inputs_hook((0.25, 0.25, 0.5)), with_kwargs=True)
    try:
        out = mha(x, x, x, need_weights=False)[0]
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad((out * weight).sum(), x)
    parts = [x.detach().clone().requires_grad_(True) for _ in range(3)]
    ref = mha(*parts, need_weights=False)[0]
    grads = torch.autograd.grad((ref * weight).sum(), parts)
    torch.testing.assert_close(out, mha(x, x, x, need_weights=False)[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, 0.25 * grads[0] + 0.25 * grads[1] + 0.5 * grads[2], rtol=1e-10, atol=1e-12)


def test_attnlrp_refuses_the_gamma_rule_on_multihead_attention():
    with pytest.raises(MethodUndefinedError, match="applies in_proj_weight and out_proj functionally"):
        build_method("attnlrp", gamma=0.25)(_open_clip_classifier(), _open_clip_images(1), target=0)


# --------------------------------------------------------------------------------------------- wrappers, tokenizer
def test_wrappers_give_open_clips_own_logits_with_logit_bias():
    from models.clip import PromptScorer, ZeroShotClassifier

    clip = _tiny_open_clip(logit_bias=-1.5).double().eval()
    images, ids = _open_clip_images(3), _open_clip_ids(3)
    with torch.no_grad():
        per_image, per_text = clip.get_logits(images, ids)
        classifier = ZeroShotClassifier(clip, clip.encode_text(ids))
        scorer = PromptScorer(clip, images)
        torch.testing.assert_close(classifier(images), per_image, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(scorer(ids), per_text, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(scorer({"input_ids": ids}), per_text, rtol=1e-12, atol=1e-12)
    assert classifier.pretrained_cfg["input_size"] == (3, 16, 16)
    assert classifier.pretrained_cfg["mean"] == tuple(open_clip.OPENAI_DATASET_MEAN)
    with pytest.raises(ValueError, match="takes no attention_mask"):
        scorer(ids, attention_mask=torch.ones_like(ids))


def test_from_prompts_with_open_clips_own_tokenizer_offline():
    """``SimpleTokenizer`` ships its BPE vocabulary inside open_clip: ``get_tokenizer`` builds it offline. Class
    embeddings follow OpenAI's recipe (mean of the normalised prompt embeddings, normalised)."""
    from models.clip import ZeroShotClassifier

    clip = _tiny_open_clip(vocab=49408).eval()
    tokenizer = open_clip.get_tokenizer("ViT-B-32", context_length=12)
    templates = ["a photo of a {}.", "a drawing of a {}."]
    classifier = ZeroShotClassifier.from_prompts(clip, tokenizer, ["cat", "dog"], templates)
    with torch.no_grad():
        expected = []
        for name in ("cat", "dog"):
            embedded = F.normalize(clip.encode_text(tokenizer([t.format(name) for t in templates])), dim=-1)
            expected.append(F.normalize(embedded.mean(dim=0), dim=-1))
    torch.testing.assert_close(classifier.class_embeddings, torch.stack(expected), rtol=1e-6, atol=1e-7)
    ids = tokenizer(["a cat"])
    assert int(ids[0, 0]) == tokenizer.sot_token_id and int(ids[0].argmax()) == 3 and int(ids[0, 4:].abs().sum()) == 0
    with pytest.raises(ValueError, match="context_length is 12"):
        ZeroShotClassifier.from_prompts(clip, open_clip.get_tokenizer("ViT-B-32"), ["cat"], templates)


def test_text_layout_counts_positions_up_to_the_eos():
    model = _open_clip_scorer()
    adapter = adapter_for(model)
    ids = _open_clip_ids(3)
    layout = adapter.inputs.layout(ids)
    eos = (ids == EOT).int().argmax(dim=1)
    assert layout.attention_mask.sum(dim=1).tolist() == (eos + 1).tolist()
    assert layout.content_mask.sum(dim=1).tolist() == (eos - 1).tolist()
    assert adapter.inputs.context(adapter.inputs.prepare(ids)).attention_mask is None


# --------------------------------------------------------------------------------------------- open_clip: source
TINY_CONFIG = {"embed_dim": 8,
               "vision_cfg": {"image_size": 16, "patch_size": 4, "width": 24, "layers": 2, "head_width": 12,
                              "mlp_ratio": 2.0},
               "text_cfg": {"context_length": 12, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 2,
                            "mlp_ratio": 2.0}}


def test_open_clip_spec_loads_a_local_checkpoint(tmp_path):
    from safetensors.torch import save_file

    from models.clip import ZeroShotClassifier
    from models.sources import load_model

    name = "tiny-token-attributions-test"
    (tmp_path / f"{name}.json").write_text(json.dumps(TINY_CONFIG))
    open_clip.add_model_config(tmp_path / f"{name}.json")
    torch.manual_seed(3)
    clip = open_clip.create_model(name, pretrained=None).eval()
    checkpoint = tmp_path / "weights.pt"
    torch.save(clip.state_dict(), checkpoint)
    prompts = {"prompts": "custom", "classnames": ["cat", "dog", "car"], "templates": ["a photo of a {}."]}
    expected = ZeroShotClassifier.from_prompts(clip, open_clip.get_tokenizer(name), prompts["classnames"],
                                               prompts["templates"])
    images = torch.randn(2, 3, 16, 16)
    loaded = load_model(f"open_clip:{name}", model_kwargs={**prompts, "checkpoint": str(checkpoint)})
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), expected(images), rtol=0, atol=0)
    assert loaded.classnames == ["cat", "dog", "car"] and loaded.source == name
    assert loaded.pretrained_cfg["input_size"] == (3, 16, 16)

    folder = tmp_path / "snapshot"                      # open_clip's own layout, as a hub snapshot holds it
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CONFIG, "preprocess_cfg": {}}))
    save_file({k: v.contiguous() for k, v in clip.state_dict().items()}, folder / "open_clip_model.safetensors")
    snapshot = load_model(f"open_clip:local-dir:{folder}", model_kwargs=prompts)
    with torch.no_grad():
        torch.testing.assert_close(snapshot(images), expected(images), rtol=0, atol=0)
    randomly = load_model(f"open_clip:{name}", pretrained=False, model_kwargs=prompts)
    with torch.no_grad():
        assert not torch.allclose(randomly(images), expected(images))

    with pytest.raises(ValueError, match="model_kwargs.checkpoint"):
        load_model(f"open_clip:{name}", model_kwargs=prompts)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(f"open_clip:{name}", model_kwargs={**prompts, "checkpoint": str(tmp_path / "missing.pt")})
    with pytest.raises(ValueError, match="hf-hub: names are downloaded"):
        load_model("open_clip:hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K", model_kwargs=prompts)
    with pytest.raises(ValueError, match="unknown model_kwargs"):
        load_model(f"open_clip:{name}", model_kwargs={**prompts, "precision": "fp16"})
    with pytest.raises(ValueError, match="no saved prompt set"):
        load_model(f"open_clip:{name}", model_kwargs={"checkpoint": str(checkpoint)})


# --------------------------------------------------------------------------------------------- refused
def test_unsupported_towers_and_bad_inputs_are_named():
    from models.clip import PromptScorer, ZeroShotClassifier

    classes = torch.randn(3, 8)
    vision = dict(image_size=16, patch_size=4, width=24, layers=1, head_width=12)
    text = dict(context_length=12, vocab_size=40, width=16, heads=2, layers=1)
    pooled = open_clip.model.CLIP(8, {**vision, "attentional_pool": True, "attn_pooler_queries": 4,
                                      "attn_pooler_heads": 2}, text)
    with pytest.raises(TypeError, match="attention pooling"):
        adapter_for(ZeroShotClassifier(pooled, classes))
    custom = open_clip.model.CLIP(8, {**vision, "qk_norm": True}, text)
    with pytest.raises(TypeError, match="CustomResidualAttentionBlock"):
        adapter_for(ZeroShotClassifier(custom, classes))
    bidirectional = open_clip.model.CLIP(8, vision, {**text, "no_causal_mask": True})
    with pytest.raises(TypeError, match="without its causal mask"):
        adapter_for(PromptScorer(bidirectional, image_embeddings=classes))
    with pytest.raises(TypeError, match="wrap it as models.clip.ZeroShotClassifier"):
        adapter_for(_tiny_open_clip())

    method = build_method("gradcam")
    scorer, ids = _open_clip_scorer(), _open_clip_ids(2)
    with pytest.raises(ValueError, match="takes no attention_mask"):
        method(scorer, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    with pytest.raises(ValueError, match="pad to context_length"):
        method(scorer, ids[:, :9])
    with pytest.raises(ValueError, match="hold no EOS token"):
        method(_open_clip_scorer(text_pool="eos"), ids.clamp(max=EOT - 1))
    with pytest.raises(ValueError, match="does not match the open_clip vision tower's image_size"):
        method(_open_clip_classifier(), torch.randn(1, 3, 32, 32, dtype=torch.float64))
