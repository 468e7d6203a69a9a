"""Loading the runs to compare: run folders, offline W&B run folders, or (online) a W&B project.

* **run folder** (``evaluate.py --output_dir``): ``metrics.json`` (flat keys, floats and curves, ``null`` for
  non-finite values), the declarations ``metrics.meta.json`` and the resolved config ``config.yaml`` beside it when
  the run wrote them (the reporter copies the config LightningCLI saved into the run folder). A path to the
  ``metrics.json`` file itself works too.
* **offline W&B run** (``outputs/wandb/offline-run-*``): read locally, without network, from what the run wrote:
  the run file ``run-<id>.wandb`` (a log of protobuf records: the config, the summary with every scalar, the run's
  group and tags; the summary value ``metrics_meta`` holds the declarations) and the curves table
  ``files/media/table/curves_*.table.json``; ``files/wandb-summary.json`` and ``files/config.yaml`` are used when
  present (runs that were synced or finished online).
* **W&B project** (online only): :func:`load_wandb_project` through ``wandb.Api`` with the API's run filters.

Every run gets each metric's direction (and its curves' x values) from its declarations
(:func:`evaluation.reporting.read_metrics_meta`); a run written before them, from
:func:`comparison.directions.declared_directions` (and its config's perturbation fractions). Bad input (a missing
folder, a folder without metrics, corrupt JSON or YAML) raises :class:`RunLoadError` naming the path.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from comparison.directions import declared_directions
from evaluation.auc import DEFAULT_FRACTIONS, curve_x
from evaluation.reporting import META_FILE, META_SUMMARY_KEY, read_metrics_meta

METRICS_FILE = "metrics.json"
CONFIG_FILE = "config.yaml"


class RunLoadError(ValueError):
    """A run could not be read; the message names the path and what is wrong with it."""


@dataclass
class Run:
    """One run: its metrics (flat keys as in ``metrics.json``), resolved config (nested dict, ``None`` when the
    run has none), declared directions and the x values of its curves."""

    name: str
    source: str
    kind: str   # "folder", "wandb-offline" or "wandb-online"
    metrics: Dict[str, Any]
    config: Optional[Dict[str, Any]] = None
    group: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    higher_is_better: Dict[str, Optional[bool]] = field(default_factory=dict)
    curve_x: Dict[str, List[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        undeclared = [key for key in self.metrics if key not in self.higher_is_better]
        self.higher_is_better.update(declared_directions(undeclared))
        for key, value in self.metrics.items():
            if isinstance(value, list) and key not in self.curve_x:
                self.curve_x[key] = curve_fractions(self.config, len(value))

    def scalar(self, key: str) -> Optional[float]:
        """The finite float under ``key``, or ``None`` (missing, ``null`` or a curve)."""
        value = self.metrics.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return float(value)


# ------------------------------------------------------------------------------------------ config helpers
def perturbation_init_args(config: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The init args of the run's ``PerturbationTest`` callback (empty when it has none or no config)."""
    callbacks = ((config or {}).get("trainer") or {}).get("callbacks") or []
    for item in callbacks if isinstance(callbacks, list) else [callbacks]:
        if isinstance(item, Mapping) and str(item.get("class_path", "")).endswith("PerturbationTest"):
            return dict(item.get("init_args") or {})
    return {}


def curve_fractions(config: Optional[Mapping[str, Any]], length: int) -> List[float]:
    """x of a perturbation curve of ``length`` points: ``[0] + fractions`` of the run's test (its config, else
    the test's default fractions); the step index when neither fits."""
    fractions = perturbation_init_args(config).get("fractions") or DEFAULT_FRACTIONS
    xs = curve_x(fractions)
    return xs if len(xs) == length else [float(i) for i in range(length)]


def _read_text(path: Path) -> str:
    """The UTF-8 text of ``path``; a :class:`RunLoadError` naming the file (and line) when it cannot be read."""
    try:
        data = path.read_bytes()
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise RunLoadError(f"{path}:{line}: not UTF-8 text ({err.reason})") from None
    except OSError as err:
        raise RunLoadError(f"{path}: cannot be read ({err})") from None


