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
``"input_conv"``, ``"select"``, ``"mean_pool"``) to a rule function. Two optional entries compute what a
composition of those rules gives, in fewer passes over the tensors: ``"linear_shared"`` (the sum of the
``"linear"`` rule over several Linear layers reading one input, as the clone of a block's query/key/value input
sums them) and ``"mask_add"`` (the ``"add"`` rule on ``scores + mask`` when the mask's share is dropped); a rule
set without them gets the plain composition (:meth:`RuleSet.linear_shared`, :meth:`RuleSet.mask_add`). Family
topologies (``methods/lrp/timm_vit.py``, ``hf_text.py``) and the shared sub-layers only ever call
``rules[layer_type](...)`` or those two methods; a new family reuses these rules, a new rule set is a new
mapping.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

EPS = 1e-9


def safe_divide(a: Tensor, b: Tensor) -> Tensor:
    """The reference stabiliser (``layers_ours.py:10-13``): ``a / (b + 1e-9)`` where ``b != 0``, else ``0``.

    The reference computes ``den = clamp(b, min=eps) + clamp(b, max=eps)``, which equals ``b + eps`` for every
    ``b`` (one of the two clamps is ``eps``), adds another ``eps`` where that denominator is exactly zero
    (``b == -eps``), divides and masks by ``b != 0``. Same values here, in fewer passes over the tensors.
    """
    zero = b == 0
    den = b + EPS
    den.masked_fill_(den == 0, EPS)
    return (a / den).masked_fill_(zero, 0)


def safe_divide_(a: Tensor, b: Tensor, eps: float = EPS) -> Tensor:
    """:func:`safe_divide` computed in ``b``'s storage: ``b`` (a buffer the caller owns, of the result's shape)
    is overwritten with the quotient and returned.

    ``eps`` is the stabiliser for a scaled denominator: ``safe_divide_(a, b / c, EPS / c)`` equals
    ``c * safe_divide(a, b)`` bit for bit when ``c`` is a power of two (scaling by 2**k commutes with rounding),
    which is how the rules fold the reference's halvings into the division.
    """
    zero = b == 0
    b.add_(eps)
    b.masked_fill_(b == 0, eps)
    torch.div(a, b, out=b)
    return b.masked_fill_(zero, 0)


def safe_quotient(a: Tensor, b: Tensor, eps: float = EPS) -> Tensor:
    """``safe_divide_(a, b.clone(), eps)`` in a new buffer, without the copy: ``b + eps`` is formed there."""
    zero = b == 0
    den = b + eps
    den.masked_fill_(den == 0, eps)
    torch.div(a, den, out=den)
    return den.masked_fill_(zero, 0)


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

    ``out`` (and ``bias``): the layer's recorded output ``x W^T + b`` when the caller has it; **the rule then
    overwrites** ``out`` (callers pass activations they no longer need). Then ``Z = (x W^T + |x| |W|^T) / 2``
    — the same value as ``x+ W+^T + x- W-^T`` in exact arithmetic — costs one matrix product instead of two,
    and ``R_in = x * (S @ W/2) + |x| * (S @ |W|/2)`` (the same identity). Float rounding differs (an error of
    order eps * (|x| |W|^T) instead of eps * Z); the float64 golden tests hold for both forms.
    """
    if out is not None:
        return _linear_alpha1_beta0_from_output(x, weight, relevance, out, bias)
    xp, xn = _split(x)
    wp, wn = _split(weight)
    z = F.linear(xp, wp)
    z += F.linear(xn, wn)
    s = safe_divide_(relevance, z)
    r_in = xp.mul_(s @ wp)
    return r_in.add_(xn.mul_(s @ wn))


def _half_quotient(abs_x: Tensor, abs_w: Tensor, relevance: Tensor, out: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``S/2 = safe_divide(R, Z) / 2`` ``[M, n_out]`` in ``out``'s storage (**overwritten**), with
    ``2Z = out - b + |x| |W|^T``: one matrix product accumulated into ``out`` (``abs_x``: ``|x|`` as
    ``[M, n_in]``)."""
    n_out = abs_w.shape[0]
    z = out.reshape(-1, n_out).addmm_(abs_x, abs_w.t())          # 2Z + b
    if bias is None:
        return safe_divide_(relevance.reshape(-1, n_out), z, 2 * EPS)
    zero = z == bias                                              # 2Z == 0 exactly <=> z == b
    z.sub_(bias - 2 * EPS)
    z.masked_fill_(z == 0, 2 * EPS)
    return torch.div(relevance.reshape(-1, n_out), z, out=z).masked_fill_(zero, 0)


def _linear_alpha1_beta0_from_output(x: Tensor, weight: Tensor, relevance: Tensor, out: Tensor,
                                     bias: Optional[Tensor]) -> Tensor:
    """:func:`linear_alpha1_beta0` from the recorded output ``out = x W^T + b``, **which it overwrites**.

    ``2Z = out - b + |x| |W|^T`` (one matrix product, accumulated into ``out``'s storage); the division gives
    ``S/2 = safe_divide(R, Z) / 2`` exactly (:func:`safe_divide_` with ``2 eps``), so
    ``R_in = x * (S/2 @ W) + |x| * (S/2 @ |W|)`` needs no halved copies of the weights.
    """
    n_in = weight.shape[1]
    abs_w = weight.abs()
    abs_x = x.abs().reshape(-1, n_in)
    s = _half_quotient(abs_x, abs_w, relevance, out, bias)
    t = torch.mm(s, abs_w)
    r_in = abs_x.mul_(t)
    r_in.addcmul_(x.reshape(-1, n_in), torch.mm(s, weight, out=t))
    return r_in.reshape(x.shape)


def _mm_into(total: Optional[Tensor], a: Tensor, b: Tensor) -> Tensor:
    """``total + a @ b``, accumulated in place into ``total`` (``addmm_``); ``a @ b`` when ``total`` is None."""
    return torch.mm(a, b) if total is None else total.addmm_(a, b)


def linear_alpha1_beta0_shared(x: Tensor, layers: Sequence[Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]]
                               ) -> Tensor:
    """``sum_p linear_alpha1_beta0(x, W_p, R_p, out_p, b_p)`` for Linear layers ``p`` that all read ``x``
    (``layers``: ``(weight, relevance, out, bias)`` each; **every** ``out_p`` **is overwritten**; ``out_p``
    ``None`` falls back to the rule without outputs).

    The clone rule sums these relevances (the query, key and value projections of a block); the sum is
    ``x * sum_p (S_p/2 @ W_p) + |x| * sum_p (S_p/2 @ |W_p|)``, so ``|x|`` is formed once and the back-projections
    accumulate in two buffers (``addmm_``): the same matrix products as the separate rules, a third of the
    element-wise passes over ``[M, n_in]``. Equal to the separate rules summed up to float rounding (the order
    of the additions).
    """
    if any(out is None for _, _, out, _ in layers):
        total: Optional[Tensor] = None
        for weight, relevance, out, bias in layers:
            r = linear_alpha1_beta0(x, weight, relevance, out, bias)
            total = r if total is None else total.add_(r)
        assert total is not None, "no Linear layers"
        return total
    n_in = x.shape[-1]
    abs_x = x.abs().reshape(-1, n_in)
    t: Optional[Tensor] = None
    u: Optional[Tensor] = None
    for weight, relevance, out, bias in layers:
        abs_w = weight.abs()
        s = _half_quotient(abs_x, abs_w, relevance, out, bias)
        t, u = _mm_into(t, s, weight), _mm_into(u, s, abs_w)
    assert t is not None and u is not None, "no Linear layers"
    r_in = abs_x.mul_(u)
    r_in.addcmul_(x.reshape(-1, n_in), t)
    return r_in.reshape(x.shape)


