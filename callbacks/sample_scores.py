"""Common shape of the catalogue tests whose results are means of per-sample values (localisation, complexity,
faithfulness correlation): one :class:`evaluation.sample_values.SampleValues` per method and class setting,
one column per metric of the subclass's ``metric_cards``.

A subclass declares ``PREFIX`` (the test of its result keys), ``metric_cards`` (one
:class:`~evaluation.metric_cards.MetricCard` per column, in order) and implements :meth:`sample_values` (the
``[B, len(metric_cards)]`` values of one map, NaN where a sample is skipped); it may override :meth:`aggregate`
(default: the mean over the non-NaN samples) and :meth:`sample_groups` (default: the batch's labels).

Results: ``<PREFIX>/<method>/<setting>/<metric>``, each with its card's ``higher_is_better``; the per-sample
values (:meth:`per_sample_scores`) under the same keys. Samples are identified by ``batch["index"]`` (required);
the states are gathered and sorted by index before any sum, so one process and several give identical numbers.

``oracle=True`` (a sanity check on ground-truth benchmarks) adds a method named ``oracle`` whose map is the ground
truth itself (:func:`oracle_map`: an image's ``mask`` as a pixel map, a text's rationale tokens as 1, else 0), the
same for every class setting: it should score better than every method on the localisation and faithfulness keys.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from evaluation.metric_cards import MetricCard
from evaluation.result_keys import ResultKey
from evaluation.sample_values import Count, SampleValues, nan_mean

from .base import EvaluationCallback, OncePerMap, Result, outputs_device, relevance_for

ORACLE = "oracle"


def oracle_map(batch: Dict[str, Any]) -> Tensor:
    """The ground truth of a batch as a map: ``mask`` ``[B, H, W]`` (images) or ``[B, N]`` token scores, 1 at the
    tokens of rationale words (texts); a ``KeyError`` naming what is missing otherwise."""
    if isinstance(batch.get("mask"), Tensor):
        mask = batch["mask"]
        return (mask[:, 0] if mask.dim() == 4 else mask).to(torch.float32)
    if isinstance(batch.get("word_ids"), Tensor) and isinstance(batch.get("rationale"), Tensor):
        word_ids, rationale = batch["word_ids"].long(), batch["rationale"].bool()
        inside = rationale.gather(1, word_ids.clamp(min=0, max=rationale.shape[1] - 1)) & (word_ids >= 0)
        return inside.to(torch.float32)
    raise KeyError(f"oracle: the batch has no ground truth ('mask', or 'word_ids' and 'rationale'); got keys "
                   f"{sorted(batch)}")


def with_oracle(outputs: Dict[str, Any], batch: Dict[str, Any], class_settings: Sequence[str],
                owner: str) -> Dict[str, Any]:
    """``outputs`` with the ground truth of ``batch`` (:func:`oracle_map`) added as method ``oracle`` for every
    class setting; a ``ValueError`` naming ``owner`` if the run already has a method of that name."""
    if ORACLE in outputs["relevance"]:
        raise ValueError(f"{owner}: oracle=True, but the run already has a method named {ORACLE!r}")
    truth = oracle_map(batch)
    return dict(outputs, relevance=dict(outputs["relevance"], **{ORACLE: {s: truth for s in class_settings}}))


class SampleScoreTest(EvaluationCallback):
    """Means of per-sample values per method and class setting (module docstring)."""

    PREFIX = "?"
    metric_cards: Tuple[MetricCard, ...] = ()
    #: what the test counts besides its values (e.g. ``forwards``: model passes), each reported as
    #: ``<PREFIX>/<counter>`` with no direction; a subclass updates ``self._metrics[<counter>]``
    counters: Tuple[str, ...] = ()

    def __init__(self, methods: Optional[Sequence[str]] = None, class_settings: Sequence[str] = ("predicted",),
                 oracle: bool = False) -> None:
        super().__init__()
        self._select(methods, class_settings)
        self.oracle = bool(oracle)
        self.reset()

    def _with_oracle(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> Dict[str, Any]:
        """``outputs`` with the ground-truth map as method ``oracle`` (when ``oracle`` is on), else as they are."""
        return with_oracle(outputs, batch, self.class_settings, self.PREFIX) if self.oracle else outputs

    def _indexed_outputs(self, outputs: Dict[str, Any], batch: Dict[str, Any],
                         index_use: str = "keys its per-sample values") -> Dict[str, Any]:
        """What every update starts with: ``KeyError`` unless the batch has each sample's dataset index (which
        ``index_use``), then :meth:`_with_oracle` and :meth:`_build_at_first_batch`; the outputs to read."""
        if not isinstance(batch.get("index"), Tensor):
            raise KeyError(f"{self.PREFIX}: the batch has no 'index' (each sample's dataset index), which {index_use};"
                           f" got keys {sorted(batch)}")
        outputs = self._with_oracle(outputs, batch)
        self._build_at_first_batch(outputs)
        return outputs

    def _build_at_first_batch(self, outputs: Dict[str, Any]) -> None:
        if not self._metrics:
            methods = list(self.methods) if self.methods is not None else [
                m for m in outputs["relevance"] if m != ORACLE]
            self.build(methods + ([ORACLE] if self.oracle else []), outputs_device(outputs))

    # ------------------------------------------------------------------------------------------ to implement
    def sample_values(self, relevance: Tensor, outputs: Dict[str, Any], batch: Dict[str, Any]) -> Tensor:
        """``[B, len(metric_cards)]`` float64 values of one map (NaN: skipped)."""
        raise NotImplementedError

    def sample_groups(self, outputs: Dict[str, Any], batch: Dict[str, Any], setting: str) -> Optional[Tensor]:
        """Each sample's group ``[B]`` (what :meth:`aggregate` may average per group; default: its label)."""
        label = batch.get("label")
        return label if isinstance(label, Tensor) else None

    def aggregate(self, name: str, values: Tensor, groups: Tensor) -> Tensor:
        """The result of metric ``name`` from its per-sample ``values`` ``[N]`` (default: mean of the non-NaN)."""
        return nan_mean(values[:, None])[0]

    def conventions(self) -> Dict[str, Any]:
        """The test's conventions as plain values (unit, tolerance, subsets, removal, score, seed, ...), written per
        key to ``metrics.meta.json`` beside the W&B tags; default: none."""
        return {}

    # ------------------------------------------------------------------------------------------ metrics
    @classmethod
    def metric_names(cls) -> List[str]:
        return [card.name for card in cls.metric_cards]

    def _pairs(self) -> List[Tuple[str, str]]:
        return [(m, s) for m in self._built_methods for s in self.class_settings]

    def build(self, methods: Sequence[str], device=None) -> None:
        """One :class:`SampleValues` per method and class setting, then one :class:`Count` per counter."""
        self._built_methods = list(methods)
        self._metrics = {f"{m}/{s}": SampleValues(len(self.metric_cards)) for m, s in self._pairs()}
        self._metrics.update({name: Count() for name in self.counters})
        self._place_metrics(device)

    def _result(self, method: str, setting: str, name: str) -> str:
        return ResultKey(self.PREFIX, method, setting, name).format()

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        outputs = self._indexed_outputs(outputs, batch)
        once = OncePerMap()       # a class-agnostic method's one map serves every class setting
        for method, setting in self._pairs():
            rel = relevance_for(outputs["relevance"], method, setting, self.PREFIX)
            values = once.get(rel, lambda rel=rel: self.sample_values(rel, outputs, batch))
            metric = self._metrics[f"{method}/{setting}"]
            groups = self.sample_groups(outputs, batch, setting)
            metric.update(batch["index"], values, groups)

    def compute(self) -> Dict[str, Result]:
        results: Dict[str, Result] = {}
        self._gathered: Dict[str, Tuple[Tensor, Tensor, Tensor]] = {}
        for method, setting in self._pairs():
            index, values, groups = self._metrics[f"{method}/{setting}"].gathered()   # every rank: gathered
            self._gathered[f"{method}/{setting}"] = (index, values, groups)
            for j, name in enumerate(self.metric_names()):
                results[self._result(method, setting, name)] = float(self.aggregate(name, values[:, j], groups))
        for name in self.counters:
            results[ResultKey(self.PREFIX, metric=name).format()] = float(self._metrics[name].compute())
        return results

    def per_sample_scores(self) -> Dict[str, tuple]:
        gathered = getattr(self, "_gathered", None) or {}
        out: Dict[str, tuple] = {}
        for pair, (index, values, _) in gathered.items():
            method, setting = pair.split("/", 1)
            for j, name in enumerate(self.metric_names()):
                out[self._result(method, setting, name)] = (index, values[:, j])
        return out

    def higher_is_better(self) -> Dict[str, Optional[bool]]:
        return {**{self._result(m, s, card.name): card.higher_is_better
                   for m, s in self._pairs() for card in self.metric_cards},
                **{ResultKey(self.PREFIX, metric=name).format(): None for name in self.counters}}

    def reset(self) -> None:
        super().reset()
        self._gathered = {}

    @staticmethod
    def _as_rows(*columns: Tensor) -> Tensor:
        return torch.stack([c.to(torch.float64) for c in columns], dim=1)