def _read_meta(meta: Any, where: str) -> Dict[str, Any]:
    """``Run`` arguments ``higher_is_better`` and ``curve_x`` from a run's declarations (none: ``{}``)."""
    if meta is None:
        return {}
    try:
        higher_is_better, xs = read_metrics_meta(meta)
    except ValueError as err:
        raise RunLoadError(f"{where}: {err}") from None
    return {"higher_is_better": higher_is_better, "curve_x": xs}


def _summary_meta(summary: Mapping[str, Any], where: str) -> Dict[str, Any]:
    """:func:`_read_meta` of a W&B summary's ``metrics_meta`` (JSON text)."""
    text = summary.get(META_SUMMARY_KEY)
    return _read_meta(None if text is None else _json_value(text, where), where)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as err:
        raise RunLoadError(f"{path}: corrupt JSON ({err})") from None


def _read_yaml(path: Path) -> Dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(_read_text(path))
    except yaml.YAMLError as err:
        raise RunLoadError(f"{path}: corrupt YAML ({err})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RunLoadError(f"{path}: expected a mapping of config keys, got {type(data).__name__}")
    return data


# ------------------------------------------------------------------------------------------ run folders
def _load_folder(path: Path, name: Optional[str]) -> Run:
    metrics_path = path / METRICS_FILE
    metrics = _read_json(metrics_path)
    if not isinstance(metrics, dict):
        raise RunLoadError(f"{metrics_path}: expected a JSON object of metrics, got {type(metrics).__name__}")
    config_path = path / CONFIG_FILE
    config = _read_yaml(config_path) if config_path.is_file() else None
    meta_path = path / META_FILE
    meta = _read_meta(_read_json(meta_path), str(meta_path)) if meta_path.is_file() else {}
    return Run(name=name or path.name, source=str(path), kind="folder", metrics=metrics, config=config, **meta)


# ------------------------------------------------------------------------------------------ offline W&B runs
_WANDB_HEADER = struct.Struct("<4sHB")   # ":W&B", magic, version
_WANDB_CHUNK = struct.Struct("<IHB")     # crc32, length, type (1 full, 2 first, 3 middle, 4 last)
_WANDB_BLOCK = 32768


def wandb_records(path: Path) -> List[bytes]:
    """The records of a ``.wandb`` run file (a LevelDB-style log: 32 KiB blocks of chunks after a 7-byte
    header), each a serialised ``wandb_internal_pb2.Record``."""
    data = path.read_bytes()
    if len(data) < _WANDB_HEADER.size or _WANDB_HEADER.unpack_from(data)[0] != b":W&B":
        raise RunLoadError(f"{path}: not a W&B run file (no ':W&B' header)")
    records: List[bytes] = []
    pos, pending = _WANDB_HEADER.size, b""
    while pos + _WANDB_CHUNK.size <= len(data):
        left = _WANDB_BLOCK - pos % _WANDB_BLOCK
        if left < _WANDB_CHUNK.size:   # block trailer: padding
            pos += left
            continue
        _, length, kind = _WANDB_CHUNK.unpack_from(data, pos)
        if kind == 0 and length == 0:   # zero padding to the end of the block
            pos += left
            continue
        chunk = data[pos + _WANDB_CHUNK.size: pos + _WANDB_CHUNK.size + length]
        pos += _WANDB_CHUNK.size + length
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            records.append(pending + chunk)
            pending = b""
        else:
            raise RunLoadError(f"{path}: corrupt W&B run file (chunk type {kind} at byte {pos})")
    return records


def _item_key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def _json_value(text: str, path: Any) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise RunLoadError(f"{path}: corrupt value {text[:60]!r} in the W&B run file") from None


def read_wandb_run_file(path: Path) -> Dict[str, Any]:
    """``{"config", "summary", "group", "tags", "name"}`` of a ``.wandb`` run file, read locally."""
    from wandb.proto import wandb_internal_pb2 as pb

    config: Dict[str, Any] = {}
    summary: Dict[str, Any] = {}
    info: Dict[str, Any] = {"group": None, "tags": [], "name": None}
    for raw in wandb_records(path):
        record = pb.Record()
        try:
            record.ParseFromString(raw)
        except Exception as err:  # protobuf's DecodeError
            raise RunLoadError(f"{path}: corrupt W&B record ({err})") from None
        kind = record.WhichOneof("record_type")
        if kind == "run":
            info.update(group=record.run.run_group or None, tags=list(record.run.tags),
                        name=record.run.display_name or record.run.run_id)
            updates = record.run.config.update
        elif kind == "config":
            updates = record.config.update
        elif kind == "summary":
            for item in record.summary.update:
                summary[_item_key(item)] = _json_value(item.value_json, path)
            for item in record.summary.remove:
                summary.pop(_item_key(item), None)
            continue
        else:
            continue
        for item in updates:
            key = _item_key(item)
            if key != "_wandb":
                config[key] = _json_value(item.value_json, path)
    return {"config": config, "summary": summary, **info}


def _wandb_config_values(config: Mapping[str, Any]) -> Dict[str, Any]:
    """W&B's ``config.yaml`` wraps each value as ``{value: ..., desc: ...}``: unwrap it."""
    out = {}
    for key, value in config.items():
        if key.startswith("_") or key == "wandb_version":
            continue
        out[key] = value.get("value") if isinstance(value, Mapping) and "value" in value else value
    return out


def _metrics_from_summary(summary: Mapping[str, Any]) -> Dict[str, Any]:
    """The run's results among its summary (no W&B bookkeeping keys, no media, no trainer counters)."""
    media = [key[: -len("_type")] for key in summary if key == "_type" or key.endswith("/_type")]
    metrics = {}
    for key, value in summary.items():
        if key.startswith("_") or key in ("epoch", "trainer/global_step") or any(key.startswith(m) for m in media):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) and value is not None:
            continue
        metrics[key] = value
    return metrics


