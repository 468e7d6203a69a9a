"""The word layer: token scores -> word scores (:mod:`~evaluation.words.reductions`, :mod:`~evaluation.words.mapping`)
and word scores as escaped HTML heatmaps (:mod:`~evaluation.words.heatmap`); post-processing of any method's token
scores for the rationale test, the heatmap callbacks and notebooks.

    from evaluation.words import TextHeatmap, word_scores
    result = word_scores(scores, batch, texts, words="whitespace", reduction="max")   # [B, N] -> words
    TextHeatmap({"gradcam": result})                                                  # a notebook cell shows it

    explain_generation("attnlrp", lm, tokenizer, prompts)                             # decoders: [B, T, N]
"""
from .generation import GenerationAttribution, explain_generation, generation_html  # noqa: F401
from .heatmap import TextHeatmap, page_html, text_heatmap_html, write_text_heatmap  # noqa: F401
from .mapping import WordAttribution, WordAttributions, whitespace_words, word_attribution_from_ids, word_scores  # noqa: F401
from .reductions import REDUCTIONS, check_reduction, document_word_scores, reduce_tokens, word_mask  # noqa: F401
