"""The logit lens of an image family through its own head (``ModelAdapter.lens``, issue 37).

A head reads the hidden states at its read-out (the [CLS] row, the mean of the patch rows, the distillation
token, an attention pool over the patches, ...) after the final norm. To read **one** position ``t`` through
that same code, :func:`lens_through_head` hands the head a sequence made of ``t`` alone, repeated at every place
a read-out may look (``num_prefix_tokens + 1`` places: each prefix token and one patch): every read-out of such
a sequence is ``t`` itself (a mean of copies, an attention pool over identical keys), so the head's own norm,
pooling code, projection and classifier give ``t``'s logits. No family re-implements its head for the lens.
"""
from __future__ import annotations

from torch import Tensor

from .base import ImageAdapter, LogitLens, SequenceContext
from .capability import Capability


def lens_through_head(adapter: ImageAdapter, hidden: Tensor, context: SequenceContext,
                      pre_logits: bool = False) -> Tensor:
    """``adapter.head`` applied to every position of ``hidden`` ``[B, N, D]`` alone: ``[B, N, C]`` (``pre_logits``:
    ``[B, N, latent]``). The head of an image family reads no context (no mask, no read-out positions): a
    context that holds one is refused."""
    if hidden.dim() != 3:
        raise ValueError(f"{adapter.family}: the logit lens reads hidden states [B, N, D], got {tuple(hidden.shape)}")
    if any(t is not None for t in (context.attention_mask, context.readout_positions, context.position_ids)):
        raise ValueError(f"{adapter.family}: the logit lens reads a position alone, so it takes no attention mask, "
                         "read-out positions or position ids")
    batch, positions, width = hidden.shape
    places = int(adapter.num_prefix_tokens) + 1
    alone = hidden.reshape(batch * positions, 1, width).repeat(1, places, 1)
    out = adapter.head(alone, context, pre_logits=pre_logits)
    return out.reshape(batch, positions, out.shape[-1])


class HeadLens(LogitLens):
    """The logit lens of an image family: its own head reading each position alone (:func:`lens_through_head`)."""

    adapter: ImageAdapter

    def logits(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        return lens_through_head(self.adapter, hidden, context, pre_logits)


class LensImageAdapter(ImageAdapter):
    """An image family whose logit lens is :class:`HeadLens`. The family lists it where it would list
    ``ImageAdapter``."""

    lens = Capability(HeadLens)
