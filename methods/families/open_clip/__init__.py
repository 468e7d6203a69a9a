"""open_clip CLIP towers (``nn.MultiheadAttention`` blocks): adapters and LRP topologies (NOTES.md)."""
from . import topology  # noqa: F401  (registers the topologies)
from .adapter import OpenCLIPTextAdapter, OpenCLIPVisionAdapter  # noqa: F401