def linear_separate_groups(x: Tensor, weight: Tensor, relevance: Tensor, out: Optional[Tensor] = None,
                           bias: Optional[Tensor] = None) -> Tensor:
    """"orig" Linear rule (``layers_lrp.py:188-211``): the positive groups ``x+ W+^T`` and ``x- W-^T`` are each
    normalised *separately*: ``R_in = x+ * (safe_divide(R, x+W+^T) @ W+) + x- * (safe_divide(R, x-W-^T) @ W-)``.

    Does **not** conserve relevance: each group redistributes all of ``R``, so ``sum R`` roughly doubles per
    Linear layer (the reference's baseline behaviour, kept on purpose). The bias is ignored; ``out`` and ``bias``
    are unused.
    """
    xp, xn = _split(x)
    wp, wn = _split(weight)
    sp = safe_divide_(relevance, F.linear(xp, wp))
    sn = safe_divide_(relevance, F.linear(xn, wn))
    r_in = xp.mul_(sp @ wp)
    return r_in.add_(xn.mul_(sn @ wn))


def linear_separate_groups_shared(x: Tensor, layers: Sequence[Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]]
                                  ) -> Tensor:
    """``sum_p linear_separate_groups(x, W_p, R_p)`` over Linear layers reading ``x`` (``layers``:
    ``(weight, relevance, out, bias)``; ``out`` and ``bias`` unused): ``x+ * sum_p (S+_p @ W+_p) +
    x- * sum_p (S-_p @ W-_p)``, the back-projections accumulated (``addmm_``). Equal to the separate rules
    summed up to float rounding."""
    n_in = x.shape[-1]
    xp, xn = _split(x.reshape(-1, n_in))
    tp: Optional[Tensor] = None
    tn: Optional[Tensor] = None
    for weight, relevance, _out, _bias in layers:
        wp, wn = _split(weight)
        r = relevance.reshape(-1, weight.shape[0])
        sp = safe_divide_(r, F.linear(xp, wp))
        sn = safe_divide_(r, F.linear(xn, wn))
        tp, tn = _mm_into(tp, sp, wp), _mm_into(tn, sn, wn)
    assert tp is not None and tn is not None, "no Linear layers"
    r_in = xp.mul_(tp)
    return r_in.add_(xn.mul_(tn)).reshape(x.shape)


