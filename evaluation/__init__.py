"""Evaluation protocols and the pieces around them that are not Lightning callbacks.

Modality-free core (any kind of input: images, token sequences):

* :mod:`evaluation.ranking`: the removal order of a perturbation test (directions, tie conventions, units that
  may not be removed), the number of units removed per step and the removal masks;
* :mod:`evaluation.auc`: the AUC conventions of an accuracy curve;
* :mod:`evaluation.perturbation`: one direction of the perturbation test for a batch, given a perturber;
* :mod:`evaluation.metrics`: torchmetrics states whose sums give the same numbers on one process or several
  (perturbation curves, clean accuracy, pooled Pearson, means over samples), each declaring
  ``higher_is_better``;
* :mod:`evaluation.classifier`: :class:`~evaluation.classifier.Classifier` (images) and
  :class:`~evaluation.classifier.TextClassifier`, the one way the protocols classify (perturbed) inputs, and
  what differs between the modalities for the evaluation module (``classifier_for(model)``);
* :mod:`evaluation.result_keys`: :class:`~evaluation.result_keys.ResultKey`, the one way a result's key is
  written and read (test, method, class setting, metric);
* :mod:`evaluation.reporting`: ``metrics.json`` and its sidecar ``metrics.meta.json`` (each key's direction, the
  curves' x values), the curves table and the printed results table.

Per modality:

* :mod:`evaluation.perturbers`: how a perturbation test removes units of an input (pixels: the ``chefer`` and
  ``mean`` fills; tokens: ``pad``, ``mask``, ``delete``), behind :class:`~evaluation.perturbers.Perturber`;
* :mod:`evaluation.pixel_maps`: raw relevance -> normalised pixel maps (image protocols);
* :mod:`evaluation.segmentation`, :mod:`evaluation.cdam`: the segmentation metrics and the CDAM analyses' pieces;
* :mod:`evaluation.words`: the word layer, token scores -> word scores (one set of reductions) and word scores as
  escaped HTML heatmaps; a decoder LM's greedy generation with every generated token explained over its context
  (``explain_generation``);
* :mod:`evaluation.rationale_selection`, :mod:`evaluation.rationale_metrics`, :mod:`evaluation.eraser_export`:
  ERASER's hard rationales (top-k words, spans), its rationale metrics (token-F1, IOU-F1, AUPRC) and its JSONL
  format.

:mod:`evaluation.method_specs` parses which methods an evaluation runs. The Lightning callbacks that drive these
protocols live in ``callbacks/``.
"""
