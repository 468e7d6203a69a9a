"""Common shape of the evaluation callbacks.

The evaluation LightningModule's ``test_step`` returns, for every batch, a dict

    {"relevance":      {method_name: {class_setting: Tensor}},  # raw scores: [B, P] tokens or [B, H, W] pixels
     "targets":        {class_setting: LongTensor[B]},            # the class each setting explained
     "logits":         Tensor[B, C],                              # clean logits
     "class_specific": {method_name: bool},                       # False: the same tensor for every setting
     "layout":         the model's layout of the token scores (``.grid`` = (h, w) for images),
     "classifier":     evaluation.classifier.Classifier,          # the one way to classify (perturbed) inputs
     "explain":        AttributionEvaluationModule.explain,       # re-explain (perturbed) inputs: robustness tests
     "model":          the explained model (read only: the sanity checks explain randomised deep copies of it)}

and the batch (a dict with at least ``image`` in [0, 1] and ``label``; ``index``: each sample's dataset index).
A callback reads only these two: it never calls the module (a test that re-explains perturbed inputs does it
through ``outputs["explain"]``, the module's one entry point for that).

Data flow:

* **class settings**: a callback *declares* the class settings it needs in ``required_class_settings``; whoever
  builds the run (``evaluate.py``) passes their union (:meth:`EvaluationCallback.declared_class_settings`) to the
  module before the test starts;
* **metrics**: built at the first batch of a run (for the methods given, or every method of the outputs),
  torchmetrics ``Metric`` states accumulated in :meth:`update`; at the end of the test epoch :meth:`compute` runs
  **on every rank** (torchmetrics synchronises the states across processes; every process gets at least one
  batch, ``datamodules.unrepeated.UnrepeatedTestData``);
* **results**: keyed by :class:`evaluation.result_keys.ResultKey` strings, handed, with each key's
  ``higher_is_better`` and the curves' x values, to the run's :class:`~callbacks.reporter.ResultsReporter`, the
  one way results leave a run (logger, ``metrics.json`` and its sidecar ``metrics.meta.json`` with those
  declarations, the printed table);
* **W&B tags**: a callback class declares the tags of a run that uses it (:meth:`EvaluationCallback.wandb_tags`,
  from its config's ``init_args``, e.g. the test's conventions); ``cli.commands`` collects them;
* **progress** (resumable runs, :mod:`callbacks.progress`): :meth:`EvaluationCallback.progress_state` is what a
  checkpoint keeps of a callback: the state of every metric of :meth:`metrics` (in its order), the arguments of
  the latest call of the subclass's ``build``, and :meth:`extra_progress_state` (whatever else the callback keeps,
  e.g. rows written at the end), restored by :meth:`load_extra_progress_state`. A subclass that builds its metrics
  lazily does it in a method named ``build`` with named arguments (no ``*args``; values: plain values, lists, sets
  or dicts of them) and an optional ``device``; the base class records the arguments at every call, so a resumed
  run calls ``build`` with the same method list before it restores the states
  (:meth:`EvaluationCallback.build_from_progress`). Any other callback of the run that defines the two
  ``*_progress_state`` methods is checkpointed the same way.
"""
from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import pytorch_lightning as pl
import torch
from torch import Tensor
from torchmetrics import Metric

from evaluation.method_specs import CLASS_SETTINGS

from .reporter import ResultsReporter

Result = Union[float, List[float]]


def outputs_device(outputs: Dict[str, Any]) -> torch.device:
    """The device of a ``test_step`` output (its logits, else its first relevance tensor)."""
    logits = outputs.get("logits")
    if isinstance(logits, Tensor):
        return logits.device
    return next(iter(next(iter(outputs["relevance"].values())).values())).device


