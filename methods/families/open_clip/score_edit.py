"""Pre-softmax attention-score edits in open_clip's blocks (the capability ``Recording.score_edit``).

open_clip's ``ResidualAttentionBlock`` calls ``torch.nn.MultiheadAttention`` with the tower's ``attn_mask`` (``None``,
or the text tower's causal float mask); the module adds a float ``attn_mask`` to its scores
``S = (q / sqrt(d)) k^T`` before the softmax and takes one mask per sample and head (``[B * H, N, N]``). A forward
pre-hook on each block's ``attn`` (removed on exit) computes ``S`` from the module's packed ``in_proj_weight`` (its
query and key thirds) and hands the module ``attn_mask + edit(layer, S) - S``: the softmax sees ``edit(layer, S)``
plus the tower's own mask, a column the edit returns unchanged adds exactly 0, and nothing of torch or open_clip is
patched. The query and key projections are computed twice (the hook's and the module's own).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

#: ``edit(layer, scores) -> scores`` on one block's ``[B, H, N, N]`` pre-softmax scores
ScoreEdit = Callable[[int, Tensor], Tensor]


def _scores(attn: Any, x: Tensor) -> Tensor:
    """``(q / sqrt(d)) k^T`` ``[B, H, N, N]`` of the batch-first ``x`` ``[B, N, D]``, as the module computes them."""
    dim, heads = attn.embed_dim, attn.num_heads
    weight, bias = attn.in_proj_weight, attn.in_proj_bias
    qk = F.linear(x, weight[:2 * dim], None if bias is None else bias[:2 * dim])
    batch, n = x.shape[:2]
    q, k = qk.reshape(batch, n, 2, heads, dim // heads).permute(2, 0, 3, 1, 4)
    return (q * (dim // heads) ** -0.5) @ k.transpose(-2, -1)


def _hook(layer: int, edit: ScoreEdit) -> Callable[..., Tuple[Tuple[Any, ...], Dict[str, Any]]]:
    def give_mask(module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        x = args[0] if args else kwargs["query"]
        if not module.batch_first:
            x = x.transpose(0, 1)
        if kwargs.get("key_padding_mask") is not None or kwargs.get("is_causal"):
            raise RuntimeError(f"block {layer}: the score edit takes an attention without a key padding mask")
        scores = _scores(module, x)
        edited = edit(layer, scores)
        if edited.shape != scores.shape:
            raise RuntimeError(f"block {layer}: the score edit returned shape {tuple(edited.shape)} for scores of "
                               f"shape {tuple(scores.shape)}")
        delta = edited - scores
        mask = kwargs.get("attn_mask")
        if mask is not None:
            if mask.dtype == torch.bool:
                raise RuntimeError(f"block {layer}: the score edit takes a float attention mask")
            delta = delta + mask
        return args, {**kwargs, "attn_mask": delta.flatten(0, 1)}
    return give_mask


@contextlib.contextmanager
def open_clip_score_edit(blocks: Sequence[Any], edit: ScoreEdit) -> Iterator[None]:
    """Within it every block of ``blocks`` attends with ``softmax(edit(block index, S) + its mask)``."""
    handles: List[Any] = []
    try:
        for layer, block in enumerate(blocks):
            handles.append(block.attn.register_forward_pre_hook(_hook(layer, edit), with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
