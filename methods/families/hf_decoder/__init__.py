"""transformers decoder LMs (Llama, Mistral, Qwen2/3, Gemma 3, GPT-2): adapters, the attention recomputed in the
backward, and LRP topology (NOTES.md)."""
from . import topology  # noqa: F401  (registers the topology)
from .adapter import (  # noqa: F401
    HFGemma3Adapter,
    HFGPT2Adapter,
    HFLlamaAdapter,
    HFMistralAdapter,
    HFQwen2Adapter,
    HFQwen3Adapter,
)
