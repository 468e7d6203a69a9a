"""Image perturbation test (Chefer et al. 2021a; reused by 2021b and Beyond Intuition), PROTOCOLS.md section 1.

For every method, class setting (``predicted``: the argmax class was explained; ``target``: the ground truth)
and direction:

1. the raw relevance is turned into a pixel map: bilinear upsampling (``align_corners=False``) to the image
   size and min-max normalisation **per sample** (:func:`callbacks.pixel_maps.pixel_maps`);
2. ``positive`` removes the most relevant pixels first, ``negative`` negates the map first (least relevant
   removed first);
3. for each fraction ``p`` in ``fractions`` (default 0.1, ..., 0.9) the top ``k = int(p * H * W)`` pixels are
   masked in all three channels; masking convention ``chefer`` (default): the pixel is set to 0 in [0, 1]
   space **before** the model's normalisation (black); ``mean``: it is set to the model's mean colour, i.e. 0
   **after** normalisation (Beyond Intuition's CLIP test);
4. every masked image is re-classified (masked forwards batched, ``forward_batch_size`` images per forward) and
   scored by top-1 accuracy **against the ground-truth label**, whatever class was explained; step 0 is the
   clean accuracy.

Tie-breaking (``ties``): pixels are ordered by a *stable* descending sort of the (possibly negated) normalised
map. ``random`` (default): among equal scores in the order of the random baseline's map of the same sample
(``methods.random_baseline``: token scores seeded by ``(tie_seed, batch["index"])``, upsampled like every map),
negated in the negative test as the map is. So a map that ranks nothing (a constant map) is scored exactly like
the ``random`` method with ``seed=tie_seed`` -- the null that "better than a random map" compares against --
and the order is the same on any number of processes. ``index``: among equal scores the pixel with the smaller
row-major flat index ``y * W + x`` first, in both directions; a constant map is then removed top to bottom,
which scores unlike the random map (on the synthetic benchmark's ViT, Grad-CAM's positive AUC is 38.4 with
``index`` and 30.9 with ``random``, random map 33.4: its ``relu`` leaves about half of the tokens, and whole
images, at zero). (The references use ``torch.topk``, whose order among ties is unspecified.)

AUC conventions (the raw curve is always stored; both are in percent of accuracy x fraction):

* ``chefer`` (default): ``100 * trapezoid(y, x)`` with ``x = [0] + fractions`` and ``y[0]`` = clean accuracy;
* ``bi``: ``100 * sklearn.metrics.auc`` over ``x = [0] + fractions + [1.0]`` with ``y = [clean] + accs + [0]``.

Results: ``perturbation/<method>/<positive|negative>/<predicted|target>/auc`` and ``.../curve`` (the accuracy
at ``[0] + fractions``, in [0, 1]). States are float64 sums of per-step correct counts and of the number of
samples, so one process and N processes (each sample seen exactly once) give the same values.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from .base import EvaluationCallback, Result
from .pixel_maps import pixel_maps

PREFIX = "perturbation"
DEFAULT_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
DIRECTIONS = ("positive", "negative")
AUC_CONVENTIONS = ("chefer", "bi")
MASKINGS = ("chefer", "mean")
TIES = ("index", "random")
CLASS_SETTINGS = ("predicted", "target", "other")


# ------------------------------------------------------------------------------------------ pure functions
def trapezoid(y: Sequence[float], x: Sequence[float]) -> float:
    """``sum_i (x[i+1] - x[i]) * (y[i+1] + y[i]) / 2`` (numpy's ``trapezoid`` / sklearn's ``auc``)."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"trapezoid needs as many x as y values (at least 2), got {len(x)} and {len(y)}")
    return float(sum((x[i + 1] - x[i]) * (y[i + 1] + y[i]) / 2.0 for i in range(len(x) - 1)))


def perturbation_auc(curve: Sequence[float], fractions: Sequence[float] = DEFAULT_FRACTIONS,
                     convention: str = "chefer") -> float:
    """AUC (percent) of an accuracy ``curve`` at ``[0] + fractions`` (``curve[0]`` = clean accuracy)."""
    curve = [float(v) for v in curve]
    fractions = [float(f) for f in fractions]
    if len(curve) != len(fractions) + 1:
        raise ValueError(f"curve has {len(curve)} points; expected {len(fractions) + 1} (clean + one per fraction)")
    if convention == "chefer":
        return 100.0 * trapezoid(curve, [0.0] + fractions)
    if convention == "bi":
        return 100.0 * trapezoid(curve + [0.0], [0.0] + fractions + [1.0])
    raise ValueError(f"unknown AUC convention {convention!r}; choose one of {AUC_CONVENTIONS}")