# --------------------------------------------------------------------------------------------- Add
def add_proportional(x0: Tensor, x1: Tensor, relevance: Tensor) -> Tuple[Tensor, Tensor]:
    """"orig" Add rule (``RelPropSimple`` on ``x0 + x1``): ``R_i = x_i * safe_divide(R, x0 + x1)``.

    Conserves ``sum R`` only up to the stabiliser and where no term is masked; with operands of opposite signs
    the split is unbounded (each share can exceed ``R``). ``x1`` may broadcast against ``x0`` (positional
    embedding); its relevance is then returned at ``x0``'s shape, per sample.
    """
    s = safe_divide_(relevance, x0 + x1)
    return x0 * s, s.mul_(x1)


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
    return a.mul_(safe_divide(a_fact, a_sum)), b.mul_(safe_divide(b_fact, b_sum))


def _masked_quotient(x0: Tensor, mask: Optional[Tensor], relevance: Tensor) -> Tensor:
    """``safe_divide(R, x0 + mask)`` in a new buffer (``mask`` ``None``: all zero, ``x0 + 0 = x0``)."""
    return safe_quotient(relevance, x0) if mask is None else safe_divide_(relevance, x0 + mask)


def mask_add_proportional(x0: Tensor, mask: Optional[Tensor], relevance: Tensor) -> Tensor:
    """``add_proportional(x0, mask, R)[0]`` for a caller that drops the second operand's share (the attention
    scores plus the additive attention mask), in a new buffer (``x0`` is not modified). ``mask``
    broadcastable to ``x0``; ``None`` stands for an all-zero mask (no padding in the batch)."""
    return _masked_quotient(x0, mask, relevance).mul_(x0)


def mask_add_renormalised(x0: Tensor, mask: Optional[Tensor], relevance: Tensor) -> Tensor:
    """``add_renormalised(x0, mask, R)[0]`` for a caller that drops the mask's share, in a new buffer (``x0``
    is not modified): the mask's relevance ``b = mask * S`` is only summed (its per-sample sum sets the
    renormalisation), never kept. ``mask`` ``None`` stands for an all-zero mask: then ``b = 0`` exactly and
    nothing of it is computed (identical values as long as the relevance is finite)."""
    a = _masked_quotient(x0, mask, relevance)
    b_abs = None if mask is None else _sum_per_sample(a * mask).abs()
    a.mul_(x0)
    a_sum, r_sum = _sum_per_sample(a), _sum_per_sample(relevance)
    total = a_sum.abs() if b_abs is None else a_sum.abs() + b_abs
    a_fact = safe_divide(a_sum.abs(), total) * r_sum
    return a.mul_(safe_divide(a_fact, a_sum))


