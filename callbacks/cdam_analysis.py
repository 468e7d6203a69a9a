"""CDAM analyses (Brocki & Chung; PROTOCOLS.md section 6) as an evaluation callback.

The per-image pieces and the mask convention (a map's positive share on an object's mask) are in
:mod:`evaluation.cdam`, the torchmetrics states (float64 sums) in :mod:`evaluation.metrics`. Metrics (keys
``cdam_analysis/...``):

* ``pearson/<a>__vs__<b>``: Pearson correlation between methods ``a`` and ``b`` over the raw scores pooled
  across all images and tokens (sums of x, y, x^2, y^2, xy and n), class setting ``class_setting``
  (default: predicted, as CDAM).
* ``sparsity/<m>``: share of tokens with ``|s| < 0.05 * max(s)`` (signed max, CDAM's definition), mean over
  images. An image whose max is <= 0 has share 0 under this definition (no token can be below a
  non-positive threshold); ``nonpositive_max/<m>`` reports the share of such images.
  ``sparsity_absmax/<m>``: the same with ``0.05 * max|s|``.
* Class discrimination on two-object images (needs ``batch["mask"]``, ``batch["other_mask"]`` and the
  ``target`` and ``other`` class settings), per method ``<m>``:
  ``discrimination/<m>/<map>_share_on_<object>`` for map in {target, other} and object in {target, other}:
  the share of the map's *positive* relevance that falls on the object's mask, mean over images with some
  positive relevance; ``discrimination/<m>/pearson_target_other`` (pooled over images and tokens) and
  ``.../pearson_target_other_per_image`` (mean of per-image correlations) between the two maps.
  Declared directions: a map's share on its own object is higher-is-better, its share on the other object
  lower-is-better; agreement, sparsity and the target-other correlations declare none.
"""
from __future__ import annotations

import itertools
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
from torchmetrics import Metric

from evaluation.cdam import mask_to_map, pearson_per_image, positive_share, sparsity_per_image
from evaluation.method_specs import check_class_settings
from evaluation.metrics import MeanOverImages, PooledPearson
from evaluation.result_keys import ResultKey

from .base import EvaluationCallback, Result, outputs_device, relevance_for

PREFIX = "cdam_analysis"


def _key(method: str, metric: str) -> ResultKey:
    return ResultKey(PREFIX, method, metric=metric)


