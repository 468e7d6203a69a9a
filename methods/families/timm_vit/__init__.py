"""timm ``VisionTransformer`` (ViT, DINO(v2), registers, ``map`` pool): adapter and LRP topology (NOTES.md)."""
from . import topology  # noqa: F401  (registers the topology)
from .adapter import TimmBlocksAdapter, TimmViTAdapter  # noqa: F401
