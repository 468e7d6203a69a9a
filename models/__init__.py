"""Models and their files: loading the model to explain, the file formats this codebase writes, CLIP's wrappers.
Nothing here imports above :mod:`methods`; training (and the classifiers trained on first use) is :mod:`training`.

* :mod:`models.sources`: the registry of model sources behind ``load_model(spec)`` (``timm:<name>``,
  ``hf:<name or folder>``, ``hf:minilm``, ``clip:<source>``, a classifier file; ``register_source``), tokenizers
  (``load_tokenizer``) and the cache folder (``resolve_cache_dir``);
* :mod:`models.classifier_file`: the classifier file format (``save_classifier``, ``load_classifier``);
* :mod:`models.checkpoint_io`: the one checkpoint reader (``weights_only=True``; unpickling only on request) and
  the export folders' writers;
* :mod:`models.backbones`: timm backbones with weights from a local file (``create_backbone``,
  ``read_state_dict``);
* :mod:`models.concepts`: concept vectors and their heads (``ConceptHead``; CDAM's concepts), concept files of a
  classifier;
* :mod:`models.clip`: CLIP as classifiers (``ZeroShotClassifier``, ``PromptScorer``; the ``clip:`` source, registered
  when this package is imported); :mod:`models.clip_prompts`: CLIP's prompt sets and templates.
"""
from models import clip  # noqa: F401  (registers the clip: model source)
