"""CDAM analyses (Brocki & Chung; PROTOCOLS.md section 6) as an evaluation callback.

Metrics (keys ``cdam_analysis/...``), all accumulated in torchmetrics states that are sums (float64) so the
result on N processes equals the result on one, up to float64 summation order:

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

Mask convention: a token map ``[B, P]`` (row-major grid ``h x w``, ``h * w = P``, same aspect as the image) is
compared with the mask *downsampled by area* to the token grid: token i carries the fraction ``c_i`` of its
patch covered by the object, and ``share = sum_i relu(s_i) c_i / sum_i relu(s_i)``. This is exactly the pixel
share of the map upsampled by nearest-neighbour replication (CDAM's visualisation). Pixel maps ``[B, H, W]`` are
compared with the mask area-pooled to the map's size.
"""
from __future__ import annotations

import itertools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Metric

from .base import EvaluationCallback, Result

PREFIX = "cdam_analysis"


def _f64(x: Tensor) -> Tensor:
    return x.detach().to(torch.float64)


class PooledPearson(Metric):
    """Pearson correlation of two score tensors pooled over everything passed to ``update`` (float64 sums)."""

    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name in ("sx", "sy", "sxx", "syy", "sxy", "n"):
            self.add_state(name, default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, x: Tensor, y: Tensor) -> None:
        if x.shape != y.shape:
            raise ValueError(f"pearson: shapes differ {tuple(x.shape)} vs {tuple(y.shape)}")
        x, y = _f64(x).flatten(), _f64(y).flatten()
        self.sx += x.sum()
        self.sy += y.sum()
        self.sxx += (x * x).sum()
        self.syy += (y * y).sum()
        self.sxy += (x * y).sum()
        self.n += x.numel()

    def compute(self) -> Tensor:
        n = self.n
        cov = n * self.sxy - self.sx * self.sy
        var = (n * self.sxx - self.sx ** 2) * (n * self.syy - self.sy ** 2)
        if n < 2 or var <= 0:
            return torch.tensor(float("nan"), dtype=torch.float64)
        return cov / torch.sqrt(var)


class MeanOverImages(Metric):
    """Mean of per-image values (float64 sum and count); NaN values are skipped."""

    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, values: Tensor) -> None:
        values = _f64(values).flatten()
        keep = ~torch.isnan(values)
        self.total += values[keep].sum()
        self.count += keep.sum()

    def compute(self) -> Tensor:
        if self.count == 0:
            return torch.tensor(float("nan"), dtype=torch.float64)
        return self.total / self.count


# ------------------------------------------------------------------------------------------ per-image pieces
def sparsity_per_image(scores: Tensor, fraction: float = 0.05, absolute_max: bool = False) -> Tensor:
    """Share of entries with ``|s| < fraction * max(s)`` per image (``max|s|`` when ``absolute_max``)."""
    s = _f64(scores).flatten(1)
    peak = s.abs().amax(dim=1) if absolute_max else s.amax(dim=1)
    return (s.abs() < fraction * peak[:, None]).to(torch.float64).mean(dim=1)


