"""Lightning callbacks of an evaluation run: the tests (``EvaluationCallback`` subclasses: clean accuracy,
perturbation, segmentation, CDAM analyses), heatmap overlays, and the ``ResultsReporter`` every result leaves
through. The protocols' code that is not a callback is in the ``evaluation`` package."""