def _curves_from_rows(rows: Iterable[Sequence[Any]]) -> tuple:
    """Curves and their x values ``({key: [y]}, {key: [x]})`` from ``curves`` table rows (key, step, fraction,
    value)."""
    curves: Dict[str, Dict[int, float]] = {}
    xs: Dict[str, Dict[int, float]] = {}
    for key, step, x, y in rows:
        curves.setdefault(key, {})[int(step)] = y
        xs.setdefault(key, {})[int(step)] = float(x)
    return ({k: [v[i] for i in sorted(v)] for k, v in curves.items()},
            {k: [v[i] for i in sorted(v)] for k, v in xs.items()})


def _curves_from_tables(files: Path) -> tuple:
    """:func:`_curves_from_rows` of the run's ``curves`` table files."""
    rows: List[Sequence[Any]] = []
    for table in sorted((files / "media" / "table").glob("curves*.table.json")):
        data = _read_json(table)
        columns = data.get("columns") if isinstance(data, dict) else None
        if columns != ["key", "step", "fraction", "value"]:
            raise RunLoadError(f"{table}: expected a curves table (columns key, step, fraction, value)")
        rows += data.get("data", [])
    return _curves_from_rows(rows)


def _load_wandb_offline(path: Path, name: Optional[str]) -> Run:
    files = path / "files"
    run_files = sorted(path.glob("*.wandb"))
    info: Dict[str, Any] = {"config": {}, "summary": {}, "group": None, "tags": [], "name": None}
    if run_files:
        info = read_wandb_run_file(run_files[0])
    if (files / "wandb-summary.json").is_file():
        info["summary"] = {**info["summary"], **_read_json(files / "wandb-summary.json")}
    if (files / "config.yaml").is_file():
        info["config"] = {**info["config"], **_wandb_config_values(_read_yaml(files / "config.yaml"))}
    config = dict(info["config"])
    if isinstance(config.get("model"), Mapping):   # the module's hyperparameters, logged flat besides the config
        for key in list(config):
            if key == "_instantiator" or key in config["model"] and config[key] == config["model"][key]:
                config.pop(key)
    info["config"] = config
    metrics = _metrics_from_summary(info["summary"])
    if not metrics:
        raise RunLoadError(f"{path}: the W&B run holds no metrics (no summary values in "
                           f"{run_files[0] if run_files else files / 'wandb-summary.json'})")
    curves, xs = _curves_from_tables(files)
    metrics.update(curves)
    meta = {"curve_x": xs, **_summary_meta(info["summary"], str(path))}   # the declared x values first
    run_id = path.name.rsplit("-", 1)[-1]
    label = name or (f"{info['name']} ({run_id})" if info["name"] else path.name)
    return Run(name=label, source=str(path), kind="wandb-offline", metrics=metrics, config=info["config"] or None,
               group=info["group"], tags=list(info["tags"]), **meta)


