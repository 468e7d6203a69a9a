"""Issue 37's decomposition cells of the conformance matrix: the rows where ``alti``, ``alti_logit`` and ``decompx``
run, every other row refusing them by name (``methods/alti.py``, ``methods/decompx.py``; the adapters'
``adapter.decomposition`` capability and its ``decomposes_network``)."""
from __future__ import annotations

from typing import Iterable

from .base import Family

#: the BERT-family encoders and DeBERTa (post-norm, the LayerNorm decomposed; DeBERTa's relative positions act on
#: the attention scores only), ModernBERT (pre-norm) and the pre-norm decoders but Gemma 3
ALTI_ROWS = ("hf_bert", "hf_bert_types_special", "hf_roberta_types", "hf_distilbert_special", "hf_electra_types",
             "hf_deberta_v3", "hf_deberta_v2_pos_proj_types", "hf_modernbert_cls", "hf_modernbert_mean_local_global",
             "hf_gpt2_left", "hf_llama_gqa_left", "hf_mistral_sliding_right", "hf_qwen2_left", "hf_qwen3_right",
             "hf_llama_seq_cls_right", "hf_gpt2_seq_cls_right",
             # the pre-norm encoder ViTs and the CLIP / SigLIP / open_clip towers (read at [CLS], the mean row, DeiT's
             # two tokens or the text's read-out position; an attention pool refuses: ALTI_POOL_ROWS)
             "timm_vit_cls", "timm_vit_avgpool", "timm_vit_reg4_dinov2", "timm_vit_reg4_avg", "timm_deit_distilled",
             "hf_vit", "hf_deit", "hf_deit_teacher", "hf_dinov2", "hf_dinov2_registers", "hf_clip_vision",
             "hf_clip_text", "hf_clip_text_special", "open_clip_vision", "open_clip_vision_avg_quickgelu_bias",
             "open_clip_text", "open_clip_text_eos_linear_proj_layerscale", "hf_siglip_text", "hf_siglip_text_masked",
             # timm EVA / BEiT (EVA-02's sub-LN before proj linearised per token), Gemma 3 (its RMSNorm on the
             # attention output likewise)
             "timm_eva02_rope_glu", "timm_eva02_clip_style", "timm_beit_relpos", "hf_gemma3_left")
#: decomposed blocks read out by an attention pool (timm's ``map``, SigLIP's vision head): ``alti`` refuses
ALTI_POOL_ROWS = ("timm_vit_map_reg2", "hf_siglip_vision")
#: ALTI-Logit: the decoders among them (a final norm and a linear head read at a position)
ALTI_LOGIT_ROWS = tuple(row for row in ALTI_ROWS if row.startswith("hf_") and any(
    kind in row for kind in ("gpt2", "llama", "mistral", "qwen")))
#: read out at a position, but the head is not linear after the final norm (CLIP-like towers' cosine, Gemma 3's
#: soft-capped LM head): ``alti_logit`` refuses
NONLINEAR_HEAD_ROWS = ("hf_clip_text", "hf_clip_text_special", "open_clip_text",
                       "open_clip_text_eos_linear_proj_layerscale", "hf_siglip_text", "hf_siglip_text_masked",
                       "hf_gemma3_left")
NO_DECOMPOSITION = "does not decompose its blocks (adapter.decomposition"
#: DecompX: the post-norm BERT-family encoders with an element-wise MLP and a dense-activation-dense head at [CLS]
DECOMPX_ROWS = ("hf_bert", "hf_bert_types_special", "hf_roberta_types", "hf_distilbert_special", "hf_electra_types")
NO_NETWORK_DECOMPOSITION = "does not decompose its whole network (adapter.decomposition.decomposes_network"
NOT_A_DECODER = "needs a pre-norm decoder read out at a position"
ATTENTION_POOL = "reads out through an attention pooling head"
NONLINEAR_HEAD = "has a head that is not linear after its final norm"


def add_alti_cells(families: Iterable[Family]) -> None:
    """Each row's ``undefined`` entries for ``alti``, ``alti_logit`` and ``decompx`` (the reasons their errors
    give)."""
    for family in families:
        if family.name not in DECOMPX_ROWS:
            family.undefined.setdefault("decompx", NO_NETWORK_DECOMPOSITION)
        if family.name in ALTI_POOL_ROWS:
            family.undefined.setdefault("alti", ATTENTION_POOL)
            family.undefined.setdefault("alti_logit", NOT_A_DECODER)
        elif family.name not in ALTI_ROWS:
            family.undefined.setdefault("alti", NO_DECOMPOSITION)
            family.undefined.setdefault("alti_logit", NO_DECOMPOSITION)
        elif family.name in NONLINEAR_HEAD_ROWS:
            family.undefined.setdefault("alti_logit", NONLINEAR_HEAD)
        elif family.name not in ALTI_LOGIT_ROWS:
            family.undefined.setdefault("alti_logit", NOT_A_DECODER)
