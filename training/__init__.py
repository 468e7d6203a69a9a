"""Training on top of the command line: ``fit_and_export`` (what ``train.py`` runs, :mod:`training.fit`) and the
classifiers trained on first use and cached (:mod:`training.cached_training`, :mod:`training.synthetic`).

Importing this package registers their model sources (``trained:`` and ``synthetic``, :mod:`models.sources`).
``train.py`` and ``evaluate.py`` import it (so DDP children, which re-run the entry point, have the sources too);
other programs and tests that use these specs ``import training``.
"""
from models.sources import register_source
from training.cached_training import TRAINED_PREFIX, resolve_trained_spec
from training.synthetic import resolve_synthetic_spec

register_source(TRAINED_PREFIX, local=resolve_trained_spec)
register_source("synthetic:", local=resolve_synthetic_spec)
