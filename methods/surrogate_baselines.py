"""KernelSHAP and LIME over content positions: a weighted linear surrogate fitted to the explained output of
random coalitions of features (content tokens or patches), the absent ones replaced by a baseline or removed.

* ``kernel_shap`` (Lundberg & Lee 2017, "A Unified Approach to Interpreting Model Predictions", Theorem 2;
  Captum 0.9.0 ``KernelShap``): the all-present and the all-absent coalitions, then ``samples - 2`` coalitions
  drawn as Captum draws them (a size ``k`` in ``1 .. M-1`` with probability ``(M-1) / (k (M-k))``, then the ``k``
  features with the largest of ``M`` standard normals), so that the Shapley kernel is in the sampling; weights 1;
  the two end coalitions' infinite weight as exact constraints (``end_weight=None``, default: intercept
  ``y(baseline)``, scores summing to ``y(x) - y(baseline)`` to rounding) or as Captum's finite stand-in
  (``end_weight=1e6``: efficiency then holds to ~1e-5 only); weighted least squares with an intercept.
* ``lime`` (Ribeiro et al. 2016, "Why Should I Trust You?", Eq. 1-3; Captum ``Lime``): coalitions with each
  feature present with probability 1/2; weights ``exp(-d^2 / (2 kernel_width^2))`` with ``d`` the cosine distance
  between the sample's input at the point and the perturbed one (real positions only); ``regression="lasso"``
  (Captum's ``SkLearnLasso(alpha=0.01)``) or ``"linear"``.

Features: ``mode="replacement"`` (default), :mod:`methods.feature_replacement` (content tokens replaced by the
``baseline`` at the word embedding, attention kept; patches by the baseline image's pixels); ``mode="removal"``,
:mod:`methods.feature_removal` (absent features dropped from the sequence by the family's token removal, as
``token_ablation``; LIME's distance then reads an absent feature as 0 at the input point; no ``baseline``); a
sample's coefficient is its feature's score (special tokens and padding 0); regressions:
:mod:`methods.surrogate_regression`. The coalitions come from a CPU generator
seeded by ``(seed, sample id)`` (:mod:`methods.seeded_draws`), so a sample's map is the same in any batch.
``samples``: coalitions per sample (Captum's default 25; papers use 500-2000); ``batch_size``: rows per forward.
A sample with one feature gets ``y(x) - y(baseline)``, one with none 0 (``y(baseline)``: the output with every
feature absent). ``explain``: the explained output.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .adapters import ModelAdapter, ModelInputs
from .feature_removal import check_removal, removal_scores
from .feature_replacement import ReplacementAttribution, coalition_scores, feature_positions, present_elements
from .input_baselines import IMAGENET_MEAN, IMAGENET_STD
from .input_points import check_choice, logits_at, real_rows, resolve_point
from .registry import register_method
from .seeded_draws import sample_generators
from .surrogate_regression import (
    efficient_linear_regression,
    weighted_lasso,
    weighted_linear_regression,
)
from .targets import TargetType

#: how absent features leave the input: replaced by the baseline, or removed from the sequence
MODES = ("replacement", "removal")
#: Captum's finite weight of the all-present and all-absent coalitions (its ``inf_weight``)
CAPTUM_END_WEIGHT = 1e6


def kernel_shap_coalitions(generator: torch.Generator, features: int, samples: int) -> Tensor:
    """``[samples, M]`` bool coalitions: all present, all absent, then Captum's Shapley-kernel draws."""
    rows = [torch.ones(features, dtype=torch.bool), torch.zeros(features, dtype=torch.bool)][:samples]
    sizes = torch.arange(features, dtype=torch.float)
    probs = torch.tensor(features - 1) / (sizes * (features - sizes))
    probs[0] = 0.0
    probs = probs / probs.sum()
    for _ in range(samples - len(rows)):
        k = int(torch.multinomial(probs[None], 1, True, generator=generator)[0, 0])
        values = torch.randn(1, features, generator=generator)
        threshold = torch.kthvalue(values, features - k).values.item()
        rows.append((values > threshold)[0])
    return torch.stack(rows)


