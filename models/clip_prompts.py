"""CLIP's prompt sets: class names and the prompts filled from templates, built by name or read from the prompt
file saved beside a CLIP. The data (:mod:`datamodules.clip_zero_shot`) and the zero-shot classifier
(:mod:`models.clip`) both take their prompts from here.

Prompt sets (:func:`build_prompt_set`):

* ``"openai"``: OpenAI's 80 ImageNet templates (Radford et al. 2021, the prompt-engineering notebook); for
  ImageNet with OpenAI's 1,000 curated class names. Both lists are read from ``open_clip``'s zero-shot metadata
  (``pip install open_clip_torch``; read from the installed package's file, without importing ``open_clip``).
  The classifier averages the normalised embeddings of a class's 80 prompts and normalises again
  (:meth:`models.clip.ZeroShotClassifier.from_prompts`).
* ``"simple"``: ``open_clip``'s 7 "simple" ImageNet templates (a subset of the 80), same class names.
* ``"bi_legacy"``: Beyond Intuition's CLIP test (``CLIP/CLIP/visualisation.py``): one template
  ``"a photo of a {}"`` over torchvision's ImageNet class entries, which are *tuples* of WordNet lemmas, so a
  prompt reads ``"a photo of a ('tench', 'Tinca tinca')"``. torchvision builds the tuples from the devkit's
  ``words`` (split at ``", "``); the same lemma lists ship with timm (``ImageNetInfo``), read from there. On the
  synthetic images: the one template over the shape names.
* ``"custom"``: ``classnames`` and ``templates`` given (a list of templates, one template, or ``classnames`` a
  dict of per-class prompts).

A template is a string with ``{}`` (or ``{c}``) where the class name goes, or a callable (``open_clip``'s).
The prompt file beside a CLIP (``prompts.json``, :func:`save_prompt_set` / :func:`read_prompt_set`) holds the
prompt set it was trained with (``"saved"``).
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Callable, List, Mapping, Optional, Sequence, Union

Template = Union[str, Callable[[str], str]]

PROMPT_SETS = ("openai", "simple", "bi_legacy", "custom")
BI_TEMPLATE = "a photo of a {}"
#: the prompt set saved beside a CLIP (:func:`save_prompt_set`)
PROMPTS_FILE = "prompts.json"
PROMPTS_FORMAT = "token_attributions/clip_prompts/1"
#: prompt sets of a ``clip:`` spec: the saved one, or those of :func:`build_prompt_set`
CLIP_PROMPT_SETS = ("saved", "openai", "simple", "bi_legacy", "custom")


def fill_template(template: Template, classname: str) -> str:
    """One prompt: ``template(classname)`` for a callable (``open_clip``'s templates), else the class name put at
    ``{c}`` or ``{}`` of the string."""
    if callable(template):
        return template(classname)
    if "{c}" in template:
        return template.replace("{c}", classname)
    if "{}" not in template:
        raise ValueError(f"template {template!r} has no '{{}}' (or '{{c}}') where the class name goes")
    return template.format(classname)


def open_clip_zero_shot_metadata() -> ModuleType:
    """``open_clip/zero_shot_metadata.py`` of the installed ``open_clip_torch`` (plain lists; loaded from its file so
    that ``open_clip``'s own imports are not needed). ``ImportError`` naming the package otherwise."""
    spec = importlib.util.find_spec("open_clip")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    path = next((Path(f) / "zero_shot_metadata.py" for f in folders if (Path(f) / "zero_shot_metadata.py").is_file()),
                None)
    if path is None:
        raise ImportError("OpenAI's ImageNet class names and templates are read from open_clip's zero-shot metadata: "
                          "pip install open_clip_torch")
    module_spec = importlib.util.spec_from_file_location("_open_clip_zero_shot_metadata", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def openai_imagenet_classnames() -> List[str]:
    """OpenAI's 1,000 curated ImageNet class names, in the standard class order."""
    names = list(open_clip_zero_shot_metadata().IMAGENET_CLASSNAMES)
    if len(names) != 1000:
        raise RuntimeError(f"open_clip's IMAGENET_CLASSNAMES has {len(names)} entries, expected 1000")
    return names


def openai_templates(simple: bool = False) -> List[Callable[[str], str]]:
    """OpenAI's 80 ImageNet templates (``simple``: open_clip's 7-template subset), as callables."""
    meta = open_clip_zero_shot_metadata()
    return list(meta.SIMPLE_IMAGENET_TEMPLATES if simple else meta.OPENAI_IMAGENET_TEMPLATES)


def torchvision_imagenet_classnames() -> List[str]:
    """torchvision's ImageNet class entries as Beyond Intuition formats them: ``str`` of the tuple of WordNet
    lemmas (``"('tench', 'Tinca tinca')"``, ``"('stingray',)"``), in the standard class order."""
    from timm.data import ImageNetInfo

    info = ImageNetInfo()
    return [str(tuple(info.index_to_description(i).split(", "))) for i in range(1000)]


class PromptSet:
    """Class names and their prompts: ``prompts[c]`` is the list of prompts of class ``c``."""

    def __init__(self, name: str, classnames: Sequence[str], prompts: Sequence[Sequence[str]]):
        if len(classnames) != len(prompts):
            raise ValueError(f"{len(classnames)} class names but prompts for {len(prompts)} classes")
        self.name = name
        self.classnames = list(classnames)
        self.prompts = [list(p) for p in prompts]

    def __len__(self) -> int:
        return len(self.classnames)

    def __repr__(self) -> str:
        counts = sorted({len(p) for p in self.prompts})
        return f"PromptSet({self.name!r}, classes={len(self)}, prompts per class={counts})"


def fill_templates(classnames: Sequence[str], templates) -> List[List[str]]:
    """Per class name, its prompts: each of ``templates`` (one or a list) filled with it (:func:`fill_template`)."""
    if isinstance(templates, str) or callable(templates):
        templates = [templates]
    templates = list(templates)
    if not templates:
        raise ValueError("templates is empty")
    return [[fill_template(t, name) for t in templates] for name in classnames]


def custom_prompt_set(classnames: Union[Sequence[str], Mapping[str, Sequence[str]]], templates=None) -> PromptSet:
    """``classnames`` (a list) filled into ``templates`` (one or a list), or a dict ``{classname: [prompt, ...]}``
    (no ``templates``) of the prompts of each class."""
    if isinstance(classnames, Mapping):
        if templates is not None:
            raise ValueError("give templates or a dict of per-class prompts, not both")
        return PromptSet("custom", list(classnames),
                         [[p] if isinstance(p, str) else list(p) for p in classnames.values()])
    if templates is None:
        raise ValueError("a list of classnames needs templates (one or a list) unless it is a dict of prompts")
    return PromptSet("custom", classnames, fill_templates(classnames, templates))


def build_prompt_set(prompts: str, default_classnames: Optional[Sequence[str]] = None,
                     classnames: Union[None, Sequence[str], Mapping[str, Sequence[str]]] = None,
                     templates=None, imagenet: bool = True) -> PromptSet:
    """The prompt set ``prompts`` (module docstring). ``default_classnames``: the image source's class names when it
    is not ImageNet (the synthetic shapes); ``classnames`` overrides the class names of any set."""
    if prompts not in PROMPT_SETS:
        raise ValueError(f"prompts must be one of {PROMPT_SETS}, got {prompts!r}")
    if prompts == "custom":
        if classnames is None:
            raise ValueError("prompts='custom' needs classnames (and templates, unless classnames is a dict of "
                             "per-class prompts)")
        return custom_prompt_set(classnames, templates)
    if templates is not None:
        raise ValueError(f"templates are given by the prompt set {prompts!r}; use prompts='custom' for your own")
    if classnames is None:
        if imagenet:
            classnames = torchvision_imagenet_classnames() if prompts == "bi_legacy" else openai_imagenet_classnames()
        else:
            classnames = list(default_classnames)
    if prompts == "bi_legacy":
        return PromptSet(prompts, classnames, fill_templates(classnames, BI_TEMPLATE))
    return PromptSet(prompts, classnames, fill_templates(classnames, openai_templates(simple=prompts == "simple")))


# ------------------------------------------------------------------------------------------ prompt files
def save_prompt_set(folder: Union[str, os.PathLike], classnames: Sequence[str], prompts: Sequence[Sequence[str]],
                    templates: Optional[Sequence[str]] = None) -> Path:
    """Write the prompt set of a CLIP beside it: ``<folder>/prompts.json`` = ``{"format", "classnames",
    "prompts": one list of prompts per class, "templates": the string templates they were filled from or
    null}``; returns the path."""
    classnames = [str(c) for c in classnames]
    prompts = [[str(p) for p in per_class] for per_class in prompts]
    if not classnames or len(prompts) != len(classnames) or any(not p for p in prompts):
        raise ValueError(f"a prompt set needs at least one class and one prompt per class; got {len(classnames)} "
                         f"class names and prompts for {len(prompts)} classes")
    path = Path(os.path.expanduser(str(folder))) / PROMPTS_FILE
    content = {"format": PROMPTS_FORMAT, "classnames": classnames, "prompts": prompts,
               "templates": [str(t) for t in templates] if templates is not None else None}
    path.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    return path


def read_prompt_set(folder: Union[str, os.PathLike]):
    """The :class:`PromptSet` (name ``"saved"``) of ``<folder>/prompts.json``
    (:func:`save_prompt_set`); errors name the file."""
    path = Path(os.path.expanduser(str(folder))) / PROMPTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no prompt set saved beside the CLIP: {str(path)!r} does not exist; give the "
                                "prompts as model_kwargs (prompts: openai | simple | bi_legacy | custom, with "
                                "classnames / templates)")
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
        classnames, prompts = content["classnames"], content["prompts"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"prompt file {str(path)!r} is not a prompt set (JSON with 'classnames' and 'prompts'): "
                         f"{err}") from err
    if (not isinstance(classnames, list) or not isinstance(prompts, list) or len(classnames) != len(prompts)
            or not classnames or not all(isinstance(p, list) and p and all(isinstance(t, str) for t in p)
                                         for p in prompts)):
        raise ValueError(f"prompt file {str(path)!r}: 'classnames' and 'prompts' must be lists of the same, "
                         "non-zero length, each class with a non-empty list of prompt strings")
    return PromptSet("saved", [str(c) for c in classnames], prompts)


def zero_shot_prompt_set(source: str, prompts: Optional[str] = None, classnames=None, templates=None):
    """The prompt set of a ``clip:`` spec: ``prompts="saved"`` (the default when ``source`` is a folder with
    ``prompts.json``) reads it (no ``classnames`` / ``templates`` then); ``openai`` / ``simple`` / ``bi_legacy``
    / ``custom`` are :func:`build_prompt_set`'s sets (ImageNet's 1,000 classes unless
    ``classnames`` are given)."""
    saved = os.path.isfile(os.path.join(source, PROMPTS_FILE))
    if prompts is None:
        if not saved:
            raise ValueError(f"the CLIP {source!r} has no saved prompt set ({PROMPTS_FILE}): give model_kwargs "
                             "{prompts: openai | simple | bi_legacy | custom} (with classnames / templates)")
        prompts = "saved"
    if prompts not in CLIP_PROMPT_SETS:
        raise ValueError(f"prompts must be one of {CLIP_PROMPT_SETS}, got {prompts!r}")
    if prompts == "saved":
        if classnames is not None or templates is not None:
            raise ValueError("the saved prompt set has its own class names and templates: use prompts='custom' to "
                             "give classnames and templates")
        return read_prompt_set(source)
    return build_prompt_set(prompts, classnames=classnames, templates=templates, imagenet=True)
