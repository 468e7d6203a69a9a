"""Hugging Face decoder LM families (GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma 3) of the conformance matrix."""
from __future__ import annotations

from typing import Optional

import pytest
import torch
from torch import Tensor, nn

from .base import Family, _token_batch

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
    from methods.families.hf_decoder import (
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
        eager_softmax_float32=kind != "gpt2",
    )


FAMILIES = [_decoder_family(*spec) for spec in DECODERS]