# ------------------------------------------------------------------------------------------ callback
class CDAMAnalysis(EvaluationCallback):
    """Agreement (pooled Pearson), sparsity and two-object class discrimination of relevance maps.

    Args:
        methods: method names to analyse (default: every method of the module's outputs).
        pairs: method pairs for the agreement (default: all pairs of ``methods``).
        class_setting: class setting of the agreement and sparsity maps (CDAM: ``"predicted"``).
        discrimination: whether to run the two-object analysis (needs ``other_mask`` in the batch and the
            ``target`` / ``other`` class settings in the outputs). Class-agnostic methods (raw attention,
            rollout, concept maps: ``outputs["class_specific"][name] == False``) get no discrimination rows:
            their target and other maps are the same tensor.
        fraction: sparsity threshold fraction (CDAM: 0.05).
    """

    def __init__(self, methods: Optional[Sequence[str]] = None, pairs: Optional[Sequence[Sequence[str]]] = None,
                 class_setting: str = "predicted", discrimination: bool = True, fraction: float = 0.05) -> None:
        super().__init__()
        self.methods: Optional[List[str]] = list(methods) if methods is not None else None
        self.pairs = [tuple(p) for p in pairs] if pairs is not None else None
        if self.pairs is not None and any(len(p) != 2 for p in self.pairs):
            raise ValueError(f"pairs must be 2-element sequences, got {pairs}")
        check_class_settings([class_setting], "class_setting")
        self.class_setting = class_setting
        self.discrimination = bool(discrimination)
        self.fraction = float(fraction)
        settings = [class_setting] + (["target", "other"] if self.discrimination else [])
        self.required_class_settings = tuple(dict.fromkeys(settings))
        self._metrics: Dict[ResultKey, Metric] = {}
        self._declared: Dict[ResultKey, Optional[bool]] = {}
        self._built_methods: List[str] = []
        self._pairs: List[tuple] = []
        self._class_agnostic: frozenset = frozenset()
        if self.methods is not None:
            self.build(self.methods)

    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        return [f"cdam_analysis:{init_args.get('class_setting') or 'predicted'}"]

    # -------------------------------------------------------------------------------- metrics
    def build(self, methods: Sequence[str], class_agnostic: Sequence[str] = (), device=None) -> None:
        """The metrics of ``methods`` (no discrimination rows for the ``class_agnostic`` ones)."""
        methods = list(methods)
        pairs = self.pairs if self.pairs is not None else list(itertools.combinations(methods, 2))
        unknown = sorted({m for p in pairs for m in p} - set(methods))
        if unknown:
            raise ValueError(f"pairs name methods {unknown} that are not analysed ({methods})")
        self._built_methods, self._pairs = methods, [tuple(p) for p in pairs]
        self._class_agnostic = frozenset(class_agnostic)
        m: Dict[ResultKey, Metric] = {}
        declared: Dict[ResultKey, Optional[bool]] = {}
        for a, b in self._pairs:
            m[_key(f"{a}__vs__{b}", "pearson")] = PooledPearson()
        for name in methods:
            m[_key(name, "sparsity")] = MeanOverImages()
            m[_key(name, "sparsity_absmax")] = MeanOverImages()
            m[_key(name, "nonpositive_max")] = MeanOverImages()
            if self.discrimination and name not in self._class_agnostic:
                for mp, obj in itertools.product(("target", "other"), ("target", "other")):
                    key = _key(name, f"discrimination/{mp}_share_on_{obj}")
                    m[key] = MeanOverImages()
                    declared[key] = mp == obj   # relevance on the explained class's own object is the goal
                m[_key(name, "discrimination/pearson_target_other")] = PooledPearson()
                m[_key(name, "discrimination/pearson_target_other_per_image")] = MeanOverImages()
        self._metrics = m
        self._place_metrics(device)
        self._declared = {key: declared.get(key, metric.higher_is_better) for key, metric in m.items()}

    def reset(self) -> None:
        self._metrics, self._declared, self._built_methods, self._pairs = {}, {}, [], []
        self._class_agnostic = frozenset()

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        relevance = outputs["relevance"]
        agnostic = frozenset(name for name, specific in outputs.get("class_specific", {}).items() if not specific)
        if not self._metrics or (agnostic != self._class_agnostic and not any(
                metric.update_called for metric in self._metrics.values())):
            # built at the first batch of a run (the outputs say which methods are class-agnostic)
            methods = self.methods if self.methods is not None else list(relevance)
            self.build(methods, agnostic & set(methods), outputs_device(outputs))
        m = self._metrics
        maps = {name: relevance_for(relevance, name, self.class_setting, "cdam_analysis")
                for name in self._built_methods}
        for a, b in self._pairs:
            m[_key(f"{a}__vs__{b}", "pearson")].update(maps[a], maps[b])
        for name, s in maps.items():
            m[_key(name, "sparsity")].update(sparsity_per_image(s, self.fraction))
            m[_key(name, "sparsity_absmax")].update(sparsity_per_image(s, self.fraction, absolute_max=True))
            m[_key(name, "nonpositive_max")].update((s.detach().flatten(1).amax(dim=1) <= 0).to(torch.float64))
        if not self.discrimination:
            return
        if "other_mask" not in batch or "mask" not in batch:
            raise KeyError("cdam_analysis: class discrimination needs two-object batches with 'mask' and "
                           "'other_mask' (e.g. SyntheticShapesDataModule(two_objects=True)); "
                           "or build CDAMAnalysis(discrimination=False)")
        h_img, w_img = batch["mask"].shape[-2:]
        for name in self._built_methods:
            if name in self._class_agnostic:
                continue
            tgt = relevance_for(relevance, name, "target", "cdam_analysis")
            oth = relevance_for(relevance, name, "other", "cdam_analysis")
            cover = {"target": mask_to_map(batch["mask"], tuple(tgt.shape[1:]), (h_img, w_img)),
                     "other": mask_to_map(batch["other_mask"], tuple(tgt.shape[1:]), (h_img, w_img))}
            for mp, s in (("target", tgt), ("other", oth)):
                for obj in ("target", "other"):
                    share = positive_share(s, cover[obj].to(s.device))
                    m[_key(name, f"discrimination/{mp}_share_on_{obj}")].update(share)
            m[_key(name, "discrimination/pearson_target_other")].update(tgt, oth)
            m[_key(name, "discrimination/pearson_target_other_per_image")].update(pearson_per_image(tgt, oth))

    def compute(self) -> Dict[str, Result]:
        return {key.format(): float(metric.compute()) for key, metric in self._metrics.items()}

    def higher_is_better(self) -> Dict[str, Optional[bool]]:
        return {key.format(): value for key, value in self._declared.items()}