def lime_coalitions(generator: torch.Generator, features: int, samples: int) -> Tensor:
    """``[samples, M]`` bool coalitions, each feature present with probability 1/2 (Captum's default)."""
    return torch.stack([torch.bernoulli(torch.full((1, features), 0.5), generator=generator)[0].bool()
                        for _ in range(samples)])


class _Surrogate(ReplacementAttribution):
    """Shared by :class:`KernelShap` and :class:`Lime` (module docstring)."""

    tags = ("generic_baseline", "perturbation", "sampling", "opt_in")

    def __init__(self, samples: int = 25, baseline: Any = "zero", seed: int = 0, batch_size: int = 64,
                 explain: str = "logit", foil: Optional[int] = None, image_mean: Sequence[float] = IMAGENET_MEAN,
                 image_std: Sequence[float] = IMAGENET_STD, blur_sigma: float = 5.0, mode: str = "replacement"):
        if not (isinstance(samples, int) and samples >= 2):
            raise ValueError(f"{self.name}: samples must be an int >= 2, got {samples!r}")
        super().__init__(baseline, batch_size, explain, foil, image_mean, image_std, blur_sigma)
        self.samples, self.seed = samples, int(seed)
        self.mode = check_choice(mode, MODES, "mode", self.name)
        if self.mode == "removal" and not (isinstance(baseline, str) and baseline == "zero"):
            raise ValueError(f"{self.name}: baseline={baseline!r} is for mode='replacement'; mode='removal' drops "
                             "the absent features instead of replacing them")

    def check_adapter(self, adapter: ModelAdapter) -> None:
        super().check_adapter(adapter)
        if self.mode == "removal":
            check_removal(adapter, self.name)

    def start(self, adapter: ModelAdapter, inputs: ModelInputs) -> Tuple[str, Tensor, Tensor]:
        """``(point, x, start)``: the baseline's values at the point, or zeros (an absent feature in LIME's
        distance) in removal mode."""
        point, x, start = self.replacement_start(adapter, inputs)
        return (point, x, torch.zeros_like(x)) if self.mode == "removal" else (point, x, start)

    def coalitions(self, generator: torch.Generator, features: int) -> Tensor:
        raise NotImplementedError

    def weights(self, adapter: ModelAdapter, inputs: ModelInputs, sample: int, present: Tensor, x: Tensor,
                start: Tensor) -> Tensor:
        raise NotImplementedError

    def fit(self, present: Tensor, scores: Tensor, weights: Tensor) -> Tensor:
        return weighted_linear_regression(present.double(), scores, weights)

    def attribute(self, adapter: ModelAdapter, inputs: ModelInputs, target: TargetType) -> Tensor:
        point, x, start = self.start(adapter, inputs)
        with torch.no_grad():
            target, foil = self.resolve(logits_at(adapter, inputs, point, x), target)
        positions = feature_positions(adapter, inputs)
        generators = sample_generators(adapter, inputs, self.seed, self.name)
        coalitions: List[Tensor] = []
        for p, generator in zip(positions, generators):
            m = len(p)
            if m <= 1:   # exact: the one feature present and absent
                coalitions.append(torch.tensor([[True] * m, [False] * m], dtype=torch.bool).reshape(2, m))
            else:
                coalitions.append(self.coalitions(generator, m))
        if self.mode == "removal":
            scores = removal_scores(adapter, inputs, positions, coalitions, target, foil, self.explain,
                                    self.batch_size)
        else:
            scores = coalition_scores(adapter, inputs, point, x, start, coalitions, target, foil, self.explain,
                                      self.batch_size)
        out = torch.zeros(inputs.batch_size, adapter.inputs.layout(inputs).num_scores, dtype=x.dtype, device=x.device)
        for b, (p, present, values) in enumerate(zip(positions, coalitions, scores)):
            if len(p) == 1:
                out[b, p.to(x.device)] = values[0] - values[1]
            elif len(p) > 1:
                weights = self.weights(adapter, inputs, b, present, x, start)
                out[b, p.to(x.device)] = self.fit(present, values, weights).to(device=x.device, dtype=x.dtype)
        return out


