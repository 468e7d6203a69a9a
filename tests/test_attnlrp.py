"""AttnLRP and CP-LRP (``methods/attnlrp.py``): LXT's own outputs (``../shared/golden/attnlrp*.npz``), the
model left exactly as it was, fused attention equal to eager, conservation where the rules conserve, and the
rules' discriminating power (plain Input x Gradient is not AttnLRP)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from methods import build_method
from methods.adapters import gradient_rules
from methods.attnlrp import is_elementwise_activation
from tests.families import _clip_classifier, _clip_images, _clip_scorer, _clip_token_batch, _token_batch
from tests.lrp_passes import assert_cp_lrp_conserves_and_attnlrp_does_not

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")

GOLDEN = Path(__file__).resolve().parents[2] / "shared" / "golden"
CASES = json.loads((GOLDEN / "attnlrp.cases.json").read_text()) if (GOLDEN / "attnlrp.cases.json").exists() else []
#: the families whose adapters exist: the encoder classifiers (BERT) and the decoder LMs (GPT-2, Llama, Qwen2)
ADAPTED = {"hf_seq_cls", "hf_causal_lm"}


def _case_id(case: dict) -> str:
    return f"{case['tag']}-{case['variant']}-{case['dtype']}-{case['padding']}-{'_'.join(map(str, case['rows']))}"


@pytest.fixture(scope="module")
def golden_files():
    return np.load(GOLDEN / "attnlrp.npz"), np.load(GOLDEN / "attnlrp_f64.npz")


def _golden_model(case: dict, weights) -> nn.Module:
    prefix = case["weights_prefix"]
    state = {k[len(prefix):]: torch.from_numpy(weights[k]) for k in weights.files if k.startswith(prefix)}
    config = getattr(transformers, case["config_class"])(**case["config"])
    model = getattr(transformers, case["hf_class"])(config)
    model.load_state_dict(state, strict=True)
    return model.eval().to(getattr(torch, case["dtype"]))


def _golden_batch(case: dict, weights):
    rows = case["rows"]
    lengths = torch.from_numpy(weights[case["length_key"]][rows])
    n = int(lengths.max())
    ids = torch.from_numpy(weights[case["input_ids_key"]][rows])[:, :n]
    mask = (torch.arange(n)[None, :] < lengths[:, None]).long()
    if case["padding"] == "left":
        ids = torch.stack([torch.roll(r, n - int(length)) for r, length in zip(ids, lengths)])
        mask = torch.stack([torch.roll(r, n - int(length)) for r, length in zip(mask, lengths)])
    ids = ids.masked_fill(mask == 0, case["pad_token_id"])
    return {"input_ids": ids, "attention_mask": mask}, lengths


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_lxt_golden(case, golden_files):
    """Every shared case: ours batched (with padding where the case pads), each row against LXT's relevance of
    the sequence alone on its real tokens (tolerance from the case: 1e-4 float32, 1e-6 / 1e-5 float64, relative
    to max |golden|), exactly 0 at padding."""
    if case["model"] not in ADAPTED:
        pytest.skip(f"no adapter for {case['model']} ({case['arch']})")
    weights, f64 = golden_files
    gold_file = weights if case["dtype"] == "float32" else f64
    model = _golden_model(case, weights)
    batch, lengths = _golden_batch(case, weights)
    target = torch.from_numpy(weights[case["target_key"]][case["rows"]])
    out = build_method(case["variant"])(model, batch, target=target)
    gold = gold_file[case["golden_key"]][case["rows"]]
    for i, length in enumerate(lengths.tolist()):
        real = batch["attention_mask"][i].bool()
        ours = out[i][real].double().numpy()
        err = np.abs(ours - gold[i, :length]).max() / np.abs(gold[i, :length]).max()
        assert err <= case["tol"], f"row {case['rows'][i]}: max |ours - LXT| / max |LXT| = {err:.2e}"
        assert (out[i][~real] == 0).all()


def test_the_golden_cases_are_read():
    """``test_lxt_golden`` is parametrised by the shared cases: without them it would collect nothing."""
    assert len(CASES) == 64, f"LXT's 64 golden cases not found under {GOLDEN}"


def test_golden_discriminates_plain_input_times_gradient(golden_files):
    """The BERT golden is not plain Input x Gradient: dropping the rules moves it far beyond the tolerance."""
    weights, _ = golden_files
    case = next(c for c in CASES if c["tag"] == "bert" and c["dtype"] == "float32" and c["padding"] == "none")
    model = _golden_model(case, weights)
    batch, lengths = _golden_batch(case, weights)
    target = torch.from_numpy(weights[case["target_key"]][case["rows"]])
    emb = model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_(True)
    logit = model(inputs_embeds=emb, attention_mask=batch["attention_mask"]).logits[0, target[0]]
    plain = (emb * torch.autograd.grad(logit, emb)[0]).sum(-1)[0].detach().numpy()
    gold = weights[case["golden_key"]][case["rows"][0], :int(lengths[0])]
    assert np.abs(plain - gold).max() / np.abs(gold).max() > 0.1


# ------------------------------------------------------------------------------------------ tiny models
def _tiny_bert(bias_free: bool = False, attn_implementation: str = "eager") -> nn.Module:
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32, type_vocab_size=2,
                                     num_labels=5, pad_token_id=0, attn_implementation=attn_implementation)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_((3.0 if any(k in name for k in (".query.", ".key.")) else 0.3) * torch.randn_like(p))
            if bias_free and (name.endswith("bias") or "position_embeddings" in name or "token_type" in name):
                p.zero_()
    return model.double().eval()


def _tiny_vit(bias_free: bool = False, global_pool: str = "token") -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=3, num_heads=2, num_classes=5,
                              global_pool=global_pool)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.1 * torch.randn_like(p))
            if bias_free and (name.endswith("bias") or name in ("pos_embed", "cls_token")):
                p.zero_()
    return model.double().eval()


def _images(batch: int = 3) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(5), dtype=torch.float64)


def _bias_free_clip(tower: str) -> nn.Module:
    wrapper = _clip_classifier() if tower == "vision" else _clip_scorer()
    with torch.no_grad():
        for name, p in wrapper.named_parameters():
            if name.endswith("bias") or "position_embedding" in name or "class_embedding" in name:
                p.zero_()
    return wrapper.eval()


@pytest.mark.parametrize("variant", ["attnlrp", "cp_lrp"])
def test_logits_unchanged_model_untouched_no_class_patched(variant):
    """The rules change gradients only: the logits inside the call are the model's own, bit for bit; afterwards
    a fresh batch's forward is bit-identical, no hook is left, no class method or attention function replaced."""
    from transformers.models.bert import modeling_bert

    model = _tiny_bert()
    batch = _token_batch(3, with_types=True)
    fresh = _token_batch(2, with_types=False)
    fresh.pop("special_tokens_mask", None)
    before = model(**fresh).logits
    classes = {cls: dict(vars(cls)) for cls in (nn.LayerNorm, nn.Linear, modeling_bert.BertSelfAttention,
                                                 modeling_bert.BertIntermediate, modeling_bert.BertPooler)}
    functions = dict(modeling_bert.ALL_ATTENTION_FUNCTIONS)
    report = build_method(variant).relevance_by_layer(model, batch, target=torch.tensor([0, 3, 1]))
    stock = model(**{k: v for k, v in batch.items() if k != "special_tokens_mask"}).logits
    assert torch.equal(report["logit"], stock.gather(1, torch.tensor([[0], [3], [1]]))[:, 0])
    build_method(variant)(model, batch, target=torch.tensor([0, 3, 1]))
    assert torch.equal(model(**fresh).logits, before)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert {cls: dict(vars(cls)) for cls in classes} == classes
    assert dict(modeling_bert.ALL_ATTENTION_FUNCTIONS) == functions
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("variant", ["attnlrp", "cp_lrp"])
def test_fused_attention_gives_the_eager_maps_and_stays_fused(variant):
    """The methods never read attention probabilities, so they keep the model's fused / sdpa attention: the
    maps equal the eager model's (float64), and the setting is unchanged."""
    method = build_method(variant)
    batch = _token_batch(3, with_types=True)
    eager = method(_tiny_bert(), batch, target=torch.tensor([0, 3, 1]))
    sdpa_model = _tiny_bert(attn_implementation="sdpa")
    sdpa = method(sdpa_model, batch, target=torch.tensor([0, 3, 1]))
    assert sdpa_model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(sdpa, eager, rtol=1e-10, atol=1e-12)

    vit = _tiny_vit()
    for block in vit.blocks:
        block.attn.fused_attn = False
    slow = method(vit, _images(), target=torch.tensor([0, 1, 2]))
    for block in vit.blocks:
        block.attn.fused_attn = True
    fused = method(vit, _images(), target=torch.tensor([0, 1, 2]))
    assert all(block.attn.fused_attn for block in vit.blocks)
    torch.testing.assert_close(fused, slow, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("family", ["timm_vit_cls", "timm_vit_avgpool", "bert", "clip_vision", "clip_text"])
def test_cp_lrp_conserves_exactly_on_bias_free_models(family):
    """CP-LRP without biases (and without position / token-type embeddings, [CLS] at 0) is exactly linear in
    the embeddings: the relevance entering every block, and the input scores' sum, equal the explained logit
    (float64). AttnLRP's softmax by its gradient does not conserve: measured, its block sums differ."""
    model, inputs = {
        "timm_vit_cls": lambda: (_tiny_vit(True), _images()),
        "timm_vit_avgpool": lambda: (_tiny_vit(True, "avg"), _images()),
        "bert": lambda: (_tiny_bert(bias_free=True), _token_batch(3, with_types=True)),
        "clip_vision": lambda: (_bias_free_clip("vision"), _clip_images(3)),
        "clip_text": lambda: (_bias_free_clip("text"), _clip_token_batch(3)),
    }[family]()
    target = torch.tensor([1, 4, 0])
    assert_cp_lrp_conserves_and_attnlrp_does_not(model, inputs, target, 1e-9)


def test_pixel_level_and_its_checks():
    vit = _tiny_vit()
    pixels = build_method("attnlrp", level="pixels")(vit, _images(), target=torch.tensor([0, 1, 2]))
    assert pixels.shape == (3, 32, 32)
    report = build_method("cp_lrp", level="pixels").relevance_by_layer(_tiny_vit(True), _images(), torch.tensor(1))
    torch.testing.assert_close(report["input"], report["logit"], rtol=0, atol=1e-9 * float(report["logit"].abs().max()))
    clip = build_method("attnlrp", level="pixels")(_clip_classifier(), _clip_images(2), target=torch.tensor([0, 1]))
    assert clip.shape == (2, 16, 16)
    with pytest.raises(ValueError, match="level='pixels' needs an image model.*BertForSequenceClassification"):
        build_method("attnlrp", level="pixels")(_tiny_bert(), _token_batch(2, with_types=False))
    with pytest.raises(ValueError, match="level must be one of"):
        build_method("cp_lrp", level="words")
    with pytest.raises(ValueError, match="epsilon must be >= 0"):
        build_method("attnlrp", epsilon=-1.0)


def test_gated_mlp_is_refused_naming_the_block():
    from timm.layers import SwiGLU
    from timm.models.vision_transformer import VisionTransformer

    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2, num_classes=5,
                              mlp_layer=SwiGLU)
    with pytest.raises(TypeError, match="attnlrp: no relevance rule.*block 0 gated mlp SwiGLU"):
        build_method("attnlrp").check(model)


