"""Lightning callbacks of an evaluation run: the tests (``EvaluationCallback`` subclasses: clean accuracy,
perturbation (pixels or tokens), segmentation, CDAM analyses, ERASER rationales (``rationale``) and faithfulness
(``faithfulness``)), heatmap overlays and text heatmaps, the progress checkpoints of a resumable run
(``progress``), and the ``ResultsReporter`` every result leaves through. The protocols' code that is not a
callback is in the ``evaluation`` package."""
