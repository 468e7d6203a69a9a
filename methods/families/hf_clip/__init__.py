"""transformers CLIP towers (vision and text): adapters and LRP topologies (NOTES.md)."""
from . import topology  # noqa: F401  (registers the topologies)
from .adapter import HFCLIPTextAdapter, HFCLIPVisionAdapter  # noqa: F401
