"""Models and their files: loading the model to explain, the file formats this codebase writes, training the
synthetic benchmark's classifier.

* :mod:`models.loading`: ``load_model(spec)`` (``synthetic``, ``synthetic:<overrides.yaml>``, ``timm:<name>``,
  ``hf:<name or folder>``, ``hf:minilm``, ``trained:<config.yaml>``, a classifier file), concept files of a
  classifier;
* :mod:`models.classifier_file`: the classifier file format (``save_classifier``, ``load_classifier``);
* :mod:`models.checkpoint_io`: the one checkpoint reader (``weights_only=True``; unpickling only on request);
* :mod:`models.backbones`: timm backbones with weights from a local file (``create_backbone``,
  ``read_state_dict``);
* :mod:`models.concepts`: concept vectors and their heads (``ConceptHead``; CDAM's concepts);
* :mod:`models.training`: fit, reload the best epoch, validate, export (``fit_and_export``: ``train.py``; a
  probe as a classifier file, a text classifier as a Hugging Face folder);
* :mod:`models.cached_training`: classifiers trained in-process on first use and cached (``trained:<config>``);
* :mod:`models.synthetic`: the synthetic benchmark's ViT, trained in-process on first use and cached.
"""
