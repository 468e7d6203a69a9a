"""Tiny random models of every family the adapters serve: the rows of the conformance matrix.

One module per library family (``vision``: timm ViTs; ``text``: BERT-family encoders; ``clip``: both CLIP towers;
``decoders``: causal LMs); each lists its :class:`Family` rows in ``FAMILIES``. A new family is one more module
here and one more line below; ``tests/test_method_contract.py`` runs every registered method on every row, and
``matrix.py`` writes the README's table from the rows.
"""
from . import (
    clip,
    deberta,
    decoders,
    decompositions,
    hf_vision,
    modernbert,
    open_clip,
    siglip,
    swin,
    text,
    timm_eva_beit,
    timm_variants,
    vision,
)
from .base import (  # noqa: F401
    PIXEL_MAPS,
    TEXT_LENGTHS,
    Family,
    _token_batch,
    method_options,
    set_fused_attention,
)
from .clip import _clip_classifier, _clip_images, _clip_scorer, _clip_token_batch, _tiny_clip  # noqa: F401
from .decoders import DECODER_KINDS, DECODERS, _decoder_batch, _decoder_logits, _tiny_decoder  # noqa: F401
from .text import _text_family, _tiny_bert, _tiny_text  # noqa: F401
from .vision import _images, _tiny_vit  # noqa: F401

FAMILIES = [
    *vision.FAMILIES,
    *timm_variants.FAMILIES,
    *text.FAMILIES,
    *deberta.FAMILIES,
    *clip.FAMILIES,
    *decoders.FAMILIES,
    *open_clip.FAMILIES,
    *hf_vision.FAMILIES,
    *timm_eva_beit.FAMILIES,
    *siglip.FAMILIES,
    *modernbert.FAMILIES,
    *swin.FAMILIES,
]
decompositions.add_alti_cells(FAMILIES)

# ---- legrad (issue 37): the rows whose family reads a logit lens (``adapter.lens``); every other row refuses it
LEGRAD_ROWS = (
    "timm_vit_cls", "timm_vit_avgpool", "timm_vit_reg4_dinov2", "timm_vit_reg4_avg", "timm_vit_map_reg2",
    "timm_deit_distilled", "timm_eva02_rope_glu", "timm_eva02_clip_style", "timm_beit_relpos", "hf_vit", "hf_deit",
    "hf_deit_teacher", "hf_dinov2", "hf_dinov2_registers", "hf_clip_vision", "hf_siglip_vision", "open_clip_vision",
    "open_clip_vision_avg_quickgelu_bias",
)
LEGRAD_UNDEFINED = "no logit lens (adapter.lens: the final norm and head read at any block's output)"
for _family in FAMILIES:
    if _family.name not in LEGRAD_ROWS:
        _family.undefined.setdefault("legrad", LEGRAD_UNDEFINED)
