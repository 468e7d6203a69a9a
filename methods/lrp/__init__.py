"""Relevance propagation (LRP) on stock Transformers: rules keyed by layer type, shared sub-layers, one short
topology per model family, and the engine that runs them."""
from . import (
    hf_clip,  # noqa: F401,E402  (registers the CLIP tower topologies)
    hf_decoder,  # noqa: F401,E402  (registers the decoder LM topologies)
    hf_siglip,  # noqa: F401,E402  (registers the SigLIP tower topologies)
    hf_text,  # noqa: F401,E402  (registers the Hugging Face text classifier topologies)
    hf_vit,  # noqa: F401,E402  (registers the Hugging Face ViT-like image classifier topologies)
    open_clip,  # noqa: F401,E402  (registers the open_clip CLIP tower topologies)
    timm_beit_like,  # noqa: F401,E402  (registers the timm Eva and Beit topologies)
    timm_deit,  # noqa: F401,E402  (registers the timm distilled DeiT topology)
    timm_vit,  # noqa: F401,E402  (registers the timm ViT topology)
)
from .engine import LRPEngine, LRPResult  # noqa: F401
from .rules import RULE_SETS, RuleSet, get_rules, safe_divide  # noqa: F401
from .topology import TOPOLOGIES, register_topology, topology_for  # noqa: F401