def test_the_variants_and_the_rules_differ():
    """AttnLRP, CP-LRP and the identity-rule-free map are three different maps on the same model."""
    model, batch, target = _tiny_vit(), _images(), torch.tensor([0, 1, 2])
    attn = build_method("attnlrp")(model, batch, target=target)
    cp = build_method("cp_lrp")(model, batch, target=target)
    loose = build_method("attnlrp", epsilon=1e3)(model, batch, target=target)
    for other in (cp, loose):
        assert (attn - other).abs().max() > 1e-3 * attn.abs().max()


def test_activation_modules_are_found_by_type():
    from timm.layers.activations import GELUTanh
    from transformers.activations import GELUActivation, QuickGELUActivation

    for module in (nn.GELU(), nn.Tanh(), nn.ReLU(), GELUActivation(), QuickGELUActivation(), GELUTanh()):
        assert is_elementwise_activation(module), type(module).__name__
    for module in (nn.Softmax(dim=-1), nn.GLU(), nn.Linear(2, 2), nn.LayerNorm(2)):
        assert not is_elementwise_activation(module), type(module).__name__


def test_gamma_rule_options(monkeypatch):
    """``gamma`` (every Linear) and ``conv_gamma`` (the patch convolution, at the pixels) as LXT's ViT example
    sets them through zennit: a different map; gamma 0 is the plain map up to zennit's stabiliser; CP-LRP on a
    bias-free model conserves up to what that stabiliser (1e-6 on each layer's modified output) absorbs
    (measured here: 1.5e-4 of the logit), and exactly once it is made negligible."""
    model, images, target = _tiny_vit(), _images(), torch.tensor([0, 1, 2])
    plain = build_method("attnlrp")(model, images, target=target)
    zero = build_method("attnlrp", gamma=0.0)(model, images, target=target)
    tuned = build_method("attnlrp", gamma=0.25)(model, images, target=target)
    assert (zero - plain).abs().max() < 1e-2 * plain.abs().max()
    assert (tuned - plain).abs().max() > 1e-1 * plain.abs().max()
    method = build_method("cp_lrp", level="pixels", gamma=0.25, conv_gamma=0.1)
    report = method.relevance_by_layer(_tiny_vit(True), images, target)
    scale = float(report["logit"].abs().max())
    for sums in list(report["blocks"]) + [report["input"]]:
        torch.testing.assert_close(sums, report["logit"], rtol=0, atol=1e-3 * scale)
    stabilize = gradient_rules._stabilize
    monkeypatch.setattr(gradient_rules, "_stabilize", lambda z, eps: stabilize(z, 1e-14 if eps == 1e-6 else eps))
    report = method.relevance_by_layer(_tiny_vit(True), images, target)
    for sums in list(report["blocks"]) + [report["input"]]:
        torch.testing.assert_close(sums, report["logit"], rtol=0, atol=1e-7 * scale)
    with pytest.raises(ValueError, match="gamma must be >= 0"):
        build_method("attnlrp", gamma=-0.5)


def test_patch_level_is_the_pixels_share_of_each_patch():
    """``level="patches"``: the pixel relevance summed per patch (row-major), which equals the patch-token relevance
    (the default level) exactly when the patch embedding has no bias (the bias share is what differs)."""
    images, target = _images(), torch.tensor([0, 1, 2])
    model = _tiny_vit()
    auto = build_method("attnlrp", level="patches")(model, images, target=target)
    pixels = build_method("attnlrp", level="pixels")(model, images, target=target)
    per_patch = pixels.reshape(3, 4, 8, 4, 8).sum(dim=(2, 4)).flatten(1)
    torch.testing.assert_close(auto, per_patch, rtol=1e-12, atol=1e-14)
    tokens = build_method("attnlrp", level="tokens")(model, images, target=target)
    assert (tokens - auto).abs().max() > 1e-3 * auto.abs().max()
    with torch.no_grad():
        model.patch_embed.proj.bias.zero_()
    torch.testing.assert_close(build_method("attnlrp")(model, images, target=target),
                               build_method("attnlrp", level="patches")(model, images, target=target),
                               rtol=1e-9, atol=1e-12)
