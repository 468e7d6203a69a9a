"""timm ``Eva`` and ``Beit`` (relative position bias, fused qkv, SwiGLU / rotary on Eva): adapters and LRP topology
(NOTES.md)."""
from . import topology  # noqa: F401  (registers the topologies)
from .adapter import TimmBeitLikeAdapter  # noqa: F401
from .beit import TimmBeitAdapter  # noqa: F401
from .eva import TimmEvaAdapter  # noqa: F401