# ------------------------------------------------------------------------------------------ any path
def load_run(path: os.PathLike, name: Optional[str] = None) -> Run:
    """One run from a run folder, its ``metrics.json``, or an offline W&B run folder (module docstring)."""
    path = Path(os.path.expanduser(str(path)))
    if not path.exists():
        raise RunLoadError(f"{path}: no such run folder")
    if path.is_file():
        if path.name == METRICS_FILE:
            return _load_folder(path.parent, name)
        if path.suffix == ".wandb":
            return _load_wandb_offline(path.parent, name)
        raise RunLoadError(f"{path}: not a run (give a run folder, its {METRICS_FILE} or an offline W&B run folder)")
    if (path / METRICS_FILE).exists():
        return _load_folder(path, name)
    if any(path.glob("*.wandb")) or (path / "files" / "wandb-summary.json").is_file():
        return _load_wandb_offline(path, name)
    raise RunLoadError(f"{path}: no {METRICS_FILE} (run folder) and no W&B run file (offline W&B run folder)")


def _unique_names(runs: List[Run]) -> None:
    """Give runs with the same name the name of their parent folder too (then a counter)."""
    seen: Dict[str, int] = {}
    for run in runs:
        seen[run.name] = seen.get(run.name, 0) + 1
    for run in runs:
        if seen[run.name] > 1 and run.kind == "folder":
            run.name = f"{Path(run.source).parent.name}/{run.name}"
    used: Dict[str, int] = {}
    for run in runs:
        n = used.get(run.name, 0)
        used[run.name] = n + 1
        if n:
            run.name = f"{run.name} #{n + 1}"


def load_runs(paths: Sequence[os.PathLike], names: Optional[Sequence[str]] = None) -> List[Run]:
    """Runs from ``paths`` (in order), named by ``names`` when given, else by folder (made unique)."""
    if names is not None and len(names) != len(paths):
        raise ValueError(f"{len(names)} names for {len(paths)} runs")
    runs = [load_run(p, None if names is None else names[i]) for i, p in enumerate(paths)]
    if names is None:
        _unique_names(runs)
    elif len(set(names)) != len(names):
        raise ValueError(f"run names must differ, got {list(names)}")
    return runs


# ------------------------------------------------------------------------------------------ online W&B
def load_wandb_project(project: str, filters: Optional[Mapping[str, Any]] = None, entity: Optional[str] = None,
                       api: Any = None) -> List[Run]:
    """Runs of a W&B project (online, ``wandb.Api``), selected by ``filters`` (the API's MongoDB-style filters,
    e.g. ``{"group": "synthetic_shapes/synthetic", "tags": {"$in": ["ties:index"]}}``): scalars from each run's
    summary, curves from its logged ``curves`` table, the config as logged."""
    import wandb

    api = api or wandb.Api()
    path = f"{entity}/{project}" if entity else project
    runs: List[Run] = []
    for remote in api.runs(path, filters=dict(filters or {})):
        summary = dict(remote.summary._json_dict) if hasattr(remote.summary, "_json_dict") else dict(remote.summary)
        metrics = _metrics_from_summary(summary)
        tables = [artifact.get("curves") for artifact in remote.logged_artifacts()
                  if artifact.type == "run_table" and "curves" in artifact.name]
        curves, xs = _curves_from_rows(row for table in tables if table is not None for row in table.data)
        metrics.update(curves)
        config = {k: v for k, v in dict(remote.config).items() if not k.startswith("_")}
        meta = {"curve_x": xs, **_summary_meta(summary, f"wandb:{path}/{remote.id}")}
        runs.append(Run(name=f"{remote.name} ({remote.id})", source=f"wandb:{path}/{remote.id}", kind="wandb-online",
                        metrics=metrics, config=config or None, group=remote.group, tags=list(remote.tags or []),
                        **meta))
    if not runs:
        raise RunLoadError(f"wandb:{path}: no runs match the filters {dict(filters or {})}")
    return runs
