"""transformers ModernBERT sequence classifiers: adapter, rule map and LRP topology (NOTES.md)."""
from . import topology  # noqa: F401  (registers the topology)
from .adapter import HFModernBertAdapter  # noqa: F401
