"""The word layer: token scores -> word scores, and word scores as HTML heatmaps (post-processing of any method's
token scores; the rationale test, the heatmap callbacks and notebooks use it).

    from evaluation.words import TextHeatmap, word_scores
    result = word_scores(scores, batch, texts, words="whitespace", reduction="max")   # [B, N] -> words
    TextHeatmap({"gradcam": result})                                                  # a notebook cell shows it

* :mod:`evaluation.words.reductions`: the one token -> word reduction (``max``, ``sum``, ``mean``, ``absmax``) and
  its batched form over a text batch's document words (:func:`document_word_scores`);
* :mod:`evaluation.words.mapping`: which words a text has and which tokens belong to each
  (:func:`word_scores`, :func:`word_attribution_from_ids`), the results :class:`WordAttribution` and
  :class:`WordAttributions`;
* :mod:`evaluation.words.heatmap`: escaped HTML heatmaps (:func:`text_heatmap_html`, :class:`TextHeatmap`);
* :mod:`evaluation.words.generation`: a decoder LM's greedy generation with every generated token explained over
  its context (:func:`explain_generation`, :class:`GenerationAttribution` with its escaped HTML view).
"""
from .generation import GenerationAttribution, explain_generation, generation_html  # noqa: F401
from .heatmap import TextHeatmap, page_html, text_heatmap_html, write_text_heatmap  # noqa: F401
from .mapping import WordAttribution, WordAttributions, whitespace_words, word_attribution_from_ids, word_scores  # noqa: F401
from .reductions import REDUCTIONS, check_reduction, document_word_scores, reduce_tokens, word_mask  # noqa: F401
