"""Model families, one folder each: its adapter(s), its LRP topology and its design notes (``NOTES.md``).

Importing a family registers its adapters (:func:`methods.adapters.register_adapter`) and its topologies
(:func:`methods.lrp.register_topology`); this is the one place that imports them all. Shared by several families:
:mod:`.hf_blocks` (the encoder blocks of transformers models).
"""
from . import (  # noqa: F401
    hf_clip,
    hf_deberta,
    hf_decoder,
    hf_modernbert,
    hf_siglip,
    hf_text,
    hf_vit,
    open_clip,
    swin,
    timm_deit,
    timm_eva_beit,
    timm_vit,
)
