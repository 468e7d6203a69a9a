"""What differs between the runs' resolved configs, so a reader sees why two columns differ.

Configs are flattened to dotted keys; list items of ``trainer.callbacks`` are named by their class
(``trainer.callbacks.PerturbationTest.ties``), other lists are compared whole. :func:`config_summary` gives the
settings that explain results (model, seed, conventions, data subset) for every run, differing or not;
:func:`config_differences` every key whose value differs between runs (or that some runs lack).
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from comparison.runs import Run
from comparison.tables import md_text

NO_CONFIG = "(no config)"
ABSENT = "(absent)"

#: (section, label, dotted key prefixes); a prefix matches itself and every key below it
SUMMARY: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    ("model", "classifier", ("model.classifier",)),
    ("model", "model options", ("model.model_kwargs", "model.pretrained", "model.concepts")),
    ("model", "methods", ("model.methods", "model.concept_methods")),
    ("model", "method options", ("model.method_options",)),
    ("model", "explained classes", ("model.class_settings",)),
    ("seed", "seed", ("seed_everything",)),
    ("conventions", "perturbation", ("trainer.callbacks.PerturbationTest",)),
    ("conventions", "segmentation", ("trainer.callbacks.SegmentationTest",)),
    ("conventions", "CDAM analysis", ("trainer.callbacks.CDAMAnalysis",)),
    ("conventions", "precision", ("trainer.precision",)),
    ("data", "dataset", ("data.class_path",)),
    ("data", "data subset", ("data.init_args",)),
)


def flatten(config: Any, prefix: str = "") -> Dict[str, Any]:
    """Dotted keys of a nested config (module docstring)."""
    out: Dict[str, Any] = {}
    if isinstance(config, Mapping):
        for key, value in config.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(config, list) and prefix.endswith("callbacks") and all(
            isinstance(item, Mapping) and "class_path" in item for item in config):
        seen: Dict[str, int] = {}
        for item in config:
            name = str(item["class_path"]).rsplit(".", 1)[-1]
            seen[name] = seen.get(name, 0) + 1
            label = name if seen[name] == 1 else f"{name}#{seen[name]}"
            out[f"{prefix}.{label}"] = "on"
            out.update(flatten(item.get("init_args") or {}, f"{prefix}.{label}"))
    else:
        out[prefix] = config
    return out


def value_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _matches(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def config_differences(runs: Sequence[Run]) -> List[Tuple[str, Dict[str, str]]]:
    """``[(dotted key, {run: value text})]`` of every key whose values differ between the runs that have a config
    (``(absent)`` where a run lacks the key); runs without a config show ``(no config)``."""
    flat = {run.name: (flatten(run.config) if run.config else None) for run in runs}
    with_config = [name for name, values in flat.items() if values is not None]
    keys = sorted({k for values in flat.values() if values is not None for k in values})
    rows = []
    for key in keys:
        texts = {name: (NO_CONFIG if flat[name] is None else
                        value_text(flat[name][key]) if key in flat[name] else ABSENT) for name in flat}
        if len({texts[name] for name in with_config}) > 1:
            rows.append((key, texts))
    return rows


def config_summary(runs: Sequence[Run]) -> List[Tuple[str, str, Dict[str, str], bool]]:
    """``[(section, label, {run: text}, differs)]``: the settings that explain results (``SUMMARY``), each the
    run's keys under the label's prefixes (``key=value``, one per line), and whether they differ."""
    flat = {run.name: (flatten(run.config) if run.config else None) for run in runs}
    rows = []
    for section, label, prefixes in SUMMARY:
        texts: Dict[str, str] = {}
        for name, values in flat.items():
            if values is None:
                texts[name] = NO_CONFIG
                continue
            items = [(k, v) for k, v in sorted(values.items()) if _matches(k, prefixes)]
            if len(items) == 1 and items[0][0] in prefixes:
                texts[name] = value_text(items[0][1])
                continue
            lines = []
            for k, v in items:
                if k in prefixes and ".callbacks." in k:   # the "on" marker of a callback
                    continue
                short = k[len(prefixes[0]) + 1:] if len(prefixes) == 1 else k.split(".", 1)[-1]
                lines.append(f"{short}={value_text(v)}")
            texts[name] = "\n".join(lines) or ABSENT
        known = {texts[n] for n in texts if texts[n] != NO_CONFIG}
        rows.append((section, label, texts, len(known) > 1))
    return rows


def differences_markdown(runs: Sequence[Run]) -> str:
    """The settings summary and every differing key as Markdown tables (every name, key and value as text:
    :func:`comparison.tables.md_text`)."""
    names = [md_text(run.name) for run in runs]
    lines = ["### settings", "", "| section | setting | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 2)]
    for section, label, texts, differs in config_summary(runs):
        mark = " (differs)" if differs else ""
        lines.append(f"| {section} | {label}{mark} | " + " | ".join(md_text(texts[run.name]) for run in runs) + " |")
    diffs = config_differences(runs)
    lines += ["", "### config keys that differ", ""]
    if not diffs:
        lines.append("none" if any(run.config for run in runs) else "no run has a config")
    else:
        lines += ["| key | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
        lines += [f"| {md_text(key)} | " + " | ".join(md_text(texts[run.name]) for run in runs) + " |"
                  for key, texts in diffs]
    return "\n".join(lines) + "\n"