def removal_ranks(maps: Tensor, tie_breaker: Optional[Tensor] = None) -> Tensor:
    """Rank of every pixel in the removal order, ``[B, H*W]`` (0 = removed first).

    Descending, *stable* sort of the flattened map: among equal values the smaller flat index comes first, or,
    with ``tie_breaker`` (a map of the same shape), the pixel with the larger ``tie_breaker`` value (then the
    smaller flat index).
    """
    flat = maps.reshape(maps.shape[0], -1)
    if tie_breaker is None:
        order = torch.sort(flat, dim=1, descending=True, stable=True).indices
    else:
        breaker = tie_breaker.reshape(flat.shape).to(flat.device)
        first = torch.sort(breaker, dim=1, descending=True, stable=True).indices      # the order among ties
        order = first.gather(1, torch.sort(flat.gather(1, first), dim=1, descending=True, stable=True).indices)
    ranks = torch.empty_like(order)
    positions = torch.arange(flat.shape[1], device=flat.device).expand_as(order)
    return ranks.scatter_(1, order, positions)


def pixels_per_step(fractions: Sequence[float], num_pixels: int) -> List[int]:
    """``k = int(p * num_pixels)`` for each fraction (the reference's truncation)."""
    return [int(p * num_pixels) for p in fractions]


def masked_images(images: Tensor, ranks: Tensor, ks: Sequence[int], fill: Tensor) -> Tensor:
    """``[S, B, 3, H, W]``: step ``s`` replaces the pixels of rank ``< ks[s]`` by ``fill`` (all channels)."""
    b, c, h, w = images.shape
    k = torch.as_tensor(list(ks), device=images.device)
    removed = (ranks[None] < k[:, None, None]).reshape(len(ks), b, 1, h, w)
    fill = fill.to(images).reshape(1, 1, c, 1, 1)
    return torch.where(removed, fill, images[None])


