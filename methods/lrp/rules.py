"""LRP rules of Chefer et al. (2021a), as functions of recorded activations, keyed by layer type.

Every rule takes the tensors recorded during the model's normal forward pass (inputs of the layer, its weights)
and the relevance ``R`` of the layer's output, and returns the relevance of the input(s). No rule re-runs a
module: the closed forms below are what the reference's ``torch.autograd.grad`` on a re-run forward computes
(``TE:modules/layers_ours.py`` for the "ours" rule set, ``TE:modules/layers_lrp.py`` for "orig"), so the
relevance pass needs no autograd graph.

Conventions shared by all rules (reference ``RelProp`` / ``RelPropSimple``):

* ``safe_divide(a, b) = a / (b + 1e-9)`` where ``b != 0`` and ``0`` where ``b == 0`` — the reference's
  stabiliser, which adds ``+1e-9`` whatever the sign of ``b`` (it is *not* the sign-aware epsilon rule).
* biases are ignored by the Linear/Conv rules (they absorb relevance), so even the conservative rules conserve
  ``sum R`` only up to the relevance of biases that the stabiliser and the positive/negative split discard;
  the tests check exact conservation on bias-free layers.
* LayerNorm, GELU (any element-wise activation), softmax, dropout and drop-path pass relevance through unchanged
  (``RelProp.relprop`` default = identity).

A rule set is a :class:`RuleSet`: a mapping from layer type (``"linear"``, ``"add"``, ``"clone"``, ``"matmul"``,
``"input_conv"``, ``"select"``, ``"mean_pool"``) to a rule function. Family graph walks (``methods/lrp/walks.py``)
only ever call ``rules[layer_type](...)``; a new family reuses these rules, a new rule set is a new mapping.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

EPS = 1e-9


def safe_divide(a: Tensor, b: Tensor) -> Tensor:
    """The reference stabiliser (``layers_ours.py:10-13``): ``a / (b + 1e-9)`` where ``b != 0``, else ``0``.

    Written exactly as the reference computes it: ``den = clamp(b, min=eps) + clamp(b, max=eps)`` equals
    ``b + eps`` for every ``b``; a denominator that is exactly zero gets another ``eps``; the result is masked
    by ``b != 0``.
    """
    # b.clamp(min=EPS) + b.clamp(max=EPS) == b + EPS bit for bit (one of the two clamps is EPS); the masked
    # in-place form below saves passes over the (large) tensors and equals the reference wherever it is finite.
    den = b + EPS
    den.masked_fill_(den == 0, EPS)
    out = a / den
    return out.masked_fill_(b == 0, 0)


def _sum_per_sample(x: Tensor) -> Tensor:
    return x.reshape(x.shape[0], -1).sum(dim=1).reshape((-1,) + (1,) * (x.dim() - 1))


# --------------------------------------------------------------------------------------------- Linear
def _split(x: Tensor) -> Tuple[Tensor, Tensor]:
    return x.clamp(min=0), x.clamp(max=0)


def linear_alpha1_beta0(x: Tensor, weight: Tensor, relevance: Tensor, out: Optional[Tensor] = None,
                        bias: Optional[Tensor] = None) -> Tensor:
    """"ours" Linear rule: the alpha-beta rule (Bach et al. 2015) with alpha=1, beta=0, as Chefer et al. 2021a
    Sec. 3.1 uses it (``layers_ours.py:207-230``).

    With ``x+ = relu(x)``, ``x- = min(x, 0)``, ``W+``/``W-`` likewise: only the positive contributions
    ``Z = x+ W+^T + x- W-^T`` are kept and normalised *jointly*:
    ``R_in = x+ * (S @ W+) + x- * (S @ W-)``, ``S = safe_divide(R, Z)``. Conserves ``sum R`` up to the
    stabiliser (and up to output units whose positive contributions are all zero). The bias is ignored.

    ``out`` (and ``bias``): the layer's recorded output ``x W^T + b`` when the caller has it. Then
    ``Z = (x W^T + |x| |W|^T) / 2`` — the same value as ``x+ W+^T + x- W-^T`` in exact arithmetic — costs one
    matrix product instead of two, and ``R_in = x * (S @ W/2) + |x| * (S @ |W|/2)`` (the same identity).
    Float rounding differs (an error of order eps * (|x| |W|^T) instead of eps * Z): on the golden ViT the
    float64 results agree with the reference to 1e-11 either way.
    """
    if out is not None:
        half_w, half_abs_w = weight * 0.5, weight.abs().mul_(0.5)
        abs_x = x.abs()
        z = F.linear(abs_x, half_abs_w, None if bias is None else bias * -0.5).add_(out, alpha=0.5)
        s = safe_divide(relevance, z)
        r_in = abs_x.mul_(s @ half_abs_w)
        return r_in.addcmul_(x, s @ half_w)
    xp, xn = _split(x)
    wp, wn = _split(weight)
    z = F.linear(xp, wp)
    z += F.linear(xn, wn)
    s = safe_divide(relevance, z)
    r_in = xp.mul_(s @ wp)
    return r_in.add_(xn.mul_(s @ wn))


def linear_separate_groups(x: Tensor, weight: Tensor, relevance: Tensor, out: Optional[Tensor] = None,
                           bias: Optional[Tensor] = None) -> Tensor:
    """"orig" Linear rule (``layers_lrp.py:188-211``): the positive groups ``x+ W+^T`` and ``x- W-^T`` are each
    normalised *separately*: ``R_in = x+ * (safe_divide(R, x+W+^T) @ W+) + x- * (safe_divide(R, x-W-^T) @ W-)``.

    Does **not** conserve relevance: each group redistributes all of ``R``, so ``sum R`` roughly doubles per
    Linear layer (the reference's baseline behaviour, kept on purpose). The bias is ignored; ``out`` and ``bias`` are unused.
    """
    xp, xn = _split(x)
    wp, wn = _split(weight)
    sp = safe_divide(relevance, F.linear(xp, wp))
    sn = safe_divide(relevance, F.linear(xn, wn))
    return xp * (sp @ wp) + xn * (sn @ wn)


# --------------------------------------------------------------------------------------------- Add
def add_proportional(x0: Tensor, x1: Tensor, relevance: Tensor) -> Tuple[Tensor, Tensor]:
    """"orig" Add rule (``RelPropSimple`` on ``x0 + x1``): ``R_i = x_i * safe_divide(R, x0 + x1)``.

    Conserves ``sum R`` only up to the stabiliser and where no term is masked; with operands of opposite signs
    the split is unbounded (each share can exceed ``R``). ``x1`` may broadcast against ``x0`` (positional
    embedding); its relevance is then returned at ``x0``'s shape, per sample.
    """
    s = safe_divide(relevance, x0 + x1)
    return x0 * s, x1 * s


def add_renormalised(x0: Tensor, x1: Tensor, relevance: Tensor) -> Tuple[Tensor, Tensor]:
    """"ours" Add rule, the normalisation of binary operators of Chefer et al. 2021a Sec. 3.2
    (``layers_ours.py:97-120``): proportional split, then each branch is rescaled so that it
    carries the share ``|sum a| / (|sum a| + |sum b|)`` of ``sum R`` (all divisions by ``safe_divide``).

    **Per sample**: the reference takes the sums over the *whole tensor* (all batch items), which only equals a
    per-sample computation at batch size 1 — every reference run is batch 1, so the per-sample sums here
    reproduce it and keep samples independent. Conserves ``sum R`` per sample (up to the stabiliser).
    """
    a, b = add_proportional(x0, x1, relevance)
    a_sum, b_sum = _sum_per_sample(a), _sum_per_sample(b)
    r_sum = _sum_per_sample(relevance)
    total = a_sum.abs() + b_sum.abs()
    a_fact = safe_divide(a_sum.abs(), total) * r_sum
    b_fact = safe_divide(b_sum.abs(), total) * r_sum
    return a * safe_divide(a_fact, a_sum), b * safe_divide(b_fact, b_sum)


# --------------------------------------------------------------------------------------------- Clone, select, pool
def clone(x: Tensor, relevances: Sequence[Tensor]) -> Tensor:
    """Clone rule (``layers_ours.py:151-169``, same in orig): a tensor used by several branches gets
    ``x * sum_i safe_divide(R_i, x)`` — the sum of the branch relevances wherever ``x != 0`` (conservative up to
    the stabiliser)."""
    total = safe_divide(relevances[0], x)
    for r in relevances[1:]:
        total = total + safe_divide(r, x)
    return x * total


def select(x: Tensor, relevance: Tensor) -> Tensor:
    """Token selection (``IndexSelect``, [CLS] pooling): ``x_sel * safe_divide(R, x_sel)``, i.e. ``R`` placed
    on the selected token (up to the stabiliser). The caller scatters it into a zero token tensor."""
    return x * safe_divide(relevance, x)


def mean_pool(x: Tensor, relevance: Tensor) -> Tensor:
    """Gradient x input on a mean over tokens (dim 1) — for global-average-pooled ViTs, which the reference does
    not cover: ``R_tok = x_tok * safe_divide(R, mean_tok x) / n``. Proportional split; conserves ``sum R`` where
    the pooled value is not masked, but is unbounded with mixed signs (as every proportional rule)."""
    n = x.shape[1]
    s = safe_divide(relevance, x.mean(dim=1))
    return x * (s[:, None] / n)


# --------------------------------------------------------------------------------------------- matmul
def matmul_grad_x_input(a: Tensor, b: Tensor, relevance: Tensor, ab: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Gradient x input on a product ``Z = a @ b`` (``RelPropSimple`` on the reference's ``einsum``):
    ``S = safe_divide(R, Z)``, ``R_a = a * (S @ b^T)``, ``R_b = b * (a^T @ S)``.

    Each operand receives the full ``sum R`` (for a bilinear map) — the attention callers halve both
    (``ViT_LRP.py:160-162, 171-173``) so that the pair conserves it. ``b`` is given in the layout of the
    product (pass ``k.transpose(-2, -1)`` for ``q @ k^T`` and transpose ``R_b`` back). ``ab``: the product
    ``a @ b`` when the caller recorded it (not recomputed then).
    """
    s = safe_divide(relevance, a @ b if ab is None else ab)
    return a * (s @ b.transpose(-2, -1)), b * (a.transpose(-2, -1) @ s)


# --------------------------------------------------------------------------------------------- input conv
def conv_zb(x: Tensor, weight: Tensor, relevance: Tensor, stride, padding) -> Tensor:
    """z^B rule on the first (pixel-input) convolution (Montavon et al. 2017; ``layers_ours.py:242-259``,
    identical in orig): ``L``/``H`` = per-sample min/max of the input over channels and pixels (broadcast),
    ``Z = conv(x, W) - conv(L, W+) - conv(H, W-) + 1e-9`` (a plain ``+1e-9``, no bias),
    ``S = R / Z``, ``R_in = x * convT(S, W) - L * convT(S, W+) - H * convT(S, W-)``.

    Conserves ``sum R`` up to the ``+1e-9`` (the three terms are bilinear in the input box, so
    ``sum R_in = sum S * Z``) when the convolution tiles the input (stride = kernel, as in patch embeddings).
    """
    wp, wn = _split(weight)
    flat = x.reshape(x.shape[0], -1)
    low = flat.min(dim=1).values.reshape(-1, 1, 1, 1).expand_as(x)
    high = flat.max(dim=1).values.reshape(-1, 1, 1, 1).expand_as(x)
    z = (F.conv2d(x, weight, None, stride, padding) - F.conv2d(low, wp, None, stride, padding)
         - F.conv2d(high, wn, None, stride, padding) + EPS)
    s = relevance / z

    def back(w: Tensor) -> Tensor:
        out = F.conv_transpose2d(s, w, None, stride, padding)
        dh, dw = x.shape[-2] - out.shape[-2], x.shape[-1] - out.shape[-1]
        return F.pad(out, (0, dw, 0, dh)) if dh or dw else out

    return x * back(weight) - low * back(wp) - high * back(wn)


# --------------------------------------------------------------------------------------------- rule sets
@dataclass(frozen=True)
class RuleSet:
    """A named mapping ``layer type -> rule``. Layer types without an entry are identity (LayerNorm, GELU,
    softmax, dropout)."""

    name: str
    rules: Dict[str, Callable] = field(default_factory=dict)
    description: str = ""

    def __getitem__(self, layer_type: str) -> Callable:
        return self.rules[layer_type]


_SHARED = {
    "clone": clone,
    "matmul": matmul_grad_x_input,
    "input_conv": conv_zb,
    "select": select,
    "mean_pool": mean_pool,
}

RULE_SETS: Dict[str, RuleSet] = {
    "ours": RuleSet(
        "ours",
        dict(_SHARED, linear=linear_alpha1_beta0, add=add_renormalised),
        "Transformer Attribution rules (TE layers_ours.py): alpha=1/beta=0 Linear with joint normalisation, "
        "renormalised Add (per sample); conservative up to the stabiliser.",
    ),
    "orig": RuleSet(
        "orig",
        dict(_SHARED, linear=linear_separate_groups, add=add_proportional),
        "Conventional LRP baseline rules (TE layers_lrp.py): Linear positive/negative groups normalised "
        "separately (non-conservative, ~2x per Linear), plain proportional Add.",
    ),
}


def get_rules(name) -> RuleSet:
    if isinstance(name, RuleSet):
        return name
    try:
        return RULE_SETS[name]
    except KeyError:
        raise ValueError(f"unknown LRP rule set {name!r}; available: {', '.join(RULE_SETS)}") from None
