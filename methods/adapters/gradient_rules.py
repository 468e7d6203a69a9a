"""Autograd functions through which LRP rules act in Input x Gradient form (Arras et al. 2025; LXT's "efficient"
mode): each returns its input's forward value unchanged and replaces only the gradient, so a model run through
them gives bit-identical logits while its backward pass carries relevance.

They are applied from forward hooks (:mod:`methods.attnlrp`) and, for the few non-linearities an adapter's head
computes itself (a functional ``tanh``, CLIP's L2 normalisation), by the adapter's head (:meth:`ModelAdapter.
head_rules`). Names follow Achtibat et al. 2024 (AttnLRP, ICML): the identity rule (their Eq. 9) on element-wise
non-linearities and on normalisations, the uniform rule (Eq. 7) on multiplicative interactions.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import torch
from torch import Tensor

#: LXT's stabiliser of the identity rule (``lxt/efficient/rules.py``: ``output / (input + 1e-10)``)
IDENTITY_EPSILON = 1e-10


class _IdentityRule(torch.autograd.Function):
    """``y = f(x)`` given as ``(x, y)``; backward ``g * y / (x + eps)`` (AttnLRP Eq. 9 as LXT computes it: the
    ratio formed in the forward, the stabiliser *added* to ``x`` whatever its sign)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor, epsilon: float) -> Tensor:
        ctx.save_for_backward(y / (x + epsilon))
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        (ratio,) = ctx.saved_tensors
        return ratio * grad, None, None


def identity_rule(x: Tensor, y: Tensor, epsilon: float = IDENTITY_EPSILON) -> Tensor:
    """``y`` (the value of an element-wise non-linearity at ``x``), with the identity rule's gradient to ``x``:
    relevance passes through unchanged (``x * grad_x = y * grad_y``)."""
    if not x.requires_grad:
        return y
    return _IdentityRule.apply(x, y.detach(), epsilon)


def apply_identity_rule(fn: Callable[[Tensor], Tensor], x: Tensor, epsilon: Optional[float]) -> Tensor:
    """``fn(x)``; with the identity rule's gradient unless ``epsilon`` is ``None`` (no rule in force)."""
    y = fn(x)
    return y if epsilon is None else identity_rule(x, y, epsilon)


class _LayerNormRule(torch.autograd.Function):
    """Stock LayerNorm output ``y`` of ``x``; backward of ``(x - mean(x)) / stop_grad(std) * w + b`` (the
    identity rule on the normalisation, as LXT's ``layer_norm_forward``: the mean subtraction keeps its gradient,
    the standard deviation ``sqrt(var + eps)``, biased variance, is a constant)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor, weight: Optional[Tensor],
                eps: float) -> Tensor:
        # 1 / sqrt(var + eps) from the fused LayerNorm kernel (3x faster than var_mean on a CPU)
        rstd = torch.native_layer_norm(x.detach(), x.shape[-1:], None, None, eps)[2]
        ctx.save_for_backward(rstd, weight)
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        rstd, weight = ctx.saved_tensors
        scaled = (grad if weight is None else grad * weight) * rstd.to(grad.dtype)
        return scaled - scaled.mean(dim=-1, keepdim=True), None, None, None


def layer_norm_rule(x: Tensor, y: Tensor, weight: Optional[Tensor], eps: float) -> Tensor:
    """``y = LayerNorm(x)`` over the last dimension, with the identity rule's gradient to ``x``."""
    if not x.requires_grad:
        return y
    return _LayerNormRule.apply(x, y.detach(), None if weight is None else weight.detach(), eps)


