"""transformers SigLIP towers (vision with its attention pool, text): adapters and LRP topologies (NOTES.md)."""
from . import topology  # noqa: F401  (registers the topologies)
from .adapter import HFSiglipTextAdapter, HFSiglipVisionAdapter  # noqa: F401
