"""Pre-softmax attention-score edits in timm's EVA and BEiT attention (the capability ``Recording.score_edit``).

Their attention computes ``q``, ``k`` functionally (and EVA-02 rotates them after ``q_norm`` / ``k_norm``; BEiT adds
its relative position bias to ``q k^T``), so no module output holds the scores. Within :func:`eva_beit_score_edit`
(the adapter switches fused attention off) one forward pre-hook per block's ``attn``, removed on exit, recomputes
the block's pre-softmax scores ``S`` from the attention input with the module's own parameters and timm's own
functions (:func:`block_scores`), and hands the module an additive term ``edit(layer, S) - S`` through the argument
it already adds to its scores: EVA's ``attn_mask`` (a float mask is added as it is; a boolean key mask is turned
into ``0 / -inf`` first), BEiT's ``shared_rel_pos_bias``. So the softmax sees ``edit(layer, S)`` plus the mask, a
column the edit returns unchanged adds exactly 0, and nothing of timm is patched. ``S`` includes BEiT's relative
position biases (its own and the shared one: position scores, as DeBERTa's relative terms), never a mask's ``-inf``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .adapter import attention_width, qkv_projection

#: ``edit(layer, scores) -> scores`` on one block's ``[B, H, N, N]`` pre-softmax scores
ScoreEdit = Callable[[int, Tensor], Tensor]


def _queries_keys(attn: Any, x: Tensor) -> Tuple[Tensor, Tensor]:
    """``q``, ``k`` ``[B, H, N, head_dim]`` of ``x`` as the module computes them (fused or separate projections)."""
    batch, n, _ = x.shape
    if getattr(attn, "qkv", None) is None:       # EVA with separate q / k / v projections
        q, k = (F.linear(x, p.weight, p.bias).reshape(batch, n, attn.num_heads, -1).transpose(1, 2)
                for p in (attn.q_proj, attn.k_proj))
        return q, k
    width = attention_width(attn)
    qk = qkv_projection(attn, x)[..., :2 * width].reshape(batch, n, 2, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    return qk[0], qk[1]


def block_scores(attn: Any, x: Tensor, rope: Optional[Tensor], bias: Optional[Tensor]) -> Tensor:
    """A block's pre-softmax scores ``[B, H, N, N]`` from its attention input ``x``: ``(q * scale) @ k^T`` with
    EVA's ``q_norm`` / ``k_norm`` and rotary embedding (the prefix tokens unrotated, as ``EvaAttention``), plus
    BEiT's own relative position bias and ``bias`` (the finite part of what the block passes in)."""
    from timm.layers import apply_rot_embed_cat

    q, k = _queries_keys(attn, x)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    if rope is not None:
        npt, half = attn.num_prefix_tokens, getattr(attn, "rotate_half", False)
        q = torch.cat([q[:, :, :npt], apply_rot_embed_cat(q[:, :, npt:], rope, half=half)], dim=2).type_as(q)
        k = torch.cat([k[:, :, :npt], apply_rot_embed_cat(k[:, :, npt:], rope, half=half)], dim=2).type_as(k)
    scores = (q * attn.scale) @ k.transpose(-2, -1)
    if getattr(attn, "relative_position_bias_table", None) is not None:
        scores = scores + attn._get_rel_pos_bias()
    return scores if bias is None else scores + bias


def _finite_and_mask(term: Optional[Tensor], like: Tensor) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """``term`` split into its finite scores (``-inf`` entries 0) and an additive ``0 / -inf`` mask (``None``:
    nothing); a boolean ``term`` is a key mask (``True``: attend)."""
    if term is None:
        return None, None
    if term.dtype == torch.bool:
        return None, torch.zeros(term.shape, dtype=like.dtype, device=like.device).masked_fill_(~term, float("-inf"))
    finite = torch.isfinite(term)
    if bool(finite.all()):
        return term, None
    return term.masked_fill(~finite, 0), torch.zeros_like(term).masked_fill_(~finite, float("-inf"))


def _hook(layer: int, edit: ScoreEdit, argument: str) -> Callable[..., Tuple[Any, Dict[str, Any]]]:
    def give_edit(module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Any, Dict[str, Any]]:
        if kwargs.get("is_causal"):
            raise RuntimeError(f"block {layer}: the score edit needs a non-causal attention")
        x = args[0]
        bias, mask = _finite_and_mask(kwargs.get(argument), x)
        scores = block_scores(module, x, kwargs.get("rope"), bias if argument == "shared_rel_pos_bias" else None)
        edited = edit(layer, scores)
        if edited.shape != scores.shape:
            raise RuntimeError(f"block {layer}: the score edit returned shape {tuple(edited.shape)} for scores of "
                               f"shape {tuple(scores.shape)}")
        term = edited - scores
        for extra in (bias, mask):
            if extra is not None:
                term = term + extra
        return args, {**kwargs, argument: term}
    return give_edit


@contextlib.contextmanager
def eva_beit_score_edit(blocks: Sequence[Any], edit: ScoreEdit, argument: str) -> Iterator[None]:
    """Within it, every block of ``blocks`` attends with ``softmax(edit(block index, S) + mask)`` (module
    docstring); ``argument``: the attention's keyword argument added to its scores (``"attn_mask"``: EVA,
    ``"shared_rel_pos_bias"``: BEiT)."""
    handles: List[Any] = []
    try:
        for layer, block in enumerate(blocks):
            handles.append(block.attn.register_forward_pre_hook(_hook(layer, edit, argument), with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