@register_method("kernel_shap")
class KernelShap(_Surrogate):
    """KernelSHAP (Lundberg & Lee 2017, Theorem 2; Captum ``KernelShap``) over content positions; options
    ``samples`` (25), ``end_weight`` (``None``: exact efficiency; 1e6: Captum's), ``mode`` (``"replacement"``,
    ``"removal"``), ``baseline``, ``seed``, ``batch_size``, ``explain``; see :mod:`methods.surrogate_baselines`."""

    def __init__(self, samples: int = 25, end_weight: Optional[float] = None, **options: Any):
        super().__init__(samples, **options)
        if end_weight is not None and not end_weight > 0:
            raise ValueError(f"kernel_shap: end_weight must be > 0 or None, got {end_weight!r}")
        self.end_weight = end_weight

    def coalitions(self, generator, features):
        return kernel_shap_coalitions(generator, features, self.samples)

    def weights(self, adapter, inputs, sample, present, x, start):
        counts = present.sum(dim=1)
        ends = (counts == 0) | (counts == present.shape[1])
        end = CAPTUM_END_WEIGHT if self.end_weight is None else self.end_weight
        return torch.where(ends, torch.tensor(end, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))

    def fit(self, present, scores, weights):
        if self.end_weight is not None:
            return super().fit(present, scores, weights)
        counts = present.sum(dim=1)
        full, empty = counts == present.shape[1], counts == 0
        inner = ~(full | empty)
        return efficient_linear_regression(present[inner].double(), scores[inner], weights[inner],
                                           float(scores[full][0]), float(scores[empty][0]))


@register_method("lime")
class Lime(_Surrogate):
    """LIME (Ribeiro et al. 2016, Eq. 1-3; Captum ``Lime``) over content positions; options ``samples`` (25),
    ``kernel_width`` (1.0), ``regression`` (``"lasso"``, ``alpha`` 0.01; ``"linear"``), ``mode``, ``baseline``,
    ``seed``, ``batch_size``, ``explain``; see :mod:`methods.surrogate_baselines`."""

    def __init__(self, samples: int = 25, kernel_width: float = 1.0, regression: str = "lasso", alpha: float = 0.01,
                 **options: Any):
        super().__init__(samples, **options)
        if not kernel_width > 0:
            raise ValueError(f"lime: kernel_width must be > 0, got {kernel_width!r}")
        self.kernel_width, self.alpha = float(kernel_width), float(alpha)
        self.regression = check_choice(regression, ("lasso", "linear"), "regression", "lime")

    def coalitions(self, generator, features):
        return lime_coalitions(generator, features, self.samples)

    def weights(self, adapter, inputs, sample, present, x, start):
        keep = present_elements(adapter, inputs, sample, present, x)
        perturbed = torch.where(keep, x[sample][None], start[sample][None])
        original = x[sample][None].expand_as(perturbed)
        real = real_rows(adapter, inputs, resolve_point(adapter, "auto", self.name))
        if real is not None:
            perturbed, original = perturbed[:, real[sample]], original[:, real[sample]]
        cosine = torch.nn.functional.cosine_similarity(original.flatten(1), perturbed.flatten(1), dim=1)
        distance = 1 - cosine.double().cpu()
        return torch.exp(-distance ** 2 / (2 * self.kernel_width ** 2))

    def fit(self, present, scores, weights):
        if self.regression == "linear":
            return super().fit(present, scores, weights)
        return weighted_lasso(present.double(), scores, weights, self.alpha)
