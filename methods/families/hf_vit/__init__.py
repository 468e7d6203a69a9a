"""transformers ViT, DeiT (with teacher), DINOv2 (with registers): adapters and LRP topology (NOTES.md)."""
from . import topology  # noqa: F401  (registers the topology)
from .adapter import (  # noqa: F401
    HFDeiTAdapter,
    HFDeiTWithTeacherAdapter,
    HFDinov2Adapter,
    HFDinov2WithRegistersAdapter,
    HFViTAdapter,
    HFViTLikeAdapter,
)
