"""Models and their files: loading the model to explain (:mod:`models.sources`), the file formats this codebase
writes, CLIP's wrappers (:mod:`models.clip`, whose ``clip:`` source is registered when this package is imported), GGUF
files (:mod:`models.gguf_source`, the ``gguf:`` source, registered likewise).
Nothing here imports above :mod:`methods`; training (and the classifiers trained on first use) is :mod:`training`.
"""
from models import clip, gguf_source  # noqa: F401  (register the clip: and gguf: model sources)
