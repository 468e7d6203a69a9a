"""SmoothGrad, SmoothGrad-squared and VarGrad over saliency, input x gradient or integrated gradients.

Smilkov et al. 2017, "SmoothGrad: removing noise by adding noise" (Eq. 2); Adebayo et al. 2018, "Local Explanation
Methods for Deep Neural Networks Lack Sensitivity to Parameter Values" (VarGrad); Captum 0.9.0 ``NoiseTunnel``'s
formulas on the element-wise maps ``A(x + e_i)`` of ``samples`` noisy copies of the input at the inner method's
point, ``e_i ~ N(0, sigma^2)``:

* ``smoothgrad``: ``mean_i A(x + e_i)``;
* ``smoothgrad_squared``: ``mean_i A(x + e_i)^2``;
* ``vargrad``: ``mean_i A(x + e_i)^2 - (mean_i A(x + e_i))^2``;

then reduced per token / patch as the inner method reduces its map (:mod:`methods.input_points`; saliency's
``"abs"`` takes ``|g|`` before the mean, as Captum's ``Saliency(abs=True)`` inside ``NoiseTunnel``).
``method``: ``"saliency"`` (default), ``"input_x_gradient"`` or ``"integrated_gradients"``, built with
``options`` (a dict: ``point``, ``explain``, ``steps``, ``baseline``, ...; integrated gradients keep their
baseline fixed, as Captum's). ``noise``: ``"absolute"`` (``sigma = stdevs``, Captum's default 1.0) or
``"relative"`` (``sigma = stdevs * (max(x) - min(x))`` of each sample at the point, Smilkov et al.'s 10-20 %).
Noise falls on the real positions only (padding keeps its values) and is drawn per sample from a CPU generator
seeded by ``(seed, sample id)`` (:mod:`methods.seeded_draws`), as Captum draws it (``torch.normal`` with a float32
scale, the copies of a sample in one draw), so a sample's map is the same in any batch. The explained class of each
row is resolved on the clean input (one forward without autograd, only when ``target`` is ``None``).
``samples_per_forward``: noisy copies per forward (all at once when ``None``).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from torch import Tensor

from .adapters import ModelAdapter, ModelInputs
from .base import AttributionMethod
from .gradient_baselines import PointAttribution
from .input_points import check_choice, logits_at, point_values, real_rows, reduce_scores, repeat_inputs, resolve_point
from .integrated_gradients import row_targets
from .registry import build_method, register_method
from .seeded_draws import normal_noise, sample_generators
from .targets import TargetType

INNER_METHODS = ("saliency", "input_x_gradient", "integrated_gradients")
NOISE = ("absolute", "relative")


class _NoiseTunnel(AttributionMethod):
    """Shared by :class:`SmoothGrad`, :class:`SmoothGradSquared` and :class:`VarGrad` (module docstring)."""

    tags = ("generic_baseline", "gradient", "sampling", "opt_in")

    reads_attention = False
    aggregate = "?"

    def __init__(self, method: str = "saliency", samples: int = 5, stdevs: float = 1.0, noise: str = "absolute",
                 seed: int = 0, samples_per_forward: Optional[int] = None,
                 options: Optional[Dict[str, Any]] = None):
        self.method = check_choice(method, INNER_METHODS, "method", self.name)
        if not (isinstance(samples, int) and samples >= 1):
            raise ValueError(f"{self.name}: samples must be a positive int, got {samples!r}")
        if not stdevs >= 0:
            raise ValueError(f"{self.name}: stdevs must be >= 0, got {stdevs!r}")
        if samples_per_forward is not None and not (isinstance(samples_per_forward, int) and samples_per_forward >= 1):
            raise ValueError(f"{self.name}: samples_per_forward must be a positive int or None, got "
                             f"{samples_per_forward!r}")
        self.samples, self.stdevs, self.seed = samples, float(stdevs), int(seed)
        self.noise = check_choice(noise, NOISE, "noise", self.name)
        self.samples_per_forward = samples_per_forward
        self.options = dict(options or {})
        inner = build_method(method, **self.options)
        assert isinstance(inner, PointAttribution)
        self._inner = inner

    @property
    def reads_foil(self) -> bool:
        return self._inner.reads_foil

    def check_adapter(self, adapter: ModelAdapter) -> None:
        super().check_adapter(adapter)
        self._inner.check_adapter(adapter)

    def noise_of(self, adapter: ModelAdapter, inputs: ModelInputs, point: str, x: Tensor) -> Tensor:
        """``[samples, B, ...]`` noise, each sample's from its own generator, 0 at padding."""
        noise = torch.zeros((self.samples,) + tuple(x.shape), dtype=x.dtype)
        real = real_rows(adapter, inputs, point)
        for b, generator in enumerate(sample_generators(adapter, inputs, self.seed, "noise")):
            values = x[b] if real is None else x[b][real[b].to(x.device)]
            sigma = self.stdevs
            if self.noise == "relative":
                sigma = self.stdevs * float(values.max() - values.min())
            draw = normal_noise(generator, (self.samples,) + tuple(values.shape), sigma).to(x.dtype)
            if real is None:
                noise[:, b] = draw
            else:
                noise[:, b, real[b].cpu()] = draw
        return noise.to(x.device)

    def attribute(self, adapter: ModelAdapter, inputs: ModelInputs, target: TargetType) -> Tensor:
        inner = self._inner
        for p in adapter.model.parameters():   # restored by preserved_model_state; no weight gradients
            p.requires_grad_(False)
        point = resolve_point(adapter, inner.point, self.name)
        x = point_values(adapter, inputs, point)
        inner.call_foil = self.call_foil
        try:
            if target is None:
                with torch.no_grad():
                    target, foil = inner.resolve(logits_at(adapter, inputs, point, x), target)
            else:   # no clean forward (checked against the classes by the first noisy forward)
                target, foil = row_targets(target, inputs.batch_size, x.device), None
                if inner.reads_foil:
                    if inner.given_foil is None:
                        raise ValueError(f"{self.name}: explain={inner.explain!r} contrasts the target with a foil "
                                         "class: give foil= (an int or one class per sample, like target)")
                    foil = row_targets(inner.given_foil, inputs.batch_size, x.device)
            noise = self.noise_of(adapter, inputs, point, x)
            per_forward = self.samples_per_forward or self.samples
            total, total_sq = torch.zeros_like(x), torch.zeros_like(x)
            for i in range(0, self.samples, per_forward):
                chunk = noise[i:i + per_forward]
                k = len(chunk)
                noisy = (x[None] + chunk).flatten(0, 1)
                maps = inner.elementwise(adapter, repeat_inputs(inputs, k), point, noisy, target.repeat(k),
                                         None if foil is None else foil.repeat(k)).unflatten(0, (k, -1))
                total = total + maps.sum(dim=0)
                total_sq = total_sq + (maps * maps).sum(dim=0)
        finally:
            inner.call_foil = None
        mean, mean_sq = total / self.samples, total_sq / self.samples
        values = mean if self.aggregate == "smoothgrad" else mean_sq if self.aggregate == "smoothgrad_squared" \
            else mean_sq - mean * mean
        return reduce_scores(adapter, inputs, point, values, inner.score_reduction)


@register_method("smoothgrad")
class SmoothGrad(_NoiseTunnel):
    """SmoothGrad (Smilkov et al. 2017, Eq. 2; Captum ``NoiseTunnel(nt_type="smoothgrad")``): the mean of the inner
    method's map over noisy copies; see :mod:`methods.noise_tunnel` for every convention."""

    aggregate = "smoothgrad"


@register_method("smoothgrad_squared")
class SmoothGradSquared(_NoiseTunnel):
    """SmoothGrad-squared (Hooker et al. 2019; Captum ``nt_type="smoothgrad_sq"``): the mean of the squared maps;
    see :mod:`methods.noise_tunnel`."""

    aggregate = "smoothgrad_squared"


@register_method("vargrad")
class VarGrad(_NoiseTunnel):
    """VarGrad (Adebayo et al. 2018; Captum ``nt_type="vargrad"``): the variance of the maps over noisy copies;
    see :mod:`methods.noise_tunnel`."""

    aggregate = "vargrad"
