"""Removal curves scored on the probability or logit of the explained class: one mechanism
(:class:`RemovalCurveTest`, on :class:`evaluation.curves.CurveCollection`) and its metrics, each a definition of a
few lines (its curves, summaries and conventions) plus a config block:

* :class:`DeletionInsertionTest`: RISE's deletion and insertion (Petsiuk et al., BMVC 2018, section 4.1): the
  probability of the explained class while the most relevant units are deleted onto the substrate (default the
  mean colour, 0 after normalisation) or inserted into a blurred image (Gaussian ``klen`` 11, ``sigma`` 5); a step
  of ``step`` pixels or patches, ``n = ceil(N / step)`` steps, areas by RISE's normalised trapezoid; tokens: the
  same with token removal (``delete``, ``[MASK]``, ``pad``, zeroed embedding), insertion starting from the
  all-removed text;
* :class:`MoRFLeRFTest`: the curves most- and least-relevant first (score ``probability``, ``logit`` or
  ``accuracy``) and the area between them, ``srg = AUC(LeRF) - AUC(MoRF)`` (Blücher et al., TMLR 2024;
  AttnLRP's Delta A_F, Achtibat et al. 2024, recipe in LXT#40);
* :class:`AOPCTest`: AOPC (signed and ``|Delta p|``) and log-odds over AttCAT's levels (Qiang et al., NeurIPS 2022:
  9 levels of ``linspace(0, 1, 10)``), most relevant tokens removed;
* :class:`ROADTest`: ROAD (Rong et al., ICML 2022): MoRF and LeRF with noisy linear imputation, and their
  combination ``(LeRF - MoRF) / 2`` (grad-cam's ``ROADCombined``), images only;
* on the same mechanism with their own conventions and keys, summaries read from the mean curve (sums kept, not
  per-sample curves: ``PER_SAMPLE = False``): Chefer's perturbation test (:class:`callbacks.perturbation.
  PerturbationTest`) and ERASER's comprehensiveness / sufficiency (:class:`callbacks.faithfulness.
  ERASERFaithfulnessTest`). A subclass declares its curves and may override the hooks :meth:`~RemovalCurveTest.
  cells`, ``curve_metric``, ``curve_key``, ``summary_functions``, ``removal_curves`` and ``update_curve``.

Every curve is computed per sample (``[B, S]``, the explained class ``outputs["targets"][setting]``; ``accuracy``:
argmax against the label) and kept with the sample's dataset index (:class:`evaluation.curves.PerSampleCurves`):
the results are means over samples sorted by index, the same on any number of processes, and the per-sample
values go to the run's sidecar (:meth:`RemovalCurveTest.per_sample_scores`). Units are ranked as the perturbation
test ranks them (:mod:`evaluation.ranking`, ties by the random map of the sample by default); ``k`` units are
removed at each point of the grid (``step``: ``k = min(j * step, N)``; ``fractions``: ``k = int(p * n)``, with a
first point at ``p = 0``). Cost: every point of every curve is one forward per sample and distinct map, batched at
``forward_batch_size`` (the module's by default); counted in ``<name>/forward_passes``. Conventions are written to
``metrics.meta.json`` (:meth:`RemovalCurveTest.conventions`) and W&B tags. Keys:
``<name>/<method>/<setting>/<curve>_curve`` (the mean curve), ``.../<curve>_<summary>`` and the combined keys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torchmetrics import Metric

from evaluation.curves import (
    INTEGRATION_RULES,
    CurveCollection,
    CurveEntry,
    PerSampleCurves,
    aopc,
    aopc_abs,
    integrate,
    log_odds,
)
from evaluation.embedding_removal import ZeroEmbeddingPerturber, zeroed_embeddings
from evaluation.metric_cards import MetricCard
from evaluation.metrics import SumsMetric
from evaluation.perturbers import Perturber, TokenPerturber
from evaluation.ranking import TIES, removal_counts, removal_masks, removal_ranks
from evaluation.result_keys import ResultKey
from evaluation.substrates import SUBSTRATES, UNITS, SubstratePerturber

from .base import EvaluationCallback, OncePerMap, Result, outputs_device, relevance_for, tie_scores
from .sample_scores import ORACLE, with_oracle

SCORES = ("probability", "logit", "accuracy")
TOKEN_REMOVALS = TokenPerturber.REMOVALS + ("zero_embedding",)
IMAGE_MODALITIES = ("image", "clip_image")


@dataclass(frozen=True)
class Curve:
    """One curve of a test: ``order`` ``morf`` (most relevant first) or ``lerf``; ``mode`` ``delete`` (the ranked
    units are removed) or ``insert`` (only the ranked units are present, the rest removed); ``summaries``:
    ``{summary name: higher_is_better}`` (``auc``, ``aopc``, ``aopc_abs``, ``log_odds``)."""

    name: str
    order: str
    mode: str
    summaries: Tuple[Tuple[str, Optional[bool]], ...]


class ForwardCount(SumsMetric):
    """Forward passes run by a test (one per classified input), a float64 sum."""

    higher_is_better = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_sums("count")

    def update(self, n: int) -> None:   # type: ignore[override]
        self.count += float(n)

    def compute(self) -> Tensor:
        return self.count


class RemovalCurveTest(EvaluationCallback):
    """Removal curves of a subclass's :attr:`CURVES` per method and class setting (module docstring).

    Args:
        methods: method names (default: every method of the outputs).
        class_settings: which explained classes (``predicted``: RISE's clean argmax; ``target``).
        score: ``probability`` (softmax of the explained class), ``logit`` or ``accuracy`` (argmax vs label).
        unit: ``pixel``, ``patch`` (images) or ``token`` (texts).
        removal: images: the substrate ``mean``, ``black``, ``blur`` or ``road``; texts: ``delete``, ``mask``,
            ``pad`` or ``zero_embedding`` (the input embedding set to 0: AttnLRP's recipe,
            :mod:`evaluation.embedding_removal`).
        step: units per step (images; ``None``: use ``fractions``).
        fractions: fractions of the units removed after the first point (p = 0).
        integration: ``rise``, ``trapezoid`` or ``mean`` (:func:`evaluation.curves.integrate`).
        ties, tie_seed: the order among equal scores (:mod:`evaluation.ranking`).
        forward_batch_size: inputs per forward (default: the classifier's).
        name: the test part of the result keys (default: the class's :attr:`NAME`).
        klen, sigma: the blur substrate; noise, seed: ROAD's imputation.
        masking_options: options of the token perturber (texts).
        oracle: add the ground truth as method ``oracle`` (:func:`callbacks.sample_scores.oracle_map`: the object's
            mask, the rationale's tokens; ties inside and outside it in the order of ``ties``).
    """

    NAME = "curves"
    #: the curves of the test
    CURVES: Tuple[Curve, ...] = ()
    #: keep every sample's curve (:class:`PerSampleCurves`); ``False``: the metric of :meth:`curve_metric` keeps
    #: sums and the summaries are read from the mean curve (:class:`evaluation.curves.CurveEntry`)
    PER_SAMPLE = True
    #: count the forwards in ``<name>/forward_passes``
    COUNT_FORWARDS = True
    #: ``(key metric, function of the areas (a, b), curve a, curve b, higher_is_better)``
    COMBINED: Tuple[Tuple[str, Callable[[Tensor, Tensor], Tensor], str, str, Optional[bool]], ...] = ()
    #: the modalities the test is defined on
    MODALITIES: Tuple[str, ...] = ("image", "text", "decoder", "clip_image", "clip_text")
    metric_cards: Tuple[MetricCard, ...] = ()

    def __init__(self, methods: Optional[Sequence[str]] = None, class_settings: Sequence[str] = ("predicted",),
                 score: str = "probability", unit: str = "patch", removal: str = "mean",
                 step: Optional[int] = 1, fractions: Optional[Sequence[float]] = None, integration: str = "rise",
                 ties: str = "random", tie_seed: int = 0, forward_batch_size: Optional[int] = None,
                 name: Optional[str] = None, klen: int = 11, sigma: float = 5.0, noise: float = 0.01,
                 seed: int = 0, masking_options: Optional[Dict[str, Any]] = None, oracle: bool = False) -> None:
        super().__init__()
        self.oracle = bool(oracle)
        self._select(methods, class_settings)
        if score not in SCORES:
            raise ValueError(f"unknown score {score!r}; choose one of {SCORES}")
        if integration not in INTEGRATION_RULES:
            raise ValueError(f"unknown integration rule {integration!r}; choose one of {INTEGRATION_RULES}")
        if ties not in TIES:
            raise ValueError(f"unknown tie-breaking convention {ties!r}; choose one of {TIES}")
        if unit == "token":
            if not any(m in self.MODALITIES for m in ("text", "decoder", "clip_text")):
                raise ValueError(f"{type(self).__name__} is defined on images only; unit 'token' (text) is refused")
            if removal not in TOKEN_REMOVALS:
                raise ValueError(f"token units: removal must be one of {TOKEN_REMOVALS}, got {removal!r}")
            if step is not None:
                raise ValueError("token units: texts have different lengths, give fractions (step=null)")
            options = {"clamp": False, **dict(masking_options or {})}
            self.perturber: Perturber = ZeroEmbeddingPerturber(**options) if removal == "zero_embedding" else \
                TokenPerturber(removal, **options)
        elif unit in UNITS:
            if not any(m in self.MODALITIES for m in IMAGE_MODALITIES):
                raise ValueError(f"{type(self).__name__} is defined on texts only; unit {unit!r} is refused")
            if removal not in SUBSTRATES:
                raise ValueError(f"image units: removal must be a substrate of {SUBSTRATES}, got {removal!r}")
            self.perturber = SubstratePerturber(removal, unit, klen, sigma, noise, seed)
        else:
            raise ValueError(f"unknown unit {unit!r}; choose one of {UNITS + ('token',)}")
        if (step is None) == (fractions is None):
            raise ValueError("give exactly one of step (units per step) and fractions")
        if step is not None and int(step) < 1:
            raise ValueError(f"step must be a positive number of units, got {step}")
        if fractions is not None:
            fractions = [float(p) for p in fractions]
            if not fractions or any(not 0.0 < p <= 1.0 for p in fractions) or sorted(set(fractions)) != fractions:
                raise ValueError(f"fractions must be increasing values in (0, 1], got {fractions}")
        if score != "probability" and any(s == "log_odds" for c in self.CURVES for s, _ in c.summaries):
            raise ValueError(f"{type(self).__name__}: log-odds needs score='probability', got {score!r}")
        self.score, self.unit, self.removal, self.integration = score, unit, removal, integration
        self.step = None if step is None else int(step)
        self.fractions = None if fractions is None else tuple(fractions)
        self.ties, self.tie_seed, self.seed = ties, int(tie_seed), int(seed)
        self.forward_batch_size = forward_batch_size
        self.name = name or self.NAME
        self.klen, self.sigma, self.noise = int(klen), float(sigma), float(noise)
        self.owner = type(self).__name__
        self.reset()

    # -------------------------------------------------------------------------------- declarations
    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        """``<test name>_<convention>:<value>`` for every scalar convention (:meth:`conventions`) of the test as
        ``init_args`` build it (defaults included)."""
        test = cls(**dict(init_args))
        return [f"{test.name}_{k}:{v}" for k, v in test.conventions().items() if isinstance(v, (str, int, float))]

    def conventions(self) -> Dict[str, Any]:
        """The conventions every key of the test was computed with (``metrics.meta.json``)."""
        grid = {"step": self.step} if self.step is not None else {"fractions": [0.0] + list(self.fractions or ())}
        return {"score": self.score, "unit": self.unit, "removal": self.removal, **grid,
                "integration": self.integration, "explained_class": list(self.class_settings),
                "score_class": "label" if self.score == "accuracy" else "explained",
                "ties": self.ties, "tie_seed": self.tie_seed,
                **({"klen": self.klen, "sigma": self.sigma} if self.removal == "blur" else {}),
                **({"noise": self.noise, "seed": self.seed} if self.removal == "road" else {}),
                **({"oracle": True} if self.oracle else {})}

    # -------------------------------------------------------------------------------- metrics
    def _counts(self, batch: Mapping[str, Any]) -> Tensor:
        n = self.perturber.num_units(batch)
        if self.step is not None:
            total = int(n)
            points = math.ceil(total / self.step)
            return torch.tensor([min(j * self.step, total) for j in range(points + 1)], dtype=torch.long)
        return removal_counts((0.0,) + tuple(self.fractions or ()), n)

    def _grid_x(self, batch: Mapping[str, Any]) -> List[float]:
        if self.step is None:
            return [0.0] + list(self.fractions or ())
        counts = self._counts(batch)
        return [float(c) / float(counts[-1]) for c in counts]

    def summary_functions(self) -> Dict[str, Callable[[Tensor, Sequence[float]], Tensor]]:
        """Summary name -> function of the curves ``[N, S]`` and x (:mod:`evaluation.curves`)."""
        rule = self.integration

        def area(y: Tensor, xs: Sequence[float]) -> Tensor:
            return integrate(y, xs, rule)

        return {"auc": area, "aopc": lambda y, xs: aopc(y), "aopc_abs": lambda y, xs: aopc_abs(y),
                "log_odds": lambda y, xs: log_odds(y)}

    def cells(self, methods: Sequence[str]) -> List[Tuple[str, str, Curve]]:
        """``(method, class setting, curve)`` of every curve, in the order of the metrics (and progress files)."""
        return [(m, s, curve) for m in methods for s in self.class_settings for curve in self.CURVES]

    def curve_metric(self, curve: Curve, num_points: int) -> Metric:
        """The metric that keeps one curve (default: every sample's, :class:`PerSampleCurves`)."""
        return PerSampleCurves(num_points)

    def curve_key(self, method: str, setting: str, curve: str, what: str) -> str:
        """The result key of ``what`` (``curve``, the mean curve, or a summary) of curve ``curve``."""
        return self._key(method, setting, f"{curve}_{what}")

    def build(self, methods: Sequence[str], x: Sequence[float], device=None) -> None:
        """One curve per method, class setting and curve of :attr:`CURVES`, at ``x``."""
        self._built_methods, self._x = list(methods), [float(v) for v in x]
        curves: Dict[str, CurveEntry] = {}
        combined = {}
        summaries = self.summary_functions()
        for m, s, curve in self.cells(self._built_methods):
            entry = CurveEntry(self.curve_metric(curve, len(self._x)), list(self._x), per_sample=self.PER_SAMPLE)
            for summary, hib in curve.summaries:
                entry.summaries[self.curve_key(m, s, curve.name, summary)] = (summaries[summary], hib)
            curves[self.curve_key(m, s, curve.name, "curve")] = entry
        for m in self._built_methods:
            for s in self.class_settings:
                for what, fn, a, b, hib in self.COMBINED:
                    combined[self._key(m, s, what)] = (fn, (self.curve_key(m, s, a, "curve"),
                                                            self.curve_key(m, s, b, "curve")), summaries["auc"], hib)
        self._collection = CurveCollection(curves, combined)
        self._place_metrics(device)

    def build_for(self, methods: Sequence[str], batch: Mapping[str, Any], device: Any) -> None:
        """``build`` at the first batch: the grid's x values are read from it."""
        self.build(methods, self._grid_x(batch), device)

    def _key(self, method: str, setting: str, metric: str) -> str:
        return ResultKey(self.name, method, setting, metric).format()

    def metrics(self) -> List[Metric]:
        return self._collection.metrics() + ([self._forwards] if self.COUNT_FORWARDS else [])

    def reset(self) -> None:
        self._collection, self._forwards, self._built_methods = CurveCollection(), ForwardCount(), []
        self._x: Optional[List[float]] = None

    # -------------------------------------------------------------------------------- update
    def perturber_for(self, curve: Curve) -> Perturber:
        """The perturber that removes the units of ``curve`` (default: the test's)."""
        return self.perturber

    def _check_modality(self, batch: Mapping[str, Any]) -> None:
        is_image = isinstance(batch.get("image"), Tensor)
        if self.unit == "token" and is_image:
            raise ValueError(f"{type(self).__name__}: unit 'token' on an image batch; use unit pixel or patch")
        if self.unit != "token" and not is_image:
            raise ValueError(f"{type(self).__name__} with unit {self.unit!r} needs images (batch['image']); this "
                             f"run's inputs are token sequences" + (
                                 "" if any(m in self.MODALITIES for m in ("text", "decoder")) else
                                 f": {type(self).__name__} is defined on images only"))
        if not isinstance(batch.get("index"), Tensor):
            raise KeyError(f"{type(self).__name__} keeps per-sample curves by dataset index: batch['index'] missing")

    def _scores(self, logits: Tensor, classes: Tensor, labels: Tensor) -> Tensor:
        """``[B, S]`` float64 scores of logits ``[S, B, C]``."""
        s, b, _ = logits.shape
        logits = logits.to(torch.float64)
        if self.score == "accuracy":
            return (logits.argmax(dim=-1) == labels.to(logits.device)[None]).to(torch.float64).T
        values = torch.softmax(logits, dim=-1) if self.score == "probability" else logits
        idx = classes.to(logits.device).reshape(1, b, 1).expand(s, b, 1)
        return values.gather(2, idx)[..., 0].T

    def _curves(self, batch: Mapping[str, Any], scores: Tensor, ties: Optional[Tensor], classes: Tensor,
                classifier: Any, counts: Tensor) -> Dict[str, Tensor]:
        out: Dict[str, Tensor] = {}
        for stream, curve in enumerate(self.CURVES):
            perturber = self.perturber_for(curve)
            removable = perturber.removable(batch)
            sign = 1.0 if curve.order == "morf" else -1.0
            ranks = removal_ranks(sign * scores, None if ties is None else sign * ties, removable)
            top = removal_masks(ranks, counts)                                        # [S, B, N]
            if removable is not None:
                top = top & removable[None]
            removed = top if curve.mode == "delete" else (
                (torch.ones_like(top) if removable is None else removable[None].expand_as(top)) & ~top)
            if isinstance(perturber, SubstratePerturber):
                inputs = perturber.perturb(batch, removed, classifier, stream=stream)
            else:
                inputs = perturber.perturb(batch, removed, classifier)
            if isinstance(perturber, ZeroEmbeddingPerturber):
                with zeroed_embeddings(classifier.model):
                    logits = classifier.logits(inputs, batch_size=self.forward_batch_size)
            else:
                logits = classifier.logits(inputs, batch_size=self.forward_batch_size)
            steps, b = removed.shape[:2]
            self._forwards.update(steps * b)
            out[curve.name] = self._scores(logits.reshape(steps, b, -1), classes, batch["label"])
        return out

    def removal_curves(self, outputs: Mapping[str, Any], batch: Mapping[str, Any], scores: Tensor,
                       ties: Optional[Tensor], classes: Optional[Tensor], counts: Tensor) -> Dict[str, Tensor]:
        """Curve name -> values ``[B, S]`` of one map's unit scores ``[B, N]`` (default: every curve of
        :attr:`CURVES` removed on ``counts`` and scored as ``score`` says)."""
        return self._curves(batch, scores, ties, classes, outputs["classifier"], counts)

    def update_curve(self, metric: Metric, batch: Mapping[str, Any], values: Tensor) -> None:
        """Add one batch's curves ``[B, S]`` to ``metric`` (default: with the samples' dataset indices)."""
        metric.update(batch["index"], values)

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        self._check_modality(batch)
        if self.oracle:
            outputs = with_oracle(outputs, batch, self.class_settings, self.owner)
        layout = outputs.get("layout")
        if isinstance(self.perturber, SubstratePerturber):
            self.perturber.set_layout(layout, batch)
        if not self._collection.curves:
            methods = list(self.methods) + ([ORACLE] if self.oracle else []) if self.methods is not None else \
                list(outputs["relevance"])
            self.build_for(methods, batch, outputs_device(outputs))
        ties = tie_scores(self.perturber, self.ties, batch, layout, self.tie_seed, self.owner)
        counts = self._counts(batch)
        if self.step is not None and len(counts) != len(self._x or ()):
            raise ValueError(f"{type(self).__name__}: the images changed size during the run")
        for method in self._built_methods:
            once = OncePerMap()
            for setting in self.class_settings:
                rel = relevance_for(outputs["relevance"], method, setting, self.owner)
                classes = None if self.score == "accuracy" else outputs["targets"][setting]   # accuracy: the label

                def compute(rel=rel, classes=classes):
                    scores = self.perturber.unit_scores(rel, batch, layout)
                    return self.removal_curves(outputs, batch, scores, ties, classes, counts)

                curves = once.get(rel, compute, key=None if self.score == "accuracy" else classes)
                for curve_name, values in curves.items():
                    entry = self._collection.curves[self.curve_key(method, setting, curve_name, "curve")]
                    self.update_curve(entry.metric, batch, values)

    # -------------------------------------------------------------------------------- results
    def compute(self) -> Dict[str, Result]:
        results: Dict[str, Result] = dict(self._collection.results())
        if self.COUNT_FORWARDS:
            results[ResultKey(self.name, metric="forward_passes").format()] = float(self._forwards.compute())
        return results

    def higher_is_better(self) -> Dict[str, Optional[bool]]:
        forwards = {ResultKey(self.name, metric="forward_passes").format(): None} if self.COUNT_FORWARDS else {}
        return {**self._collection.higher_is_better(), **forwards}

    def curve_x(self) -> Dict[str, List[float]]:
        return self._collection.curve_x()

    def per_sample_scores(self) -> Dict[str, tuple]:
        return self._collection.per_sample()


# ------------------------------------------------------------------------------------------ the metrics
def _between(a: Tensor, b: Tensor) -> Tensor:
    return a - b


def _half_between(a: Tensor, b: Tensor) -> Tensor:
    return (a - b) / 2.0


class DeletionInsertionTest(RemovalCurveTest):
    """RISE's deletion (lower is better) and insertion (higher is better) (module docstring; defaults: patch
    units one per step, the mean-colour substrate for deletion, ``insertion_substrate`` blur for insertion)."""

    NAME = "rise"
    CURVES = (Curve("deletion", "morf", "delete", (("auc", False),)),
              Curve("insertion", "morf", "insert", (("auc", True),)))
    metric_cards = (
        MetricCard("deletion_auc", "area under the explained class's probability while the most relevant units "
                   "are deleted onto the substrate", "Petsiuk et al. 2018 (RISE) sec. 4.1, evaluation.py auc",
                   "F = n + 1 per map, n = ceil(N / step)", False),
        MetricCard("insertion_auc", "area under the probability while the most relevant units are inserted into "
                   "the blurred (image) or all-removed (text) input", "Petsiuk et al. 2018 (RISE) sec. 4.1",
                   "F = n + 1 per map", True))

    def __init__(self, *args: Any, insertion_substrate: str = "blur", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.insertion_substrate = insertion_substrate
        if self.unit != "token":
            if insertion_substrate not in SUBSTRATES:
                raise ValueError(f"unknown insertion substrate {insertion_substrate!r}; choose one of {SUBSTRATES}")
            self._insertion = SubstratePerturber(insertion_substrate, self.unit, self.klen, self.sigma, self.noise,
                                                 self.seed)

    def conventions(self) -> Dict[str, Any]:
        return {**super().conventions(), "insertion_removal": self.insertion_substrate if self.unit != "token"
                else self.removal}

    def perturber_for(self, curve: Curve) -> Perturber:
        return self._insertion if curve.mode == "insert" and self.unit != "token" else self.perturber

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        if self.unit != "token":
            self._insertion.set_layout(outputs.get("layout"), batch)
        super().update(outputs, batch)


class MoRFLeRFTest(RemovalCurveTest):
    """Most- and least-relevant-first curves and the area between them, ``srg = AUC(LeRF) - AUC(MoRF)`` (higher
    is better; module docstring)."""

    NAME = "morf_lerf"
    CURVES = (Curve("morf", "morf", "delete", (("auc", False),)),
              Curve("lerf", "lerf", "delete", (("auc", True),)))
    COMBINED = (("srg", _between, "lerf", "morf", True),)
    metric_cards = (
        MetricCard("morf_auc", "area under the explained class's score, most relevant units removed first",
                   "Samek et al. 2017; Bluecher et al. TMLR 2024", "F = S per map", False),
        MetricCard("lerf_auc", "area under the score, least relevant units removed first",
                   "Samek et al. 2017; Bluecher et al. TMLR 2024", "F = S per map", True),
        MetricCard("srg", "AUC(LeRF) - AUC(MoRF), the area between the two curves",
                   "Bluecher et al. TMLR 2024 (SRG); Achtibat et al. 2024 (AttnLRP Delta A_F, LXT#40)",
                   "F = 2 S per map", True))


#: AttCAT's levels: the 9 non-zero values of linspace(0, 1, 10)
ATTCAT_LEVELS = tuple(float(i) / 9.0 for i in range(1, 10))


class AOPCTest(RemovalCurveTest):
    """AOPC (signed, higher is better), AOPC of ``|Delta p|`` (higher is better) and log-odds (lower is better)
    of the explained class's probability, most relevant tokens removed at AttCAT's levels (module docstring)."""

    NAME = "aopc"
    CURVES = (Curve("morf", "morf", "delete", (("aopc", True), ("aopc_abs", True), ("log_odds", False))),)
    MODALITIES = ("text", "decoder", "clip_text", "image", "clip_image")
    metric_cards = (
        MetricCard("morf_aopc", "mean over levels of p(y|x) - p(y|x without its top tokens)",
                   "Samek et al. 2017; DeYoung et al. 2020 (ERASER)", "F = levels + 1 per map", True),
        MetricCard("morf_aopc_abs", "mean over levels of |p(y|x) - p(y|x without its top tokens)|",
                   "Qiang et al. 2022 (AttCAT, cal_aopc)", "F = levels + 1 per map", True),
        MetricCard("morf_log_odds", "mean over levels of log(p(y|x without its top tokens) / p(y|x))",
                   "Shrikumar et al. 2017; Qiang et al. 2022 (AttCAT, cal_logodds)", "F = levels + 1 per map", False))

    def __init__(self, *args: Any, unit: str = "token", removal: str = "mask", step: Optional[int] = None,
                 fractions: Optional[Sequence[float]] = ATTCAT_LEVELS, integration: str = "mean",
                 **kwargs: Any) -> None:
        super().__init__(*args, unit=unit, removal=removal, step=step, fractions=fractions,
                         integration=integration, **kwargs)


class ROADTest(RemovalCurveTest):
    """ROAD (module docstring): MoRF (lower is better), LeRF (higher is better) and ``combined = (LeRF - MoRF) /
    2`` (higher is better) with noisy linear imputation; defaults: pixel units, fractions 0.1 ... 0.9, accuracy
    against the label (the ROAD paper's score), areas as the mean over the fractions. Images only.

    Fraction ``p`` is the share of pixels **removed** in both orders, exactly ``int(p * N)`` of them, ties in the
    order of the random map. Divergences of the references: road_evaluation's LeRF removes ``order[int(n p):]`` (its
    ``p`` is the share kept); grad-cam's ``RemoveMostRelevantFirst(p)`` removes every pixel at or above the ``p``-th
    percentile (ties included: a map that is 0 on most pixels loses every pixel; test_removal_curves.py shows it)
    and draws unseeded noise; here the noise is drawn per sample index, step and curve from ``seed``."""

    NAME = "road"
    CURVES = (Curve("morf", "morf", "delete", (("auc", False),)),
              Curve("lerf", "lerf", "delete", (("auc", True),)))
    COMBINED = (("combined", _half_between, "lerf", "morf", True),)
    MODALITIES = IMAGE_MODALITIES
    metric_cards = (
        MetricCard("morf_auc", "mean score over the fractions, most relevant pixels imputed first",
                   "Rong et al. ICML 2022 (ROAD), sec. 4", "F = S per map + one batched sparse solve", False,
                   IMAGE_MODALITIES),
        MetricCard("lerf_auc", "mean score over the fractions, least relevant pixels imputed first",
                   "Rong et al. ICML 2022 (ROAD)", "F = S per map", True, IMAGE_MODALITIES),
        MetricCard("combined", "(LeRF - MoRF) / 2 (grad-cam's ROADCombined)", "Rong et al. 2022; grad-cam 1.5.7",
                   "F = 2 S per map", True, IMAGE_MODALITIES))

    def __init__(self, *args: Any, unit: str = "pixel", removal: str = "road", step: Optional[int] = None,
                 fractions: Optional[Sequence[float]] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
                 integration: str = "mean", score: str = "accuracy", **kwargs: Any) -> None:
        if unit == "token":
            raise ValueError("ROAD is defined on images only (noisy linear imputation of pixels): unit 'token' "
                             "(text) is refused")
        if removal != "road":
            raise ValueError(f"ROAD imputes the removed pixels: removal must be 'road', got {removal!r}")
        if fractions is not None and max(fractions) >= 1.0:
            raise ValueError("ROAD cannot impute an image with every pixel removed: fractions must stay below 1")
        super().__init__(*args, unit=unit, removal=removal, step=step, fractions=fractions,
                         integration=integration, score=score, **kwargs)
