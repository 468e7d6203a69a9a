"""The contract every registered method keeps on every registered model family.

For each (family, method): the output shape and layout, exact zeros at padding positions, a batched call equal
to per-sample calls (each sample alone, without padding), the model restored exactly (weights, train/eval
flags, requires_grad, attention implementation, no hooks left) and no parameter ``.grad`` written.

A new family adds one :class:`Family` to ``FAMILIES``: a tiny random model (float64, so that batched and
per-sample calls can be compared tightly), a batch builder and the per-sample split.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import pytest
import torch
from torch import Tensor, nn

from methods import available_methods, build_method, method_class
from methods.adapters import ADAPTERS, adapter_for

timm = pytest.importorskip("timm")


#: the methods whose output on images is a pixel map [B, H, W] (every other method: patch scores [B, P])
PIXEL_MAPS = ("lrp",)


@dataclass
class Family:
    """A model factory and how to batch and split its inputs.

    ``inputs(batch)``: a batch as a user passes it (a tensor or a mapping); ``single(inputs, i)``: sample ``i``
    alone, without padding; ``positions(inputs, i)``: the output positions of sample ``i`` inside the batched
    output row (``slice(None)`` without padding); ``padding(inputs)``: a bool ``[B, N]`` mask of padded output
    positions, or ``None``; ``shape(inputs, pixels)``: the expected output shape (``pixels``: the method is one of
    :data:`PIXEL_MAPS`); ``options``: method options the tiny model needs.
    """

    name: str
    adapter: type
    build: Callable[[], nn.Module]
    inputs: Callable[[int], object]
    single: Callable[[object, int], object]
    shape: Callable[[object, bool], tuple]
    positions: Callable[[object, int], slice] = lambda inputs, i: slice(None)
    padding: Callable[[object], Optional[Tensor]] = lambda inputs: None
    options: Optional[dict] = None
    logits: Callable[[nn.Module, object], Tensor] = lambda model, inputs: model(inputs)


def _tiny_vit(global_pool: str) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=3, num_heads=2, num_classes=5,
                              global_pool=global_pool, class_token=True)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.double()


def _images(batch: int) -> Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch), dtype=torch.float64)


def _image_family(name: str, global_pool: str) -> Family:
    from methods.adapters import TimmViTAdapter

    return Family(
        name=name, adapter=TimmViTAdapter, build=lambda: _tiny_vit(global_pool), inputs=_images,
        single=lambda x, i: x[i:i + 1],
        shape=lambda x, pixels: (x.shape[0], 32, 32) if pixels else (x.shape[0], 16),
        options={"beyond_intuition_head": {"start_layer": 1, "steps": 4},
                 "beyond_intuition_token": {"start_layer": 1, "steps": 4}},
    )


def _tiny_text(kind: str = "bert", seed: int = 0) -> nn.Module:
    """A tiny random ``transformers`` classifier (3 blocks, 2 heads, width 16, 5 labels, [PAD] = 0)."""
    transformers = pytest.importorskip("transformers")
    if kind == "distilbert":
        config = transformers.DistilBertConfig(vocab_size=40, dim=16, n_layers=3, n_heads=2, hidden_dim=32,
                                               max_position_embeddings=32, num_labels=5, pad_token_id=0)
        model_class = transformers.DistilBertForSequenceClassification
    else:
        config_class, model_class = {
            "bert": (transformers.BertConfig, transformers.BertForSequenceClassification),
            "roberta": (transformers.RobertaConfig, transformers.RobertaForSequenceClassification),
            "electra": (transformers.ElectraConfig, transformers.ElectraForSequenceClassification),
        }[kind]
        extra = {"embedding_size": 8} if kind == "electra" else {}   # ELECTRA-small's embedding projection
        config = config_class(vocab_size=40, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                              intermediate_size=32, max_position_embeddings=32, type_vocab_size=2, num_labels=5,
                              pad_token_id=0, **extra)
    torch.manual_seed(seed)
    model = model_class(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            sharp = any(k in name for k in (".query.", ".key.", ".q_lin.", ".k_lin."))
            p.add_((3.0 if sharp else 0.3) * torch.randn_like(p))
    return model.double()


def _tiny_bert(seed: int = 0) -> nn.Module:
    return _tiny_text("bert", seed)


#: real lengths of the samples of a text batch (the last one is padded)
TEXT_LENGTHS = (9, 9, 6)


def _token_batch(batch: int, with_types: bool, with_special: bool = None) -> dict:
    gen = torch.Generator().manual_seed(100 + batch)
    lengths = TEXT_LENGTHS[:batch] if batch <= len(TEXT_LENGTHS) else (9,) * batch
    n = max(lengths)
    ids = torch.randint(3, 40, (batch, n), generator=gen)
    mask = torch.zeros(batch, n, dtype=torch.long)
    special = torch.zeros(batch, n, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
        ids[i, 0], ids[i, length - 1] = 1, 2          # [CLS] ... [SEP]
        ids[i, length:] = 0                            # [PAD]
        special[i, 0] = special[i, length - 1] = 1
        special[i, length:] = 1
    inputs = {"input_ids": ids, "attention_mask": mask}
    if with_types:
        types = torch.zeros(batch, n, dtype=torch.long)
        types[:, 4:] = 1
        inputs.update(token_type_ids=types * mask)
    if with_types if with_special is None else with_special:
        inputs.update(special_tokens_mask=special)
    return inputs


def _text_family(name: str, kind: str, with_types: bool, with_special: bool = None) -> Family:
    from methods.adapters import HFBertAdapter, HFDistilBertAdapter, HFElectraAdapter, HFRobertaAdapter

    adapter = {"bert": HFBertAdapter, "roberta": HFRobertaAdapter, "distilbert": HFDistilBertAdapter,
               "electra": HFElectraAdapter}[kind]

    def length(inputs, i):
        return int(inputs["attention_mask"][i].sum())

    return Family(
        name=name, adapter=adapter, build=lambda: _tiny_text(kind),
        inputs=lambda b: _token_batch(b, with_types, with_special),
        single=lambda x, i: {k: v[i:i + 1, :length(x, i)] for k, v in x.items()},
        positions=lambda x, i: slice(0, length(x, i)),
        padding=lambda x: x["attention_mask"] == 0,
        shape=lambda x, pixels: tuple(x["input_ids"].shape),
        options={"beyond_intuition_head": {"steps": 4}, "beyond_intuition_token": {"steps": 4}},
        logits=lambda model, x: model(**{k: v for k, v in x.items() if k != "special_tokens_mask"}).logits,
    )


def _tiny_clip(seed: int = 0) -> nn.Module:
    """A tiny random ``transformers.CLIPModel``: vision 16x16 images, 4x4 patches, width 24, 3 blocks, 2 heads;
    text vocabulary 40 (start 38, end 39, padding 0), 12 positions, width 16, 3 blocks, 2 heads; 8-d joint
    space."""
    transformers = pytest.importorskip("transformers")
    config = transformers.CLIPConfig(
        text_config=dict(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                         num_attention_heads=2, max_position_embeddings=12, bos_token_id=38, eos_token_id=39,
                         pad_token_id=0),
        vision_config=dict(hidden_size=24, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
                           image_size=16, patch_size=4),
        projection_dim=8)
    torch.manual_seed(seed)
    model = transformers.CLIPModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            sharp = any(k in name for k in ("q_proj", "k_proj"))
            p.add_((3.0 if sharp else 0.3) * torch.randn_like(p))
    return model


def _clip_classifier() -> nn.Module:
    from models.clip import ZeroShotClassifier

    clip = _tiny_clip()
    classes = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    return ZeroShotClassifier(clip, classes).double()


def _clip_scorer() -> nn.Module:
    from models.clip import PromptScorer

    clip = _tiny_clip()
    return PromptScorer(clip, image_embeddings=torch.randn(5, 8, generator=torch.Generator().manual_seed(2))).double()


def _clip_images(batch: int) -> Tensor:
    return torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(batch), dtype=torch.float64)


def _clip_token_batch(batch: int, with_special: bool = False) -> dict:
    """CLIP-style texts: start token 38 ... end token 39, then padding (id 0, mask 0); lengths ``TEXT_LENGTHS``."""
    inputs = _token_batch(batch, with_types=False, with_special=with_special)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    ids = ids.clamp(max=37)
    for i, length in enumerate(mask.sum(dim=1).tolist()):
        ids[i, 0], ids[i, length - 1] = 38, 39
        ids[i, length:] = 0
    inputs["input_ids"] = ids
    return inputs


def _clip_families() -> list:
    from methods.adapters import HFCLIPTextAdapter, HFCLIPVisionAdapter

    def length(inputs, i):
        return int(inputs["attention_mask"][i].sum())

    bi = {"beyond_intuition_head": {"start_layer": 1, "steps": 4},
          "beyond_intuition_token": {"start_layer": 1, "steps": 4}}
    vision = Family(
        name="hf_clip_vision", adapter=HFCLIPVisionAdapter, build=_clip_classifier, inputs=_clip_images,
        single=lambda x, i: x[i:i + 1], shape=lambda x, pixels: (x.shape[0], 16, 16) if pixels
        else (x.shape[0], 16), options=bi)
    text = [Family(
        name=name, adapter=HFCLIPTextAdapter, build=_clip_scorer,
        inputs=lambda b, special=special: _clip_token_batch(b, special),
        single=lambda x, i: {k: v[i:i + 1, :length(x, i)] for k, v in x.items()},
        positions=lambda x, i: slice(0, length(x, i)),
        padding=lambda x: x["attention_mask"] == 0,
        shape=lambda x, pixels: tuple(x["input_ids"].shape),
        options={"beyond_intuition_head": {"steps": 4}, "beyond_intuition_token": {"steps": 4}},
        logits=lambda model, x: model(x)) for name, special in (("hf_clip_text", False),
                                                                ("hf_clip_text_special", True))]
    return [vision] + text


#: the decoder families of the contract: (name, kind, head, padding side)
DECODERS = (("hf_gpt2_left", "gpt2", "lm", "left"), ("hf_llama_gqa_left", "llama", "lm", "left"),
            ("hf_mistral_sliding_right", "mistral", "lm", "right"), ("hf_qwen2_left", "qwen2", "lm", "left"),
            ("hf_qwen3_right", "qwen3", "lm", "right"), ("hf_gemma3_left", "gemma3", "lm", "left"),
            ("hf_llama_seq_cls_right", "llama", "seq_cls", "right"), ("hf_gpt2_seq_cls_right", "gpt2", "seq_cls",
                                                                       "right"))
DECODER_KINDS = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma3")


def _tiny_decoder(kind: str, head: str = "lm", seed: int = 0, bias_free: bool = False,
                  attn_implementation: Optional[str] = None) -> nn.Module:
    """A tiny random ``transformers`` decoder (3 layers, width 16, vocabulary 40, BOS 1, EOS 2, [PAD] 0), float64:
    GPT-2 (2 heads); Llama with grouped-query attention (4 heads, 2 key/value heads); Mistral with a sliding
    window of 4; Qwen2 (q/k/v biases, its last two layers sliding); Qwen3 (q/k norms); Gemma 3 (local/global
    layers, final logit soft-capping). ``head``: ``"lm"`` (``*ForCausalLM``) or ``"seq_cls"`` (5 classes)."""
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=40, bos_token_id=1, eos_token_id=2, pad_token_id=0, num_labels=5)
    if attn_implementation is not None:
        common["attn_implementation"] = attn_implementation
    rope = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=32, **common)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_embd=16, n_layer=3, n_head=2, n_positions=32, n_inner=32, **common)
        name = "GPT2LMHeadModel" if head == "lm" else "GPT2ForSequenceClassification"
    elif kind == "gemma3":
        config = transformers.Gemma3TextConfig(head_dim=4, sliding_window=4, final_logit_softcapping=5.0,
                                               layer_types=["sliding_attention", "full_attention",
                                                            "sliding_attention"], **rope)
        name = "Gemma3ForCausalLM" if head == "lm" else "Gemma3TextForSequenceClassification"
    else:
        extra = {"mistral": dict(sliding_window=4), "qwen2": dict(use_sliding_window=True, sliding_window=4,
                                                                   max_window_layers=1),
                 "qwen3": dict(head_dim=4)}.get(kind, {})
        prefix = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}[kind]
        config = getattr(transformers, f"{prefix}Config")(**rope, **extra)
        name = f"{prefix}ForCausalLM" if head == "lm" else f"{prefix}ForSequenceClassification"
    torch.manual_seed(seed)
    model = getattr(transformers, name)(config)
    with torch.no_grad():
        for key, p in model.named_parameters():
            sharp = any(k in key for k in ("q_proj.weight", "k_proj.weight", "c_attn.weight"))
            p.add_((3.0 if sharp else 0.3) * torch.randn_like(p))
            if bias_free and (key.endswith("bias") or "wpe" in key):
                p.zero_()
    return model.double()


def _decoder_batch(batch: int, side: str, with_special: bool = False) -> dict:
    """Token batches of lengths ``TEXT_LENGTHS`` (BOS 1 first, ids 3..39, [PAD] 0), padded on ``side``."""
    inputs = _token_batch(batch, with_types=False, with_special=with_special)
    ids, mask = inputs["input_ids"].clone(), inputs["attention_mask"]
    for i, length in enumerate(mask.sum(dim=1).tolist()):
        ids[i, length - 1] = 3 + i                     # no EOS: the text goes on after it
    inputs["input_ids"] = ids
    if side == "left":
        n = ids.shape[1]
        lengths = mask.sum(dim=1).tolist()
        inputs = {k: torch.stack([torch.roll(r, n - length) for r, length in zip(v, lengths)])
                  for k, v in inputs.items()}
    return inputs


def _decoder_logits(model: nn.Module, inputs: dict) -> Tensor:
    """The stock model's logits at each row's last real token (position ids from the mask, as ``generate``)."""
    mask = inputs["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=inputs["input_ids"], attention_mask=mask, position_ids=positions).logits
    if logits.dim() == 2:
        return logits
    last = (mask * torch.arange(1, mask.shape[1] + 1)).argmax(dim=-1)
    return logits[torch.arange(mask.shape[0]), last]


def _decoder_family(name: str, kind: str, head: str, side: str) -> Family:
    from methods.adapters import (
        HFGemma3Adapter,
        HFGPT2Adapter,
        HFLlamaAdapter,
        HFMistralAdapter,
        HFQwen2Adapter,
        HFQwen3Adapter,
    )

    adapter = {"gpt2": HFGPT2Adapter, "llama": HFLlamaAdapter, "mistral": HFMistralAdapter,
               "qwen2": HFQwen2Adapter, "qwen3": HFQwen3Adapter, "gemma3": HFGemma3Adapter}[kind]

    def real(inputs, i):
        return inputs["attention_mask"][i].bool()

    def positions(inputs, i):
        where = real(inputs, i).nonzero().flatten()
        return slice(int(where[0]), int(where[-1]) + 1)

    return Family(
        name=name, adapter=adapter, build=lambda: _tiny_decoder(kind, head),
        inputs=lambda b: _decoder_batch(b, side, with_special=(kind == "qwen3")),
        single=lambda x, i: {k: v[i:i + 1, positions(x, i)] for k, v in x.items()},
        positions=positions,
        padding=lambda x: x["attention_mask"] == 0,
        shape=lambda x, pixels: tuple(x["input_ids"].shape),
        options={"beyond_intuition_head": {"steps": 4}, "beyond_intuition_token": {"steps": 4}},
        logits=lambda model, x: _decoder_logits(model, {k: v for k, v in x.items() if k != "special_tokens_mask"}),
    )


FAMILIES = [
    _image_family("timm_vit_cls", "token"),
    _image_family("timm_vit_avgpool", "avg"),
    _text_family("hf_bert", "bert", with_types=False),
    _text_family("hf_bert_types_special", "bert", with_types=True),
    _text_family("hf_roberta_types", "roberta", with_types=True, with_special=False),
    _text_family("hf_distilbert_special", "distilbert", with_types=False, with_special=True),
    _text_family("hf_electra_types", "electra", with_types=True, with_special=False),
    *_clip_families(),
    *[_decoder_family(*spec) for spec in DECODERS],
]


def test_every_registered_adapter_has_a_family_here():
    assert {a for a in ADAPTERS} <= {f.adapter for f in FAMILIES}


def _snapshot(model: nn.Module):
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "training": {n: m.training for n, m in model.named_modules()},
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "fused": {n: m.fused_attn for n, m in model.named_modules() if hasattr(m, "fused_attn")},
        "attn_implementation": {n: m.config._attn_implementation for n, m in model.named_modules()
                                if hasattr(getattr(m, "config", None), "_attn_implementation")},
        "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                     for m in model.modules()),
    }


def _prepare(model: nn.Module) -> nn.Module:
    """A model as a user may hand it over: training mode, fused attention on, part of it frozen."""
    model.train()
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = True
    first = next(model.parameters())
    first.requires_grad_(False)
    return model


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda f: f.name)
def family(request):
    return request.param


@pytest.mark.parametrize("name", available_methods())
def test_method_contract(family, name):
    model = _prepare(family.build())
    before = _snapshot(model)
    options = dict((family.options or {}).get(name, {}))
    method = build_method(name, **options)
    inputs = family.inputs(3)
    targets = torch.tensor([1, 4, 0])
    ids = torch.tensor([10, 11, 12])

    out = method(model, inputs, target=targets, sample_ids=ids)

    assert out.shape == family.shape(inputs, name in PIXEL_MAPS), (name, tuple(out.shape))
    assert torch.isfinite(out).all(), name
    assert out.dtype == torch.float64
    padding = family.padding(inputs)
    if padding is not None and out.shape == padding.shape:
        assert padding.any() and (out[padding] == 0).all(), f"{name}: padding positions are not exactly 0"

    for i in range(3):
        alone = method(model, family.single(inputs, i), target=targets[i:i + 1], sample_ids=ids[i:i + 1])
        row = out[i:i + 1][..., family.positions(inputs, i)]
        torch.testing.assert_close(row, alone, rtol=1e-9, atol=1e-12 * max(1.0, float(alone.abs().max())),
                                   msg=f"{name}: sample {i} differs between the batched and the per-sample call")

    after = _snapshot(model)
    assert after["hooks"] == before["hooks"] == 0
    for key in ("training", "requires_grad", "fused", "attn_implementation"):
        assert after[key] == before[key], f"{name}: {key} not restored"
    for key, value in before["state"].items():
        assert torch.equal(after["state"][key], value), f"{name}: {key} changed"
    assert all(p.grad is None for p in model.parameters()), f"{name} wrote parameter .grad"
    assert adapter_for(model) is adapter_for(model)


@pytest.mark.parametrize("name", available_methods())
def test_default_target_is_the_prediction(family, name):
    model = family.build().eval()
    options = dict((family.options or {}).get(name, {}))
    method = build_method(name, **options)
    inputs = family.inputs(2)
    if not method_class(name).class_specific:
        return
    logits = family.logits(model, inputs)
    predicted = method(model, inputs, sample_ids=torch.tensor([0, 1]))
    explicit = method(model, inputs, target=logits.argmax(-1), sample_ids=torch.tensor([0, 1]))
    torch.testing.assert_close(predicted, explicit, rtol=0, atol=0)


def test_mapping_inputs_equal_tensor_inputs():
    model = _tiny_vit("token").eval()
    x = _images(2)
    for name in ("rollout", "gradcam", "transformer_attribution", "cdam"):
        method = build_method(name)
        torch.testing.assert_close(method(model, {"pixel_values": x}, target=1), method(model, x, target=1),
                                   rtol=0, atol=0)


def test_bad_inputs_and_ids_are_named():
    model = _tiny_vit("token").eval()
    method = build_method("gradcam")
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        method(model, torch.randn(2, 32, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="multiple of the patch size"):
        method(model, torch.randn(1, 3, 30, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="sample_ids has 1 entries but the batch has 2"):
        build_method("random")(model, _images(2), sample_ids=[4])
    with pytest.raises(TypeError, match="Sequential.*supported families"):
        method(nn.Sequential(nn.Linear(2, 2)), _images(1))


def test_random_scores_follow_the_ids_not_the_batch():
    model = _tiny_vit("token").eval()
    method = build_method("random", seed=3)
    x = _images(3)
    batched = method(model, x, sample_ids=[7, 8, 9])
    reordered = method(model, x.flip(0), sample_ids=[9, 8, 7])
    torch.testing.assert_close(batched, reordered.flip(0), rtol=0, atol=0)
    assert not torch.equal(batched[0], method(model, x[:1], sample_ids=[8])[0])