# --------------------------------------------------------------------------------------------- Clone, select, pool
def clone(x: Tensor, relevances: Sequence[Tensor]) -> Tensor:
    """Clone rule (``layers_ours.py:151-169``, same in orig): a tensor used by several branches gets
    ``x * sum_i safe_divide(R_i, x)`` — the sum of the branch relevances wherever ``x != 0`` (conservative up to
    the stabiliser). Computed as ``x * safe_divide(sum_i R_i, x)`` (the sum before the division: the same
    value up to rounding)."""
    total = relevances[0] + relevances[1] if len(relevances) > 1 else relevances[0]
    for r in relevances[2:]:
        total += r
    return safe_quotient(total, x).mul_(x)


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
def matmul_grad_x_input(a: Tensor, b: Tensor, relevance: Tensor, ab: Optional[Tensor] = None,
                        scale: float = 1.0, overwrite_ab: bool = False) -> Tuple[Tensor, Tensor]:
    """Gradient x input on a product ``Z = a @ b`` (``RelPropSimple`` on the reference's ``einsum``):
    ``S = safe_divide(R, Z)``, ``R_a = a * (S @ b^T)``, ``R_b = b * (a^T @ S)``, both multiplied by ``scale``.

    Each operand receives the full ``sum R`` (for a bilinear map) — the attention callers pass ``scale=0.5``,
    the reference's halving of both (``ViT_LRP.py:160-162, 171-173``), so that the pair conserves it. The
    scale is folded into the division (``S * scale``, see :func:`safe_divide_`): for a power of two the result
    is bit for bit ``scale * R_a``, ``scale * R_b``. ``b`` is given in the layout of the product (pass
    ``k.transpose(-2, -1)`` for ``q @ k^T`` and transpose ``R_b`` back). ``ab``: the product ``a @ b`` when the
    caller has it (not recomputed then); it is left unchanged unless ``overwrite_ab``, which lets the rule
    divide in its storage (one buffer of the product's size fewer).
    """
    if ab is not None and overwrite_ab and scale != 1 and ab.numel() > a.numel() + b.numel():
        # the product is the largest tensor here (q @ k^T): scale the two results instead of it (for a power
        # of two the same bits: S/scale @ b^T = (S @ b^T)/scale exactly)
        s = safe_divide_(relevance, ab)
        return (torch.matmul(s, b.transpose(-2, -1)).mul_(a).mul_(scale),
                torch.matmul(a.transpose(-2, -1), s).mul_(b).mul_(scale))
    if ab is None:
        den = torch.matmul(a if scale == 1 else a / scale, b)
    elif overwrite_ab:
        den = ab.div_(scale) if scale != 1 else ab
    else:
        den = ab / scale if scale != 1 else ab.clone()
    s = safe_divide_(relevance, den, EPS / scale)
    return torch.matmul(s, b.transpose(-2, -1)).mul_(a), torch.matmul(a.transpose(-2, -1), s).mul_(b)


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
    linear_uses_output: bool = False   # the Linear rule reads the layer's recorded output (walks record it then)

    def __getitem__(self, layer_type: str) -> Callable:
        return self.rules[layer_type]

    def linear_shared(self, x: Tensor, layers: Sequence[Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]]
                      ) -> Tensor:
        """The sum over Linear layers reading ``x`` (``(weight, relevance, out, bias)`` each) of the
        ``"linear"`` rule: the set's ``"linear_shared"`` entry, or the separate rules summed. ``out`` tensors
        may be overwritten (as by the ``"linear"`` rule)."""
        shared = self.rules.get("linear_shared")
        if shared is not None:
            return shared(x, layers)
        total: Optional[Tensor] = None
        for weight, relevance, out, bias in layers:
            r = self.rules["linear"](x, weight, relevance, out, bias)
            total = r if total is None else total + r
        assert total is not None, "no Linear layers"
        return total

    def mask_add(self, scores: Tensor, mask: Optional[Tensor], relevance: Tensor) -> Tensor:
        """The relevance of ``scores`` in ``scores + mask`` by the ``"add"`` rule, the mask's share dropped
        (``mask`` ``None``: all zero), in a new tensor (``scores`` is not modified): the set's ``"mask_add"``
        entry, or the ``"add"`` rule's first output."""
        fast = self.rules.get("mask_add")
        if fast is not None:
            return fast(scores, mask, relevance)
        return self.rules["add"](scores, torch.zeros_like(scores) if mask is None else mask, relevance)[0]


_SHARED: Dict[str, Callable[..., Any]] = {
    "clone": clone,
    "matmul": matmul_grad_x_input,
    "input_conv": conv_zb,
    "select": select,
    "mean_pool": mean_pool,
}

RULE_SETS: Dict[str, RuleSet] = {
    "ours": RuleSet(
        "ours",
        dict(_SHARED, linear=linear_alpha1_beta0, add=add_renormalised, linear_shared=linear_alpha1_beta0_shared,
             mask_add=mask_add_renormalised),
        "Transformer Attribution rules (TE layers_ours.py): alpha=1/beta=0 Linear with joint normalisation, "
        "renormalised Add (per sample); conservative up to the stabiliser.",
        linear_uses_output=True,
    ),
    "orig": RuleSet(
        "orig",
        dict(_SHARED, linear=linear_separate_groups, add=add_proportional,
             linear_shared=linear_separate_groups_shared, mask_add=mask_add_proportional),
        "Conventional LRP baseline rules (TE layers_lrp.py): Linear positive/negative groups normalised "
        "separately (non-conservative, ~2x per Linear), plain proportional Add.",
    ),
}


def get_rules(name: Union[str, RuleSet]) -> RuleSet:
    if isinstance(name, RuleSet):
        return name
    try:
        return RULE_SETS[name]
    except KeyError:
        raise ValueError(f"unknown LRP rule set {name!r}; available: {', '.join(RULE_SETS)}") from None
