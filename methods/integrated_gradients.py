"""Integrated Gradients at a named input point, with Captum's quadratures and named baselines.

Sundararajan et al. 2017, "Axiomatic Attribution for Deep Networks" (ICML), Eq. 1 and its Riemann sum Eq. 3:
``IG(x) = (x - x') * integral_0^1 dy/dx (x' + a (x - x')) da``, the integral by the quadrature ``method`` over
``steps`` points (Captum 0.9.0 ``_utils/approximation_methods.py``): ``"gausslegendre"`` (default; nodes
``(1 + t) / 2`` and weights ``w / 2`` of the ``steps``-point Gauss-Legendre rule), ``"riemann_left"`` /
``"riemann_right"`` / ``"riemann_middle"`` (weights ``1 / steps``) and ``"riemann_trapezoid"`` (Captum's: the
``steps`` points ``linspace(0, 1)`` with weights ``1 / steps``, the two ends halved, so its weights sum to
``1 - 1 / steps``). The element-wise attributions are summed over the width (signed) to one score per token /
patch (:mod:`methods.input_points`). Completeness (Eq. 3 of the paper's Prop. 1): the scores sum to
``y(x) - y(x')`` up to the quadrature error. ``baseline``: :mod:`methods.input_baselines` (default ``"zero"``:
the zero word embedding for sequences, the zero normalised image for images); ``point`` and ``explain`` as every
gradient baseline. ``internal_batch_size``: the most interpolated rows per forward (``steps * B`` at once when
``None``); the scores do not depend on it beyond float rounding. The explained target of each row is resolved on
the input itself (one more forward, without autograd, when ``target`` is ``None``).

RMSNorm decoders (Llama, Mistral, Qwen, Gemma) from the zero word embedding: with no position embedding added,
``rms_norm(a x) = x / rms(x)`` for every ``a`` well above the norm's epsilon, so the normalised input jumps from 0
to its full value within the first ~1e-3 of the path, which a 64-step grid misses (measured on the tiny decoders of
the tests, weights x 1/4: relative completeness gaps 0.1 to 30 at 64 steps; the zero baseline needs about 8192
Gauss-Legendre steps on the Llama, gaps 0.78 / 0.28 / 1.8e-2 / 1.3e-7 at 64 / 512 / 2048 / 8192 steps, and more
than 2048 on the Gemma 3, 1.4 at 2048). ModernBERT and DeBERTa-v3 normalise their word embeddings alone too
(LayerNorm, no absolute position or token type added): tiny ones' gaps 24 and 1.2e-2 at 64 steps from zero.
``baseline="auto"`` (default) is therefore the ``"pad"`` id on a model whose family declares
``normalises_word_embeddings_alone`` (its config's ``pad_token_id``, special tokens kept), whose path has no such
jump (gaps <= 3e-6 at 64 steps on the decoders, 1.5e-14 / 4.4e-8 on DeBERTa-v3 / ModernBERT), and ``"zero"``
everywhere else. A real LM's
straight path can still be steep: on SmolLM2-135M the pad-id path needs about 4000 steps for a gap below 1 %
(benchmarks/ig_completeness.py; 1.26 at the default 50).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from .adapters import ModelAdapter, ModelInputs
from .adapters.tokens import config_token_id
from .gradient_baselines import PointAttribution
from .input_baselines import IMAGENET_MEAN, IMAGENET_STD, Baseline, baseline_values, check_baseline
from .input_points import check_choice, logits_at, repeat_inputs
from .registry import register_method

QUADRATURES = ("gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid")


def quadrature(method: str, steps: int) -> Tuple[Tensor, Tensor]:
    """``(alphas, weights)``, float64 ``[steps]``, of the named quadrature on [0, 1] (module docstring)."""
    check_choice(method, QUADRATURES, "method", "integrated_gradients")
    if steps < 2:
        raise ValueError(f"integrated_gradients: steps must be >= 2 (Captum's quadratures), got {steps}")
    if method == "gausslegendre":
        nodes, node_weights = np.polynomial.legendre.leggauss(steps)
        return torch.from_numpy(0.5 * (1 + nodes)), torch.from_numpy(0.5 * node_weights)
    n = steps
    weights = torch.full((n,), 1.0 / n, dtype=torch.float64)
    if method == "riemann_trapezoid":
        weights[0] /= 2
        weights[-1] /= 2
        return torch.linspace(0, 1, n, dtype=torch.float64), weights
    start, stop = {"riemann_left": (0.0, 1 - 1 / n), "riemann_right": (1 / n, 1.0),
                   "riemann_middle": (1 / (2 * n), 1 - 1 / (2 * n))}[method]
    return torch.linspace(start, stop, n, dtype=torch.float64), weights


def row_targets(target: Any, batch: int, device: torch.device) -> Tensor:
    """An ``int`` or a ``LongTensor`` (one or ``batch`` entries) as one class per row; ``TypeError`` otherwise."""
    if isinstance(target, int) and not isinstance(target, bool):
        return torch.full((batch,), target, dtype=torch.long, device=device)
    if not isinstance(target, Tensor) or target.dtype.is_floating_point or target.dtype == torch.bool:
        raise TypeError(f"target must be None, an int or a LongTensor[B], got {target!r}")
    target = target.to(device=device, dtype=torch.long).reshape(-1)
    if target.numel() == 1:
        return target.expand(batch)
    if len(target) != batch:
        raise ValueError(f"target has {len(target)} entries but the batch has {batch} samples")
    return target


def default_baseline(adapter: ModelAdapter) -> Baseline:
    """``baseline="auto"``: ``"zero"``, except on a model whose word embeddings reach a normalisation alone
    (``adapter.inputs.normalises_word_embeddings_alone()``: RMSNorm decoders, ModernBERT, DeBERTa-v3; module
    docstring), whose default is the ``"pad"`` id when its config names one, else the zero baseline (which then needs
    many more steps than 64 for completeness)."""
    if adapter.inputs.normalises_word_embeddings_alone():
        if config_token_id(adapter.model, "pad_token_id") is not None:
            return "pad"
    return "zero"


@register_method("integrated_gradients")
class IntegratedGradients(PointAttribution):
    """Integrated Gradients (Sundararajan et al. 2017, Eq. 1 / 3; Captum ``IntegratedGradients``) at ``point``;
    options ``steps`` (50), ``method`` (``"gausslegendre"``), ``baseline`` (``"auto"``), ``internal_batch_size``,
    ``image_mean`` / ``image_std`` / ``blur_sigma`` (the ``"black"`` and ``"blur"`` image baselines); see
    :mod:`methods.integrated_gradients` for every convention."""

    tags = ("generic_baseline", "gradient", "path", "opt_in")

    def __init__(self, steps: int = 50, method: str = "gausslegendre", baseline: Any = "auto",
                 internal_batch_size: Optional[int] = None, point: str = "auto", explain: str = "logit",
                 foil: Optional[int] = None, image_mean: Sequence[float] = IMAGENET_MEAN,
                 image_std: Sequence[float] = IMAGENET_STD, blur_sigma: float = 5.0):
        super().__init__(point, explain, foil)
        quadrature(method, steps)
        self.steps, self.method = int(steps), method
        self.baseline = baseline if baseline == "auto" else check_baseline(baseline, self.name)
        if internal_batch_size is not None and not (isinstance(internal_batch_size, int) and internal_batch_size >= 1):
            raise ValueError(f"integrated_gradients: internal_batch_size must be a positive int or None, got "
                             f"{internal_batch_size!r}")
        self.internal_batch_size = internal_batch_size
        self.image_mean, self.image_std, self.blur_sigma = tuple(image_mean), tuple(image_std), float(blur_sigma)

    def baseline_at(self, adapter: ModelAdapter, inputs: ModelInputs, point: str, x: Tensor) -> Tensor:
        """The baseline ``x'`` of each row at ``point``."""
        baseline = default_baseline(adapter) if self.baseline == "auto" else self.baseline
        return baseline_values(adapter, inputs, point, baseline, self.name, x, image_mean=self.image_mean,
                               image_std=self.image_std, blur_sigma=self.blur_sigma)

    def elementwise(self, adapter, inputs, point, x, target, foil=None):
        batch = inputs.batch_size
        if target is None or (self.reads_foil and foil is None):
            with torch.no_grad():
                target, foil = self.resolve(logits_at(adapter, inputs, point, x), target)
        else:   # checked against the classes by the first step's forward
            target = row_targets(target, batch, x.device)
        start = self.baseline_at(adapter, inputs, point, x)
        delta = x - start
        alphas, weights = quadrature(self.method, self.steps)
        per_forward = self.steps if self.internal_batch_size is None else max(1, self.internal_batch_size // batch)
        shape = (-1,) + (1,) * x.dim()
        total = torch.zeros_like(x)
        for i in range(0, self.steps, per_forward):
            a = alphas[i:i + per_forward].to(device=x.device, dtype=x.dtype)
            w = weights[i:i + per_forward].to(device=x.device, dtype=x.dtype)
            k = len(a)
            path = (start[None] + a.reshape(shape) * delta[None]).flatten(0, 1)
            grad = self.gradient(adapter, repeat_inputs(inputs, k), point, path, target.repeat(k),
                                 None if foil is None else foil.repeat(k))[0]
            total = total + (grad.unflatten(0, (k, batch)) * w.reshape(shape)).sum(dim=0)
        return delta * total
