"""Training on top of the command line: ``fit_and_export`` (what ``train.py`` runs, :mod:`training.fit`) and the
classifiers trained on first use and cached (:mod:`training.cached_training`, :mod:`training.synthetic`).

Importing this package registers their model sources with :func:`models.sources.register_source`:
``"trained:<config.yaml>[+<overrides.yaml>...]"`` and ``"synthetic"`` / ``"synthetic:<overrides.yaml>"``, which
``load_model``, tokenizers (a Hugging Face export holds its tokenizer) and ``LinearProbe``'s
``backbone_checkpoint`` then accept. ``train.py`` and ``evaluate.py`` import it (so DDP children, which re-run
the entry point, have the sources too); other programs and tests that use these specs ``import training``.
"""
from models.sources import register_source
from training.cached_training import TRAINED_PREFIX, resolve_trained_spec
from training.synthetic import resolve_synthetic_spec

register_source(TRAINED_PREFIX, local=resolve_trained_spec)
register_source("synthetic:", local=resolve_synthetic_spec)
