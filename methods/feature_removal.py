"""Features removed from the input rather than replaced: what KernelSHAP and LIME perturb with ``mode="removal"``.

A feature is a content position (:func:`methods.feature_replacement.feature_positions`: a content token, or a
patch, whose hidden position follows the layout's prefix tokens). Removing a set of them drops those positions
from the hidden states entering block 0 with the family's own token removal,
:meth:`~methods.adapters.InputFormat.drop_positions` (the removal ``token_ablation`` uses: the other positions
keep their positional embeddings and position ids; DeBERTa, EVA and BEiT turn the position into masked padding
instead; a decoder whose read-out token is removed reads at the real token before it), applied once per removed
position from the last to the first, so that each index still names the original position. The shortened rows run
through the blocks and the head; rows of the same length share a forward, ``batch_size`` at a time, and rows never
interact, so a sample's values do not depend on its batch. A family whose token removal is undefined (Swin: its
windows need every position) or whose read-out averages the content positions (the coalition without features
leaves none) refuses at set-up (:func:`check_removal`); a sample whose every real position is a feature (no
special or prefix token left to read) is refused at the call: its empty coalition has no output.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .adapters import MethodUndefinedError, ModelAdapter, ModelInputs, SequenceContext
from .explanation_targets import explained_scores


def check_removal(adapter: ModelAdapter, name: str) -> None:
    """:class:`MethodUndefinedError` naming ``name`` unless the family can remove positions (it is asked to
    remove one position of an empty one-sample sequence; a family that cannot refuses before reading it) and its
    read-out reads more than an average of the content positions."""
    probe = torch.zeros(1, 2, adapter.token_flow.width)
    try:
        adapter.inputs.drop_positions(probe, SequenceContext(), torch.zeros(1, dtype=torch.long))
    except MethodUndefinedError as err:
        raise MethodUndefinedError(f"{name}: mode='removal' needs the family's token removal: {err}") from None
    if adapter.readout.kind == "mean_content":
        raise MethodUndefinedError(f"{name}: mode='removal' is not defined on {adapter.family}: its read-out "
                                   "averages the content positions, and the coalition without features leaves none "
                                   "to average")


def _row(context: SequenceContext, b: int) -> SequenceContext:
    def pick(t: Optional[Tensor]) -> Optional[Tensor]:
        return None if t is None else t[b:b + 1]
    return SequenceContext(pick(context.attention_mask), pick(context.readout_positions), pick(context.position_ids))


def _cat(contexts: List[SequenceContext], hidden: List[Tensor]) -> SequenceContext:
    """The rows' contexts as one; a row without an attention mask (nothing removed on a family that masks removed
    positions) gets an all-ones one where another row has a mask."""
    masks = [c.attention_mask for c in contexts]
    if any(m is not None for m in masks):
        like = next(m for m in masks if m is not None)
        masks = [torch.ones(h.shape[:2], dtype=like.dtype, device=like.device) if m is None else m
                 for m, h in zip(masks, hidden)]

    def cat(parts: List[Optional[Tensor]], field: str) -> Optional[Tensor]:
        if all(p is None for p in parts):
            return None
        if any(p is None for p in parts):
            raise RuntimeError(f"feature removal: rows disagree on whether their context has {field}")
        return torch.cat([p for p in parts if p is not None])
    return SequenceContext(cat(masks, "attention_mask"),
                           cat([c.readout_positions for c in contexts], "readout_positions"),
                           cat([c.position_ids for c in contexts], "position_ids"))


def removed_row(adapter: ModelAdapter, hidden: Tensor, context: SequenceContext,
                removed: Tensor) -> Tuple[Tensor, SequenceContext]:
    """One sample's hidden states ``[1, N, D]`` and context without the positions ``removed`` (the family's
    :meth:`~methods.adapters.InputFormat.drop_positions`, from the last position to the first)."""
    for position in sorted(removed.tolist(), reverse=True):
        hidden, context = adapter.inputs.drop_positions(hidden, context, torch.tensor([position]))
    return hidden, context


def hidden_feature_positions(adapter: ModelAdapter, inputs: ModelInputs, positions: List[Tensor],
                             width: int) -> List[Tensor]:
    """The hidden-state positions of each sample's features (score index + the layout's prefix tokens);
    ``ValueError`` for a sample whose every real position is a feature."""
    layout = adapter.inputs.layout(inputs)
    if width != layout.num_positions:
        raise RuntimeError(f"feature removal: {adapter.family} embeds {width} positions, its layout has "
                           f"{layout.num_positions}")
    offset = layout.num_positions - layout.num_scores
    like = torch.zeros(inputs.batch_size, layout.num_positions)
    real = layout.real_positions(like).sum(dim=1)
    for b, p in enumerate(positions):
        if len(p) and len(p) == int(real[b]):
            raise ValueError(f"mode='removal': every real position of sample {b} is a feature (no special or "
                             f"prefix token of {adapter.family} is left to read once all are removed); use "
                             "mode='replacement'")
    return [p + offset for p in positions]


def removal_scores(adapter: ModelAdapter, inputs: ModelInputs, positions: List[Tensor], coalitions: List[Tensor],
                   target: Tensor, foil: Optional[Tensor], explain: str, batch_size: int) -> List[Tensor]:
    """The explained score of every coalition of every sample with its absent features removed:
    ``coalitions[b]`` ``[S_b, M_b]`` bool over the features at ``positions[b]`` (score indices); ``[S_b]`` per
    sample (module docstring)."""
    with torch.no_grad():
        context = adapter.inputs.context(inputs)
        hidden = adapter.embed(inputs)
        where = hidden_feature_positions(adapter, inputs, positions, hidden.shape[1])
        scores = [torch.empty(len(c), dtype=hidden.dtype, device=hidden.device) for c in coalitions]
        # rows removing as many positions mostly share a length: order by it, so each chunk is few forwards
        jobs = sorted(((int((~c[s]).sum()), b, s) for b, c in enumerate(coalitions) for s in range(len(c))))
        for i in range(0, len(jobs), batch_size):
            groups: Dict[Tuple[int, ...], List[Tuple[int, int, Tensor, SequenceContext]]] = {}
            for _, b, s in jobs[i:i + batch_size]:
                absent = where[b][~coalitions[b][s].cpu()]
                h, c = removed_row(adapter, hidden[b:b + 1], _row(context, b), absent)
                groups.setdefault(tuple(h.shape), []).append((b, s, h, c))
            for rows in groups.values():
                picked = torch.tensor([b for b, _, _, _ in rows], device=hidden.device)
                states = [h for _, _, h, _ in rows]
                short = _cat([c for _, _, _, c in rows], states)
                logits = adapter.head(adapter.run_blocks(torch.cat(states), short), short)
                out = explained_scores(logits, target[picked.to(target.device)], explain,
                                       None if foil is None else foil[picked.to(foil.device)])
                if not bool(out.isfinite().all()):
                    raise RuntimeError(f"mode='removal': {adapter.family} gives a non-finite output once features "
                                       "are removed; use mode='replacement'")
                for (b, s, _, _), value in zip(rows, out):
                    scores[b][s] = value
    return scores
