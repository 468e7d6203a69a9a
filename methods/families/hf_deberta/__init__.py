"""transformers DeBERTa-v2 / DeBERTa-v3 text classifiers (disentangled relative attention): adapter, rules (NOTES.md)."""
from .adapter import HFDebertaV2Adapter  # noqa: F401