class _RMSNormRule(torch.autograd.Function):
    """Stock RMSNorm output ``y`` of ``x``; backward of the identity rule on the normalisation, ``x *
    stop_grad(rsqrt(mean(x^2) + eps))`` (LXT's ``rms_norm_forward``), in the dtypes of the stock module: the
    statistics in float32; ``offset`` ``False`` (Llama, Mistral, Qwen): ``w * (x32 * r).to(dtype)``, so the
    gradient is ``((g * w).float() * r).to(dtype)``; ``True`` (Gemma): ``(x32 * r * (1 + w32)).to(dtype)``, so
    ``(g.float() * (1 + w32) * r).to(dtype)``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor, weight: Optional[Tensor], eps: float, offset: bool) -> Tensor:
        x32 = x.detach().to(torch.float32)
        ctx.save_for_backward(torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps), weight)
        ctx.offset = offset
        ctx.dtype = x.dtype
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        r, weight = ctx.saved_tensors
        if ctx.offset:
            scaled = grad.to(torch.float32)
            if weight is not None:
                scaled = scaled * (1.0 + weight.to(torch.float32))
        else:
            scaled = (grad if weight is None else grad * weight).to(torch.float32)
        return (scaled * r).to(ctx.dtype), None, None, None, None


def rms_norm_rule(x: Tensor, y: Tensor, weight: Optional[Tensor], eps: float, offset: bool = False) -> Tensor:
    """``y = RMSNorm(x)`` over the last dimension (``offset``: the ``1 + weight`` scale of Gemma), with the
    identity rule's gradient to ``x``."""
    if not x.requires_grad:
        return y
    return _RMSNormRule.apply(x, y.detach(), None if weight is None else weight.detach(), eps, offset)


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; backward ``grad * factor`` (a scalar, or a vector over the last dimension)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, factor: Any) -> Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        factor = ctx.factor
        if isinstance(factor, Tensor):
            factor = factor.to(device=grad.device, dtype=grad.dtype)
        return grad * factor, None


def scale_gradient(x: Tensor, factor: Any) -> Tensor:
    """``x`` with its gradient multiplied by ``factor``: the uniform rule on a product of ``k`` factors is
    ``1 / k`` on each (LXT's ``divide_gradient``); ``0`` stops the gradient (CP-LRP's constant attention)."""
    if not x.requires_grad:
        return x
    if isinstance(factor, (int, float)) and factor == 0:
        return x.detach()
    return _ScaleGradient.apply(x, factor)


def output_gradient_scaled(factor: Any) -> Callable[..., Tensor]:
    """A forward hook: the module's output with its gradient times ``factor`` (:func:`scale_gradient`)."""
    def hook(_module: Any, _inputs: Any, output: Tensor) -> Tensor:
        return scale_gradient(output, factor)
    return hook


def input_gradient_scaled(factor: Any) -> Callable[..., Tuple[Any, ...]]:
    """A forward pre-hook: the module's first input with its gradient times ``factor``, the others as they are."""
    def hook(_module: Any, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        return (scale_gradient(inputs[0], factor),) + tuple(inputs[1:])
    return hook


def normalized_rule(z: Tensor, epsilon: Optional[float]) -> Tensor:
    """``z / ||z||_2`` over the last dimension; with a rule in force (``epsilon`` not ``None``) the norm is a
    constant for the gradient (the identity rule on a normalisation, as on LayerNorm and RMSNorm)."""
    norm = z.norm(p=2, dim=-1, keepdim=True)
    return z / (norm if epsilon is None else norm.detach())


def _stabilize(z: Tensor, epsilon: float) -> Tensor:
    """zennit's ``stabilize``: ``z`` moved away from 0 by ``epsilon`` in the direction of its sign (+ at 0)."""
    return z + ((z == 0).to(z) + z.sign()) * epsilon


class _GammaRule(torch.autograd.Function):
    """Output ``y`` of a linear map ``lin`` (``nn.Linear`` / ``nn.Conv2d`` as a function of ``x``); backward of
    the gamma rule in Input x Gradient form, as LXT's patch of zennit's ``Gamma`` computes it
    (``lxt/efficient/zennit_patches.py``): the relevance at the output ``R = grad * y``; the modified map
    ``lin_g`` with parameters ``p + gamma * p.clamp(min=0)`` (weight and bias); ``R_x = x * J_g^T (R /
    stab(lin_g(x), 1e-6))``; the gradient ``R_x / stab(x, 1e-10)``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor, modified: Callable[[Tensor], Tensor]) -> Tensor:
        ctx.save_for_backward(x, y)
        ctx.modified = modified
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        x, y = ctx.saved_tensors
        with torch.enable_grad():
            x_in = x.detach().requires_grad_(True)
            z = ctx.modified(x_in)
            (relevance,) = torch.autograd.grad(z, x_in, grad * y / _stabilize(z.detach(), 1e-6))
        return x * relevance / _stabilize(x, IDENTITY_EPSILON), None, None


def gamma_rule(x: Tensor, y: Tensor, modified: Callable[[Tensor], Tensor]) -> Tensor:
    """``y`` (a linear layer's output at ``x``) with the gamma rule's gradient; ``modified`` is the layer with
    its gamma-modified parameters."""
    if not x.requires_grad:
        return y
    return _GammaRule.apply(x, y.detach(), modified)
