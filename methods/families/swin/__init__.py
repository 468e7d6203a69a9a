"""Swin Transformer V1 classifiers, timm ``SwinTransformer`` and transformers ``SwinForImageClassification``:
adapters, window geometry, rule map (NOTES.md)."""
from .adapter import HFSwinAdapter, SwinAdapter, TimmSwinAdapter  # noqa: F401
