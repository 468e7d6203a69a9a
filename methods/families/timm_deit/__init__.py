"""timm distilled DeiT (``VisionTransformerDistilled``): adapter and LRP topology (NOTES.md)."""
from . import topology  # noqa: F401  (registers the topology)
from .adapter import TimmDeiTAdapter  # noqa: F401
