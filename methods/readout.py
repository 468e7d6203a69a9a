"""The read-out: which rows of a token-to-token relevance matrix stand for the prediction.

A method that builds an ``[B, (H,) N, N]`` matrix (attention, rollout, relevance) reports, for every position,
the entry in the row of the position the prediction reads: the class token's row for a [CLS] read-out, each
sample's own row for a per-sample read-out position (CLIP's EOS), the mean over the content rows for a
mean-pooled model, the rows weighted by fixed weights (DeiT's two heads, DINOv2) or by the pool's attention for an
attention-pooled model (timm's ``map``).
:func:`read_out` is that choice for every method; the method's output then keeps the content columns
(``layout.output``).
"""
from __future__ import annotations

from typing import Optional, TypeGuard

import torch
from torch import Tensor

from .adapters import WEIGHTED_READOUTS, Layout, MethodUndefinedError, ModelAdapter, ModelInputs, TokenSequence

READOUTS = ("auto", "class_token", "mean_content", "position", "weighted", "attention_pool")
#: earlier option values, still accepted
READOUT_ALIASES = {"cls": "class_token", "mean_patches": "mean_content"}


def check_readout(readout: str) -> str:
    """The canonical name of a ``readout`` option value; ``ValueError`` listing the choices otherwise."""
    readout = READOUT_ALIASES.get(readout, readout)
    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {READOUTS} (or {tuple(READOUT_ALIASES)}), got {readout!r}")
    return readout


def resolve_readout(adapter: ModelAdapter, readout: str) -> str:
    """``auto`` -> the model's own read-out; checks that the model has what the read-out needs."""
    readout = check_readout(readout)
    if readout == "auto":
        readout = adapter.readout.kind
    if readout == "class_token" and not adapter.readout.class_token:
        raise ValueError("readout='class_token' (cls) needs a model with a class token")
    if readout == "position" and adapter.readout.kind != "position":
        raise ValueError(f"readout='position' needs a model read out at a per-sample position ({adapter.family} "
                         f"reads out with {adapter.readout.kind!r})")
    if readout in WEIGHTED_READOUTS and adapter.readout.kind != readout:
        kind = "as a weighted mean of positions" if readout == "weighted" else "by an attention pooling head"
        raise ValueError(f"readout={readout!r} needs a model read out {kind} ({adapter.family} reads out with "
                         f"{adapter.readout.kind!r})")
    return readout


def check_readout_space(adapter: ModelAdapter, layer: int, inputs: ModelInputs, name: str) -> None:
    """:class:`~methods.adapters.MethodUndefinedError` unless block ``layer``'s tokens are the read-out's (no
    transition other than the identity between it and the last block, :meth:`~methods.adapters.TokenFlow.transition`,
    asked in the dtype and device of ``inputs``' scores): a method that reads one block's map at the read-out row (raw
    attention, Grad-CAM) or composes full matrices (Beyond Intuition) reads it in the read-out's token space only."""
    like = torch.empty(0, dtype=inputs.score_dtype, device=inputs.device)
    changes = [l for l in range(layer + 1, len(adapter.blocks)) if adapter.token_flow.transition(l, like) is not None]
    if changes:
        raise MethodUndefinedError(
            f"{name}: block {layer} of {type(adapter.model).__name__} ({adapter.family}) is in another token space "
            f"than the read-out's (the tokens change entering block(s) {changes}); this method reads a block's map "
            "at the read-out row in the read-out's token space only")


def read_out(matrix: Tensor, adapter: ModelAdapter, inputs: ModelInputs, readout: str = "auto",
             layout: Optional[Layout] = None) -> Tensor:
    """The read-out rows of ``matrix`` ``[B, ..., N, N]`` (query rows, key columns): ``[B, ..., N]``.

    * ``class_token``: row 0 (exactly ``matrix[..., 0, :]``);
    * ``position``: each sample's read-out position (``adapter.inputs.context(inputs).readout_positions``);
    * ``mean_content``: the mean over the content rows (``layout.mean_over_content_rows``: for text the mask
      of each sample's content, where padding and special tokens are left out);
    * ``weighted`` / ``attention_pool``: each sample's rows weighted by ``adapter.readout.weights(inputs,
      layout)`` ``[B, N]``, ``w @ matrix`` (a DeiT's [CLS] and distillation rows, 1/2 each; DINOv2's [CLS] row
      1/2 and the mean patch row 1/2; an attention pool's attention, mean over its heads);
    * ``auto``: the model's own read-out (:func:`resolve_readout`).
    """
    kind = resolve_readout(adapter, readout)
    if kind == "class_token":
        return matrix[..., 0, :]
    if kind == "position":
        positions = adapter.inputs.context(inputs).readout_positions
        assert positions is not None, "a model read out at a position has them in its context"
        positions = positions.to(matrix.device)
        index = positions.reshape((-1,) + (1,) * (matrix.dim() - 2)).expand(matrix.shape[:-2] + (1,))
        return matrix.gather(-2, index[..., None].expand(matrix.shape[:-2] + (1, matrix.shape[-1])))[..., 0, :]
    layout = layout or adapter.inputs.layout(inputs)
    if kind in WEIGHTED_READOUTS:
        weights = adapter.readout.weights(inputs, layout).to(dtype=matrix.dtype, device=matrix.device)
        weights = weights.reshape(weights.shape[:1] + (1,) * (matrix.dim() - 2) + weights.shape[1:])
        return torch.matmul(weights, matrix)[..., 0, :]
    return layout.mean_over_content_rows(matrix)


