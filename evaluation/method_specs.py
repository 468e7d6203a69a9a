"""What an evaluation explains: which attribution methods with which options (``--model.methods`` and friends),
for which class settings.

A method specification maps a *display name* (the name in every result key) to ``{"method": <registered name>,
**options}``; :func:`parse_methods` reads the forms a config may give, :func:`method_specs` adds the per-method
defaults (``method_options``) and the concept methods of concept files.

Class settings (:data:`CLASS_SETTINGS`): the class a map explains: ``predicted`` (the argmax of the clean
logits), ``target`` (the ground truth ``batch["label"]``), ``other`` (the second object's class
``batch["other_label"]`` of two-object data).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from methods import available_methods, method_class
from methods.config_values import PlainDict

MethodsSpec = Union[None, str, List[str], Dict[str, Optional[PlainDict]]]
CLASS_SETTINGS = ("predicted", "target", "other")
#: the key of a specification selected by a set (``methods: null``, ``all``, ``tag:<tag>``) rather than by name:
#: a method that is not defined on the model (``MethodUndefinedError``) is left out of the run, said in the log,
#: where a method asked for by name is an error
IF_DEFINED = "if_defined"


def check_class_settings(settings: Sequence[str], what: str = "class settings") -> tuple:
    """``settings`` as a tuple, each one of :data:`CLASS_SETTINGS`."""
    bad = [s for s in settings if s not in CLASS_SETTINGS]
    if bad:
        raise ValueError(f"unknown {what} {bad}; choose from {CLASS_SETTINGS}")
    return tuple(settings)


def _expand_tag(item: str) -> List[str]:
    """``"tag:<tag>"`` as the methods carrying the tag (``ValueError`` when none does); a name as itself."""
    if not (isinstance(item, str) and item.startswith("tag:")):
        return [item]
    names = available_methods(tag=item[len("tag:"):])
    if not names:
        raise ValueError(f"no registered method carries the tag {item[len('tag:'):]!r}")
    return names


def parse_methods(methods: MethodsSpec) -> Dict[str, Dict[str, Any]]:
    """``{display name: {"method": registered name, **options}}`` from a method specification.

    ``None``: every registered method but those tagged ``opt_in`` (the generic baselines, whose cost is a multiple
    of a forward and backward: ``methods.available_methods(opt_in=False)``); ``"all"``: every registered method;
    ``"tag:<tag>"`` (alone or in a list): the methods carrying that tag (``tag:generic_baseline``); a list of
    names; the methods of a set (``None``, ``"all"``, a tag) carry :data:`IF_DEFINED` (those not defined on the
    model are left out of the run); or a mapping ``{display name: options}`` where options may carry
    ``method: <registered name>`` to evaluate one method under several option sets (e.g. ``{rollout_l4:
    {method: rollout, start_layer: 4}}``).
    """
    if methods is None:
        return {name: {"method": name, IF_DEFINED: True} for name in available_methods(opt_in=False)}
    if methods == "all":
        return {name: {"method": name, IF_DEFINED: True} for name in available_methods()}
    if isinstance(methods, str):
        methods = [methods]
    if isinstance(methods, (list, tuple)):
        tagged = {name for item in methods if isinstance(item, str) and item.startswith("tag:")
                  for name in _expand_tag(item)}
        methods = [name for item in methods for name in _expand_tag(item)]
        if len(set(methods)) != len(methods):
            raise ValueError(f"methods are listed twice: {list(methods)}")
        return {name: {"method": name, **({IF_DEFINED: True} if name in tagged else {})} for name in methods}
    if isinstance(methods, dict):
        spec = {}
        for name, options in methods.items():
            options = dict(options or {})
            options.setdefault("method", name)
            spec[name] = options
        return spec
    raise TypeError("methods must be None, 'all', a list of names or a mapping name -> options, "
                    f"got {type(methods).__name__}")


def method_specs(methods: MethodsSpec, method_options: Optional[Mapping[str, Optional[Mapping[str, Any]]]] = None,
                 concept_heads: Optional[Mapping[str, Any]] = None, concept_methods: bool = False,
                 ) -> Dict[str, Dict[str, Any]]:
    """The full specification of an evaluation's methods.

    Args:
        methods: see :func:`parse_methods`.
        method_options: options per *registered* method name, merged under the options given in ``methods``
            (e.g. ``{beyond_intuition_token: {start_layer: 2}}`` for a 4-block model with ``methods: null``).
        concept_heads: ``{kind: ConceptHead}`` of the classifier's concept files.
        concept_methods: add ``cdam_concept_<name>`` for every concept of the heads (``cdam_<kind>_concept_<name>``
            with several files), explaining ``<kind>:<name>``.
    """
    specs = parse_methods(methods)
    heads = dict(concept_heads or {})
    if concept_methods:
        if not heads:
            raise ValueError("concept_methods needs concept files (concepts: FILE or [FILES])")
        for kind, head in heads.items():
            for concept in head.names:
                name = f"cdam_concept_{concept}" if len(heads) == 1 else f"cdam_{kind}_concept_{concept}"
                if name in specs:
                    raise ValueError(f"method {name!r} is listed and also added by concept_methods")
                specs[name] = {"method": "cdam", "concept": f"{kind}:{concept}"}
    for name, options in (method_options or {}).items():
        method_class(name)  # unknown names: KeyError listing the registered methods
        for spec in specs.values():
            if spec["method"] == name:
                for key, value in (options or {}).items():
                    spec.setdefault(key, value)
    return specs