def relevance_for(relevance: Dict[str, Dict[str, Tensor]], method: str, setting: str, owner: str) -> Tensor:
    """``relevance[method][setting]`` of a ``test_step`` output; a ``KeyError`` that names the callback
    (``owner``), the missing pair and what the outputs hold otherwise."""
    try:
        return relevance[method][setting]
    except KeyError:
        have = ", ".join(f"{k}: {sorted(v)}" for k, v in relevance.items())
        raise KeyError(f"{owner}: no relevance for method {method!r}, class setting {setting!r}; outputs have "
                       f"{{{have}}}") from None


def tie_scores(perturber: Any, ties: str, batch: Dict[str, Any], layout: Any, seed: int, owner: str
               ) -> Optional[Tensor]:
    """The unit scores that order equal scores in the ``random`` tie convention (each sample's random map, from
    ``batch["index"]``; :mod:`evaluation.ranking`), ``None`` for ``index``."""
    if ties != "random":
        return None
    if "index" not in batch:
        raise KeyError(f"{owner}: ties='random' orders ties by each sample's random map, drawn from its dataset "
                       "index, but the batch has no 'index'")
    return perturber.tie_scores(batch["index"], batch, layout, seed)


class OncePerMap:
    """Results computed once per relevance tensor of a batch: a class-agnostic method gives the same tensor object
    for every class setting, so its tests run once (``key``: extra values that must match too, e.g. the explained
    classes, compared with ``torch.equal``)."""

    def __init__(self) -> None:
        self._done: List[tuple] = []

    def get(self, tensor: Tensor, compute: Callable[[], Any], key: Optional[Tensor] = None) -> Any:
        for done_tensor, done_key, value in self._done:
            if done_tensor is tensor and (key is None or torch.equal(done_key, key)):
                return value
        value = compute()
        self._done.append((tensor, key, value))
        return value


def _plain(value: Any) -> Any:
    """``value`` as what a progress file holds (read back with ``torch.load(weights_only=True)``): tuples as lists,
    sets sorted into lists, mappings as dicts; a value of another kind is refused with a ``TypeError``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    raise TypeError(f"a build argument of an evaluation callback must be a plain value (None, bool, number, str, "
                    f"or lists, sets and dicts of them) to be saved in a progress file; got {type(value).__name__}")


def _recording_build(build: Callable) -> Callable:
    """``build`` that also records, in ``self._built_with``, the arguments of its latest call (``device`` aside)."""
    signature = inspect.signature(build)

    @functools.wraps(build)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        arguments: Dict[str, Any] = {}
        for name, value in list(bound.arguments.items())[1:]:   # [0] is self
            if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(value)
            elif name != "device":
                arguments[name] = value
        out = build(self, *args, **kwargs)
        self._built_with = arguments   # made plain (or refused) only when a checkpoint is written
        return out

    wrapper._records_build_arguments = True  # type: ignore[attr-defined]
    return wrapper


def _metric_state(metric: Metric) -> Dict[str, Any]:
    """A metric's states as CPU copies, its class and its number of updates."""
    states = {name: ([v.detach().cpu().clone() for v in value] if isinstance(value, list)
                     else value.detach().cpu().clone()) for name, value in metric.metric_state.items()}
    return {"class": type(metric).__qualname__, "states": states, "update_count": int(metric._update_count)}


def _load_metric_state(metric: Metric, saved: Dict[str, Any], where: str) -> None:
    """Put ``saved`` (:func:`_metric_state`) into ``metric``; a state of another name, shape or kind is refused."""
    if saved.get("class") != type(metric).__qualname__:
        raise ValueError(f"{where}: the saved metric is a {saved.get('class')}, the run builds a "
                         f"{type(metric).__qualname__}")
    states = saved.get("states") or {}
    if set(states) != set(metric._defaults):
        raise ValueError(f"{where}: saved states {sorted(states)}, the {type(metric).__qualname__} has "
                         f"{sorted(metric._defaults)}")
    device = metric.device
    for name, default in metric._defaults.items():
        value = states[name]
        if isinstance(default, Tensor):
            if not isinstance(value, Tensor) or value.shape != default.shape or value.dtype != default.dtype:
                got = (tuple(value.shape), value.dtype) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(f"{where}: state {name!r} was saved as {got}, the metric holds "
                                 f"{(tuple(default.shape), default.dtype)}")
            setattr(metric, name, value.to(device))
        else:
            if not isinstance(value, list) or not all(isinstance(v, Tensor) for v in value):
                raise ValueError(f"{where}: state {name!r} must be a list of tensors")
            setattr(metric, name, [v.to(device) for v in value])
    metric._update_count = int(saved.get("update_count", 0))
    metric._computed = None