# ------------------------------------------------------------------------------------------ metric
class PerturbationCurve(Metric):
    """Accuracy per perturbation step: float64 sums of correct predictions per step and of samples."""

    full_state_update = False

    def __init__(self, num_points: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_points = int(num_points)
        self.add_state("correct", default=torch.zeros(self.num_points, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, correct: Tensor) -> None:
        """``correct``: bool ``[B, num_points]`` (column 0: clean prediction)."""
        if correct.dim() != 2 or correct.shape[1] != self.num_points:
            raise ValueError(f"expected correctness [B, {self.num_points}], got {tuple(correct.shape)}")
        self.correct += correct.to(torch.float64).sum(dim=0)
        self.total += correct.shape[0]

    def compute(self) -> Tensor:
        if self.total == 0:
            return torch.full((self.num_points,), float("nan"), dtype=torch.float64)
        return self.correct / self.total


# ------------------------------------------------------------------------------------------ callback
class PerturbationTest(EvaluationCallback):
    """Positive/negative perturbation curves and AUCs per method and class setting (module docstring).

    Args:
        methods: method names (default: every method the evaluation module evaluates).
        class_settings: which explained classes to test (``predicted``, ``target``).
        directions: ``positive`` and/or ``negative``.
        fractions: fractions of pixels removed (step 0, the clean image, is always added).
        auc: AUC convention reported as ``.../auc``: ``chefer`` (default) or ``bi``.
        masking: ``chefer`` (0 in [0, 1] space before normalisation, default) or ``mean`` (model mean colour).
        forward_batch_size: images per masked forward (default: the module's ``forward_batch_size``).
        ties: order among equal scores, ``random`` (default: the random baseline's map with ``seed=tie_seed``,
            from ``batch["index"]``; needs ``pl_module.token_grid``) or ``index``; see the module docstring.
    """

    def __init__(self, methods: Optional[Sequence[str]] = None,
                 class_settings: Sequence[str] = ("predicted", "target"),
                 directions: Sequence[str] = DIRECTIONS, fractions: Sequence[float] = DEFAULT_FRACTIONS,
                 auc: str = "chefer", masking: str = "chefer", forward_batch_size: Optional[int] = None,
                 ties: str = "random", tie_seed: int = 0) -> None:
        super().__init__()
        bad = [s for s in class_settings if s not in CLASS_SETTINGS]
        if bad or not class_settings:
            raise ValueError(f"class_settings must be a non-empty subset of {CLASS_SETTINGS}, got {list(class_settings)}")
        bad = [d for d in directions if d not in DIRECTIONS]
        if bad or not directions:
            raise ValueError(f"directions must be a non-empty subset of {DIRECTIONS}, got {list(directions)}")
        if not fractions or any(not 0.0 < float(p) <= 1.0 for p in fractions) or list(fractions) != sorted(fractions):
            raise ValueError(f"fractions must be increasing values in (0, 1], got {list(fractions)}")
        if auc not in AUC_CONVENTIONS:
            raise ValueError(f"unknown AUC convention {auc!r}; choose one of {AUC_CONVENTIONS}")
        if masking not in MASKINGS:
            raise ValueError(f"unknown masking convention {masking!r}; choose one of {MASKINGS}")
        if ties not in TIES:
            raise ValueError(f"unknown tie-breaking convention {ties!r}; choose one of {TIES}")
        if auc == "bi" and float(fractions[-1]) >= 1.0:
            raise ValueError("the 'bi' AUC appends y=0 at x=1.0: fractions must stay below 1.0")
        self.methods: Optional[List[str]] = list(methods) if methods is not None else None
        self.class_settings = tuple(class_settings)
        self.required_class_settings = self.class_settings
        self.directions = tuple(directions)
        self.fractions = tuple(float(p) for p in fractions)
        self.auc = auc
        self.masking = masking
        self.forward_batch_size = forward_batch_size
        self.ties = ties
        self.tie_seed = int(tie_seed)
        self._metrics: Dict[str, PerturbationCurve] = {}

    # -------------------------------------------------------------------------------- metrics
    @staticmethod
    def _key(method: str, direction: str, setting: str) -> str:
        return f"{PREFIX}/{method}/{direction}/{setting}"

    def _build(self, methods: Sequence[str]) -> None:
        self.methods = list(methods)
        self._metrics = {
            self._key(m, d, s): PerturbationCurve(len(self.fractions) + 1)
            for m in self.methods for d in self.directions for s in self.class_settings
        }

    def metrics(self) -> List[Metric]:
        return list(self._metrics.values())

    def on_test_start(self, trainer, pl_module) -> None:
        # built here from the module's configuration, so every rank has the same metrics even without batches
        self._build(self.methods if self.methods is not None else pl_module.method_names)
        super().on_test_start(trainer, pl_module)

    # -------------------------------------------------------------------------------- update
    def fill_value(self, pl_module) -> Tensor:
        """Per-channel value of a removed pixel in [0, 1] space."""
        if self.masking == "chefer":
            return torch.zeros(3)
        return torch.as_tensor(pl_module.mean, dtype=torch.float32)

    def tie_breaker(self, batch: Dict[str, Any], pl_module) -> Tensor:
        """The random baseline's pixel maps ``[B, H, W]`` of the batch (``ties='random'``)."""
        from methods.random_baseline import random_token_scores

        if "index" not in batch:
            raise KeyError("perturbation: ties='random' orders ties by each sample's random map, drawn from its "
                           "dataset index, but the batch has no 'index'")
        images = batch["image"]
        grid = tuple(pl_module.token_grid(images))
        scores = random_token_scores(batch["index"], grid[0] * grid[1], self.tie_seed).to(images.device)
        return pixel_maps(scores, images.shape[-2:], grid)

    def curves_for(self, maps: Tensor, images: Tensor, labels: Tensor, clean_correct: Tensor, classify,
                   direction: str, fill: Tensor, tie_breaker: Optional[Tensor] = None) -> Tensor:
        """Correctness ``[B, 1 + len(fractions)]`` of one direction for normalised pixel maps ``[B, H, W]``
        (``tie_breaker``: the map that orders equal scores in the positive direction, negated in the negative)."""
        b, _, h, w = images.shape
        sign = 1.0 if direction == "positive" else -1.0
        ranks = removal_ranks(sign * maps, None if tie_breaker is None else sign * tie_breaker)
        ks = pixels_per_step(self.fractions, h * w)
        masked = masked_images(images, ranks, ks, fill)  # [S, B, 3, H, W]
        preds = classify(masked.flatten(0, 1)).reshape(len(ks), b)
        correct = preds == labels[None]
        return torch.cat([clean_correct[:, None], correct.T], dim=1)

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any], pl_module) -> None:
        images, labels = batch["image"], batch["label"]
        clean_correct = outputs["logits"].argmax(dim=-1) == labels
        fill = self.fill_value(pl_module).to(images.device)
        tie_breaker = self.tie_breaker(batch, pl_module) if self.ties == "random" else None

        def classify(x: Tensor) -> Tensor:
            return pl_module.classify(x, batch_size=self.forward_batch_size)

        relevance = outputs["relevance"]
        for method in self.methods:
            done: List[tuple] = []  # class-agnostic methods give the same tensor for every setting: test it once
            for setting in self.class_settings:
                try:
                    rel = relevance[method][setting]
                except KeyError:
                    raise KeyError(f"perturbation: no relevance for method {method!r}, class setting {setting!r}; "
                                   f"outputs have {{{', '.join(f'{k}: {sorted(v)}' for k, v in relevance.items())}}}") from None
                reuse = next((res for r, res in done if r is rel), None)
                if reuse is None:
                    maps = pixel_maps(rel, images.shape[-2:])
                    reuse = {d: self.curves_for(maps, images, labels, clean_correct, classify, d, fill, tie_breaker)
                             for d in self.directions}
                    done.append((rel, reuse))
                for direction in self.directions:
                    self._metrics[self._key(method, direction, setting)].update(reuse[direction])

    # -------------------------------------------------------------------------------- compute
    def compute(self) -> Dict[str, Result]:
        results: Dict[str, Result] = {}
        for key, metric in self._metrics.items():
            curve = [float(v) for v in metric.compute()]  # runs on every rank (torchmetrics syncs the sums)
            results[f"{key}/auc"] = perturbation_auc(curve, self.fractions, self.auc)
            results[f"{key}/curve"] = curve
        return results
