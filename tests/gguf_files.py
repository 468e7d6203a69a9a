"""Tiny GGUF files written with the ``gguf`` package's writer (a random Llama with a byte-level BPE tokenizer and a
chat template), for the tests of the ``gguf:`` model source; nothing is downloaded."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

WORDS = ("hello", "world", "good", "bad", "movie", "positive", "negative")
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant:{% endif %}")


def _vocabulary(words: Sequence[str]):
    tokens = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", ":", ".", "Ċ"]
    merges, known = [], set(tokens)
    for word in words:
        current = "Ġ"
        for char in word:
            merges.append(f"{current} {char}")
            current += char
            if current not in known:
                tokens.append(current)
                known.add(current)
    return tokens, merges


def write_tiny_llama(path: Path, architecture: str = "llama", hidden: int = 16, layers: int = 2, heads: int = 2,
                     kv_heads: int = 1, ffn: int = 32, seed: int = 0, tensors: bool = True) -> Path:
    """A random Llama (``hidden`` wide, ``layers`` blocks) as a float32 GGUF file at ``path``; ``architecture``
    is what its header names (another name gives a file transformers cannot read)."""
    import gguf

    tokens, merges = _vocabulary(WORDS)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(seed)

    def weight(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    if tensors:
        head_dim = hidden // heads
        writer.add_tensor("token_embd.weight", weight(len(tokens), hidden))
        for i in range(layers):
            for name, shape in (("attn_q", (hidden, hidden)), ("attn_k", (kv_heads * head_dim, hidden)),
                                ("attn_v", (kv_heads * head_dim, hidden)), ("attn_output", (hidden, hidden)),
                                ("ffn_gate", (ffn, hidden)), ("ffn_up", (ffn, hidden)), ("ffn_down", (hidden, ffn))):
                writer.add_tensor(f"blk.{i}.{name}.weight", weight(*shape))
            for name in ("attn_norm", "ffn_norm"):
                writer.add_tensor(f"blk.{i}.{name}.weight", 1 + weight(hidden))
        writer.add_tensor("output_norm.weight", 1 + weight(hidden))
        writer.add_tensor("output.weight", weight(len(tokens), hidden))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