class EvaluationCallback(pl.Callback):
    """Base class: subclasses implement ``update``, ``compute``, ``metrics``, ``reset`` and ``higher_is_better``;
    those that build their metrics lazily do it in ``build(...)`` (module docstring, **progress**)."""

    #: class settings ("predicted", "target", "other") the callback needs the module to explain
    required_class_settings: tuple = ()
    #: the arguments of the latest ``build`` call (recorded by the base class; ``None``: never built)
    _built_with: Optional[Dict[str, Any]] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        build = cls.__dict__.get("build")
        if callable(build) and not getattr(build, "_records_build_arguments", False) and not any(
                p.kind is inspect.Parameter.VAR_POSITIONAL for p in inspect.signature(build).parameters.values()):
            cls.build = _recording_build(build)   # a build(*args) cannot be called back by name: not recorded

    def _select(self, methods: Optional[Sequence[str]], class_settings: Sequence[str],
                allowed: Sequence[str] = CLASS_SETTINGS) -> None:
        """Set ``methods`` (``None``: every method of the outputs) and ``class_settings``, a non-empty subset of
        ``allowed`` (and of :data:`CLASS_SETTINGS`), which the callback requires."""
        if not class_settings or any(s not in allowed or s not in CLASS_SETTINGS for s in class_settings):
            raise ValueError(f"class_settings must be a non-empty subset of {allowed}, got {list(class_settings)}")
        self.methods: Optional[List[str]] = list(methods) if methods is not None else None
        self.class_settings = tuple(class_settings)
        self.required_class_settings = self.class_settings

    @staticmethod
    def declared_class_settings(callbacks: Iterable[Any], base: Sequence[str] = ()) -> tuple:
        """The union of ``base`` and the settings the ``EvaluationCallback``s among ``callbacks`` declare, in the
        order of :data:`CLASS_SETTINGS`."""
        wanted = set(base)
        for callback in callbacks:
            if isinstance(callback, EvaluationCallback):
                wanted |= set(callback.required_class_settings)
        return tuple(s for s in CLASS_SETTINGS if s in wanted)

    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        """The W&B tags (``<what>:<value>``) of a run with this callback built with ``init_args`` (its config's),
        e.g. the test's conventions (default: none)."""
        return []

    @staticmethod
    def declared_wandb_tags(callbacks: Iterable[Any]) -> List[str]:
        """The tags the ``EvaluationCallback`` classes among ``callbacks`` (config items: ``class_path`` and
        ``init_args``, before they are instantiated) declare, in their order."""
        tags: List[str] = []
        for item in callbacks:
            if not hasattr(item, "get") or not item.get("class_path"):
                continue
            module, _, name = str(item["class_path"]).rpartition(".")
            cls = getattr(importlib.import_module(module), name, None) if module else None
            if isinstance(cls, type) and issubclass(cls, EvaluationCallback):
                tags += cls.wandb_tags(item.get("init_args") or {})
        return tags

    # -- to implement -------------------------------------------------------------------------------------
    def metrics(self) -> List[Metric]:
        """Every metric, in a fixed order (default: the values of the dict ``self._metrics``)."""
        return list(self._metrics.values())

    def reset(self) -> None:
        """Forget the metrics of a previous run (they are built again at the first batch)."""
        self._metrics, self._built_methods = {}, []

    def _build_at_first_batch(self, outputs: Dict[str, Any]) -> None:
        """``build`` the metrics unless built: for ``methods``, else for every method of the outputs."""
        if not self._metrics:
            self.build(self.methods if self.methods is not None else list(outputs["relevance"]),
                       outputs_device(outputs))

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        raise NotImplementedError

    def compute(self) -> Dict[str, Result]:
        raise NotImplementedError

    def higher_is_better(self) -> Dict[str, Optional[bool]]:
        """``{result key: True | False | None}`` as the metrics declare it (``None``: neither direction)."""
        raise NotImplementedError

    def curve_x(self) -> Dict[str, List[float]]:
        """``{result key: x values}`` of the list-valued results (default: none)."""
        return {}

    def per_sample_scores(self) -> Dict[str, tuple]:
        """``{result key: (sample indices LongTensor[N], values Tensor[N] or [N, X])}`` after :meth:`compute`, on
        every rank, gathered across processes (list states with ``dist_reduce_fx="cat"``), the rows in any order
        (the writer sorts them by index): what the run's per-sample sidecar holds (default: nothing)."""
        return {}

    def conventions(self) -> Dict[str, Any]:
        """The conventions every result of the callback was computed with (score, fill, unit, grid, ...), written
        per key to ``metrics.meta.json`` (default: none)."""
        return {}

    def _place_metrics(self, device: Optional[torch.device]) -> None:
        """Move every metric of :meth:`metrics` to ``device`` (``None``: leave them where they are)."""
        if device is not None:
            for metric in self.metrics():
                metric.to(device)

    # -- progress checkpoints (callbacks.progress) ---------------------------------------------------------
    def extra_progress_state(self) -> Dict[str, Any]:
        """What a resumed run needs besides the torchmetrics states (default: nothing). Tensors, plain values and
        lists/dicts of them (a progress file is read with ``torch.load(weights_only=True)``); on each process its
        own share, as it was after the last finished batch."""
        return {}

    def load_extra_progress_state(self, state: Dict[str, Any]) -> None:
        """Take back what :meth:`extra_progress_state` returned (called at the test start of a resumed run, after
        the callback's own ``on_test_start``; default: nothing to restore)."""

    def progress_state(self) -> Dict[str, Any]:
        """What a progress checkpoint keeps of this callback (module docstring, **progress**)."""
        metrics = self.metrics()
        try:
            build = _plain(self._built_with) if metrics and self._built_with is not None else None
        except TypeError as err:
            raise TypeError(f"{type(self).__name__}: {err}") from None
        return {"build": build,
                "metrics": [_metric_state(metric) for metric in metrics],
                "extra": self.extra_progress_state()}

    def build_from_progress(self, state: Dict[str, Any], device: Optional[torch.device] = None) -> None:
        """Rebuild the metrics as :meth:`progress_state` saw them (``build`` called with the saved arguments),
        restore their states (on ``device``) and the extra state."""
        name = type(self).__name__
        if state.get("build") is not None:
            if not callable(getattr(self, "build", None)):
                raise ValueError(f"{name}: the progress file has build arguments but the callback has no build()")
            self.build(**state["build"])
        metrics, saved = self.metrics(), list(state.get("metrics") or [])
        if len(metrics) != len(saved):
            raise ValueError(f"{name}: the progress file holds {len(saved)} metrics, the callback built "
                             f"{len(metrics)} (build arguments {state.get('build')})")
        for i, (metric, values) in enumerate(zip(metrics, saved)):
            if device is not None:
                metric.to(device)
            _load_metric_state(metric, values, f"{name}, metric {i}")
        self.load_extra_progress_state(dict(state.get("extra") or {}))

    # -- Lightning hooks ----------------------------------------------------------------------------------
    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.reset()

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        with torch.no_grad():
            self.update(outputs, batch)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        results = self.compute()  # every rank: torchmetrics reduces the states across processes
        ResultsReporter.of(trainer).report(results, self.higher_is_better(), self.curve_x(), pl_module,
                                           conventions=self.conventions(), per_sample=self.per_sample_scores())
