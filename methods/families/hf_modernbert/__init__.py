"""transformers ModernBERT sequence classifiers: adapter, rule map and LRP topology (NOTES.md)."""
from .adapter import HFModernBertAdapter  # noqa: F401
