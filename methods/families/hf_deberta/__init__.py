"""transformers DeBERTa-v2 / DeBERTa-v3 text classifiers (disentangled relative attention): adapter, LRP topology
(NOTES.md)."""
from . import topology  # noqa: F401  (registers the topology)
from .adapter import HFDebertaV2Adapter  # noqa: F401
