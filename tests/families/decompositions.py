"""Issue 37's decomposition cells of the conformance matrix: the rows where ``alti``, ``alti_logit`` and ``decompx``
run, every other row refusing them by name (``methods/alti.py``, ``methods/decompx.py``; the adapters'
``decomposes_blocks`` and ``decomposes_network`` capabilities)."""
from __future__ import annotations

from typing import Iterable

from .base import Family

#: the BERT-family encoders and DeBERTa (post-norm, the LayerNorm decomposed; DeBERTa's relative positions act on
#: the attention scores only), ModernBERT (pre-norm) and the pre-norm decoders but Gemma 3
ALTI_ROWS = ("hf_bert", "hf_bert_types_special", "hf_roberta_types", "hf_distilbert_special", "hf_electra_types",
             "hf_deberta_v3", "hf_deberta_v2_pos_proj_types", "hf_modernbert_cls", "hf_modernbert_mean_local_global",
             "hf_gpt2_left", "hf_llama_gqa_left", "hf_mistral_sliding_right", "hf_qwen2_left", "hf_qwen3_right",
             "hf_llama_seq_cls_right", "hf_gpt2_seq_cls_right")
#: ALTI-Logit: the decoders among them (a final norm and a linear head read at a position)
ALTI_LOGIT_ROWS = tuple(row for row in ALTI_ROWS if "gpt2" in row or "llama" in row or "mistral" in row
                        or "qwen" in row)
NO_DECOMPOSITION = "does not decompose its blocks (decomposes_blocks"
#: DecompX: the post-norm BERT-family encoders with an element-wise MLP and a dense-activation-dense head at [CLS]
DECOMPX_ROWS = ("hf_bert", "hf_bert_types_special", "hf_roberta_types", "hf_distilbert_special", "hf_electra_types")
NO_NETWORK_DECOMPOSITION = "does not decompose its whole network (decomposes_network"
NOT_A_DECODER = "needs a pre-norm decoder read out at a position"


def add_alti_cells(families: Iterable[Family]) -> None:
    """Each row's ``undefined`` entries for ``alti``, ``alti_logit`` and ``decompx`` (the reasons their errors
    give)."""
    for family in families:
        if family.name not in DECOMPX_ROWS:
            family.undefined.setdefault("decompx", NO_NETWORK_DECOMPOSITION)
        if family.name not in ALTI_ROWS:
            family.undefined.setdefault("alti", NO_DECOMPOSITION)
            family.undefined.setdefault("alti_logit", NO_DECOMPOSITION)
        elif family.name not in ALTI_LOGIT_ROWS:
            family.undefined.setdefault("alti_logit", NOT_A_DECODER)
