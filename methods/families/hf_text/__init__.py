"""transformers BERT-like text classifiers (BERT, RoBERTa, DistilBERT, ELECTRA): adapters, LRP topology (NOTES.md)."""
from . import topology  # noqa: F401  (registers the topology)
from .adapter import HFBertAdapter, HFDistilBertAdapter, HFElectraAdapter, HFRobertaAdapter, HFTextAdapter  # noqa: F401
