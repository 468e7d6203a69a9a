"""Pre-softmax attention-score edits in DeBERTa-v2/v3's disentangled attention (``Recording.score_edit``).

``DisentangledSelfAttention`` computes its full pre-softmax score in its own code, ``S = q k^T / sqrt(d * s)`` plus
the relative terms ``c2p + p2c`` (``disentangled_attention_bias``; ``s`` = 1 + the number of relative terms), fills
the masked keys with the dtype's minimum and takes the softmax, with no module in between. Within
:func:`deberta_score_edit` two hooks per block, removed on exit, do the edit: a forward pre-hook on the attention
(``attention.self``) recomputes ``S`` from its own inputs with its own projections' parameters and its own
``disentangled_attention_bias`` (the order of operations of its forward, so the scores are the same bit for bit),
and keeps ``softmax(fill(edit(layer, S)))``; a forward hook on its ``dropout`` (applied to the probabilities; the
identity in eval) returns those probabilities instead. So the edit acts on the whole score ``c2c + c2p + p2c`` before
the mask, as AtMan's edit of a plain attention acts on ``q k^T``, and nothing of transformers is patched.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: ``edit(layer, scores) -> scores`` on one block's ``[B, H, N, N]`` pre-softmax scores
ScoreEdit = Callable[[int, Tensor], Tensor]


def disentangled_scores(own: Any, hidden: Tensor, query_states: Optional[Tensor], relative_pos: Optional[Tensor],
                        rel_embeddings: Optional[Tensor]) -> Tensor:
    """The block's full pre-softmax scores ``[B, H, N, N]`` before the mask, as ``DisentangledSelfAttention.forward``
    computes them (``own``: the module)."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import scaled_size_sqrt

    heads = own.num_attention_heads
    query = hidden if query_states is None else query_states
    q = own.transpose_for_scores(F.linear(query, own.query_proj.weight, own.query_proj.bias), heads)
    k = own.transpose_for_scores(F.linear(hidden, own.key_proj.weight, own.key_proj.bias), heads)
    scale_factor = 1 + int("c2p" in own.pos_att_type) + int("p2c" in own.pos_att_type)
    scale = scaled_size_sqrt(q, scale_factor)
    scores = torch.bmm(q, k.transpose(-1, -2) / scale.to(dtype=q.dtype))
    if own.relative_attention:
        scores = scores + own.disentangled_attention_bias(q, k, relative_pos, own.pos_dropout(rel_embeddings),
                                                          scale_factor)
    return scores.view(-1, heads, scores.size(-2), scores.size(-1))


def _hooks(own: Any, layer: int, edit: ScoreEdit) -> List[Any]:
    state: Dict[str, Tensor] = {}

    def edit_scores(_module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        hidden, mask = args[0], (args[1] if len(args) > 1 else kwargs["attention_mask"])
        scores = disentangled_scores(own, hidden, kwargs.get("query_states"), kwargs.get("relative_pos"),
                                     kwargs.get("rel_embeddings"))
        edited = edit(layer, scores)
        if edited.shape != scores.shape:
            raise RuntimeError(f"block {layer}: the score edit returned shape {tuple(edited.shape)} for scores of "
                               f"shape {tuple(scores.shape)}")
        filled = edited.masked_fill(~mask.bool(), torch.finfo(edited.dtype).min)
        state["probabilities"] = F.softmax(filled, dim=-1)

    def give_probabilities(_module: nn.Module, _args: Tuple[Any, ...], out: Tensor) -> Tensor:
        probabilities = state.pop("probabilities")
        if probabilities.shape != out.shape:
            raise RuntimeError(f"block {layer}: edited probabilities {tuple(probabilities.shape)} for attention of "
                               f"shape {tuple(out.shape)}")
        return probabilities

    return [own.register_forward_pre_hook(edit_scores, with_kwargs=True),
            own.dropout.register_forward_hook(give_probabilities)]


@contextlib.contextmanager
def deberta_score_edit(attentions: Sequence[Any], edit: ScoreEdit) -> Iterator[None]:
    """Within it, every block's disentangled attention ``attentions[l]`` (``attention.self``) attends with
    ``softmax(edit(l, S))`` over the keys its mask allows (module docstring); the model must be in eval mode (the
    probabilities' dropout is replaced, not applied)."""
    if any(own.training for own in attentions):
        raise RuntimeError("the DeBERTa score edit replaces the attention dropout's output: eval mode only")
    handles: List[Any] = []
    try:
        for layer, own in enumerate(attentions):
            handles += _hooks(own, layer, edit)
        yield
    finally:
        for handle in handles:
            handle.remove()