def read_out_identity(adapter: ModelAdapter, inputs: ModelInputs, readout: str, layout: Layout,
                      like: Tensor) -> Tensor:
    """``read_out(I)`` ``[B, N]`` (``I`` the ``[B, N, N]`` identity), without forming ``I``: the weights ``w`` of
    the read-out's rows, ``read_out(M) = w M`` for every ``M`` (a one-hot row at the read-out position, the
    content rows' mean weights, or the adapter's ``readout.weights``), in ``like``'s dtype and device; ``N`` is
    ``like``'s last dimension. Equal to ``read_out(identity_like(...))`` exactly."""
    kind = resolve_readout(adapter, readout)
    batch, tokens = like.shape[0], like.shape[-1]
    weights = torch.zeros(batch, tokens, dtype=like.dtype, device=like.device)
    if kind == "class_token":
        weights[:, 0] = 1
    elif kind == "position":
        positions = adapter.inputs.context(inputs).readout_positions
        assert positions is not None, "a model read out at a position has them in its context"
        weights.scatter_(1, positions.to(like.device).long()[:, None], 1.0)
    elif kind in WEIGHTED_READOUTS:
        weights[:] = adapter.readout.weights(inputs, layout).to(dtype=like.dtype, device=like.device)
    else:
        weights = layout.content_positions(like).to(like.dtype)
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1)
    return weights


def identity_like(batch: int, tokens: int, like: Tensor) -> Tensor:
    """``[batch, tokens, tokens]`` identity matrices in ``like``'s dtype and device."""
    return torch.eye(tokens, dtype=like.dtype, device=like.device).expand(batch, tokens, tokens).clone()


# ------------------------------------------------------------------------------------------ sequences
CLASS_TOKEN_SCORES = ("auto", "keep", "zero", "row_min")


def check_class_token_score(value: str) -> str:
    if value not in CLASS_TOKEN_SCORES:
        raise ValueError(f"class_token_score must be one of {CLASS_TOKEN_SCORES}, got {value!r}")
    return value


def is_sequence(layout: Layout) -> TypeGuard[TokenSequence]:
    """Whether ``layout`` is a token sequence (text), where the authors' BERT conventions apply."""
    return isinstance(layout, TokenSequence)


def set_class_token_score(scores: Tensor, adapter: ModelAdapter, layout: Layout, mode: str, auto: str,
                          include_padding: bool = False) -> Tensor:
    """The [CLS] entry (position 0) of a read-out row ``[B, N]`` of a sequence read at [CLS]: kept (``keep``),
    set to 0 (``zero``: TE's BERT ``ExplanationGenerator`` for every method but Transformer Attribution, and
    Beyond Intuition's for all) or to the row minimum (``row_min``: TE's BERT Transformer Attribution,
    ``J[:, 0, 0] = J[:, 0].min()``, the minimum over the real positions of the row, [CLS] included; every
    position with ``include_padding``). ``auto``: the method's default ``auto``. Images: unchanged (the [CLS]
    column is not part of the output: ``layout.reports_class_token``)."""
    mode = auto if check_class_token_score(mode) == "auto" else mode
    if not layout.reports_class_token or adapter.readout.kind != "class_token" or mode == "keep":
        return scores
    scores = scores.clone()
    if mode == "zero":
        scores[:, 0] = 0
    else:
        positions = layout.real_positions(scores, include_padding)
        scores[:, 0] = scores.masked_fill(~positions, float("inf")).min(dim=1).values
    return scores