def mask_to_map(mask: Tensor, map_shape: Tuple[int, ...], image_hw: Tuple[int, int]) -> Tensor:
    """Object coverage per map cell ``[B, *map_shape]`` (area pooling of the pixel mask ``[B, H, W]``).

    ``map_shape`` is ``(P,)`` for token maps (row-major grid with the image's aspect) or ``(h, w)``.
    """
    h_img, w_img = image_hw
    if len(map_shape) == 1:
        p = map_shape[0]
        # grid h x w with h / w == H / W and h * w == P
        h = int(round((p * h_img / w_img) ** 0.5))
        w = p // max(h, 1)
        if h * w != p or h_img % h or w_img % w:
            raise ValueError(f"cannot lay {p} tokens on a grid dividing a {h_img}x{w_img} mask")
    else:
        h, w = map_shape
        if h_img % h or w_img % w:
            raise ValueError(f"map {h}x{w} does not divide the {h_img}x{w_img} mask")
    cover = F.avg_pool2d(_f64(mask)[:, None], kernel_size=(h_img // h, w_img // w))[:, 0]
    return cover.flatten(1) if len(map_shape) == 1 else cover


def positive_share(scores: Tensor, coverage: Tensor) -> Tensor:
    """Per image: sum(relu(s) * coverage) / sum(relu(s)); NaN where no score is positive."""
    pos = _f64(scores).flatten(1).clamp_min(0)
    cov = coverage.flatten(1)
    total = pos.sum(dim=1)
    share = (pos * cov).sum(dim=1) / total.clamp_min(1e-300)
    return torch.where(total > 0, share, torch.full_like(share, float("nan")))


def pearson_per_image(x: Tensor, y: Tensor) -> Tensor:
    x, y = _f64(x).flatten(1), _f64(y).flatten(1)
    xc, yc = x - x.mean(dim=1, keepdim=True), y - y.mean(dim=1, keepdim=True)
    den = torch.sqrt((xc * xc).sum(1) * (yc * yc).sum(1))
    r = (xc * yc).sum(1) / den.clamp_min(1e-300)
    return torch.where(den > 0, r, torch.full_like(r, float("nan")))


# ------------------------------------------------------------------------------------------ callback
class CDAMAnalysis(EvaluationCallback):
    """Agreement (pooled Pearson), sparsity and two-object class discrimination of relevance maps.

    Args:
        methods: method names to analyse (default: every method in the outputs, fixed at the first batch —
            give them explicitly under DDP so every rank builds the same metrics even without batches).
        pairs: method pairs for the agreement (default: all pairs of ``methods``).
        class_setting: class setting of the agreement and sparsity maps (CDAM: ``"predicted"``).
        discrimination: whether to run the two-object analysis (needs ``other_mask`` in the batch and the
            ``target`` / ``other`` class settings in the outputs). Class-agnostic methods of the module (raw
            attention, rollout, concept maps: ``method.class_specific == False``) get no discrimination rows:
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
        self.class_setting = class_setting
        self.discrimination = bool(discrimination)
        self.fraction = float(fraction)
        settings = [class_setting] + (["target", "other"] if self.discrimination else [])
        self.required_class_settings = tuple(dict.fromkeys(settings))
        self._metrics: Dict[str, Metric] = {}
        self._class_agnostic: set = set()
        if self.methods is not None:
            self._build(self.methods)

    def on_test_start(self, trainer, pl_module) -> None:
        methods = getattr(pl_module, "methods", None)
        if isinstance(methods, dict):   # the same on every rank: the metric sets stay identical across processes
            agnostic = {name for name, m in methods.items() if not getattr(m, "class_specific", True)}
            if agnostic != self._class_agnostic:
                self._class_agnostic = agnostic
                if self._metrics:
                    self._build(self.methods)
        super().on_test_start(trainer, pl_module)

    # -------------------------------------------------------------------------------- metrics
    def _build(self, methods: Sequence[str], device: Optional[torch.device] = None) -> None:
        self.methods = list(methods)
        pairs = self.pairs if self.pairs is not None else list(itertools.combinations(self.methods, 2))
        unknown = sorted({m for p in pairs for m in p} - set(self.methods))
        if unknown:
            raise ValueError(f"pairs name methods {unknown} that are not analysed ({self.methods})")
        self.pairs = [tuple(p) for p in pairs]
        m: Dict[str, Metric] = {}
        for a, b in self.pairs:
            m[f"pearson/{a}__vs__{b}"] = PooledPearson()
        for name in self.methods:
            m[f"sparsity/{name}"] = MeanOverImages()
            m[f"sparsity_absmax/{name}"] = MeanOverImages()
            m[f"nonpositive_max/{name}"] = MeanOverImages()
            if self.discrimination and name not in self._class_agnostic:
                for mp, obj in itertools.product(("target", "other"), ("target", "other")):
                    m[f"discrimination/{name}/{mp}_share_on_{obj}"] = MeanOverImages()
                m[f"discrimination/{name}/pearson_target_other"] = PooledPearson()
                m[f"discrimination/{name}/pearson_target_other_per_image"] = MeanOverImages()
        if device is not None:
            for metric in m.values():
                metric.to(device)
        self._metrics = m

    def metrics(self) -> List[Metric]:
        return list(self._metrics.values())

    @staticmethod
    def _get(relevance: Dict[str, Dict[str, Tensor]], method: str, setting: str) -> Tensor:
        try:
            return relevance[method][setting]
        except KeyError:
            have = {k: sorted(v) for k, v in relevance.items()}
            raise KeyError(f"cdam_analysis: no relevance for method {method!r}, class setting {setting!r}; "
                           f"outputs have {have}") from None

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any], pl_module=None) -> None:
        relevance = outputs["relevance"]
        if self.methods is None or not self._metrics:
            device = next(iter(next(iter(relevance.values())).values())).device
            self._build(list(relevance) if self.methods is None else self.methods, device)
        m = self._metrics
        maps = {name: self._get(relevance, name, self.class_setting) for name in self.methods}
        for a, b in self.pairs:
            m[f"pearson/{a}__vs__{b}"].update(maps[a], maps[b])
        for name, s in maps.items():
            m[f"sparsity/{name}"].update(sparsity_per_image(s, self.fraction))
            m[f"sparsity_absmax/{name}"].update(sparsity_per_image(s, self.fraction, absolute_max=True))
            m[f"nonpositive_max/{name}"].update((_f64(s).flatten(1).amax(dim=1) <= 0).to(torch.float64))
        if not self.discrimination:
            return
        if "other_mask" not in batch or "mask" not in batch:
            raise KeyError("cdam_analysis: class discrimination needs two-object batches with 'mask' and "
                           "'other_mask' (e.g. SyntheticShapesDataModule(two_objects=True)); "
                           "or build CDAMAnalysis(discrimination=False)")
        h_img, w_img = batch["mask"].shape[-2:]
        for name in self.methods:
            if name in self._class_agnostic:
                continue
            tgt, oth = self._get(relevance, name, "target"), self._get(relevance, name, "other")
            cover = {"target": mask_to_map(batch["mask"], tuple(tgt.shape[1:]), (h_img, w_img)),
                     "other": mask_to_map(batch["other_mask"], tuple(tgt.shape[1:]), (h_img, w_img))}
            for mp, s in (("target", tgt), ("other", oth)):
                for obj in ("target", "other"):
                    m[f"discrimination/{name}/{mp}_share_on_{obj}"].update(positive_share(s, cover[obj].to(s.device)))
            m[f"discrimination/{name}/pearson_target_other"].update(tgt, oth)
            m[f"discrimination/{name}/pearson_target_other_per_image"].update(pearson_per_image(tgt, oth))

    def compute(self) -> Dict[str, Result]:
        return {f"{PREFIX}/{key}": float(metric.compute()) for key, metric in self._metrics.items()}
