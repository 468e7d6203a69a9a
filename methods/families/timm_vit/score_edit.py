"""Pre-softmax attention-score edits in timm's ``Attention`` (the capability ``Recording.score_edit``).

timm's eager attention computes ``S = (q_norm(q) * scale) @ k_norm(k)^T``, adds the ``attn_mask`` the block passes
(a float mask is added as it is) and takes the softmax, with no module in between. Within :func:`timm_score_edit`
(the adapter switches fused attention off) three hooks per block, all removed on exit, do the edit: a forward
pre-hook on ``attn`` hands it a zero ``[B, H, N, N]`` float mask, a hook on ``q_norm`` keeps ``q``, and a hook on
``k_norm`` (which runs after it and before the mask is added) computes ``S`` with timm's own operations and writes
``edit(layer, S) - S`` into that mask. So the softmax sees ``edit(layer, S)`` (a column the edit returns unchanged
adds exactly 0) and nothing of timm is patched.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Sequence, Tuple

from torch import Tensor, nn

#: ``edit(layer, scores) -> scores`` on one block's ``[B, H, N, N]`` pre-softmax scores
ScoreEdit = Callable[[int, Tensor], Tensor]


def score_edit_problem(blocks: Sequence[Any]) -> List[str]:
    """The blocks whose attention is not timm's plain ``Attention`` (``q_norm`` / ``k_norm`` then the mask)."""
    from timm.models.vision_transformer import Attention

    return [f"block {i} attention {type(block.attn).__name__}" for i, block in enumerate(blocks)
            if type(block.attn) is not Attention]


def _hooks(attn: Any, layer: int, edit: ScoreEdit) -> List[Any]:
    state: Dict[str, Tensor] = {}

    def give_mask(_module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Any, Dict[str, Any]]:
        if kwargs.get("attn_mask") is not None or kwargs.get("is_causal"):
            raise RuntimeError(f"block {layer}: the score edit needs an attention without a mask of its own")
        x = args[0]
        state["mask"] = x.new_zeros(x.shape[0], attn.num_heads, x.shape[1], x.shape[1])
        return args, {**kwargs, "attn_mask": state["mask"]}

    def keep_q(_module: nn.Module, _args: Tuple[Any, ...], q: Tensor) -> None:
        state["q"] = q

    def edit_scores(_module: nn.Module, _args: Tuple[Any, ...], k: Tensor) -> None:
        scores = (state.pop("q") * attn.scale) @ k.transpose(-2, -1)
        edited = edit(layer, scores)
        if edited.shape != scores.shape:
            raise RuntimeError(f"block {layer}: the score edit returned shape {tuple(edited.shape)} for scores of "
                               f"shape {tuple(scores.shape)}")
        state.pop("mask").copy_(edited - scores)

    return [attn.register_forward_pre_hook(give_mask, with_kwargs=True),
            attn.q_norm.register_forward_hook(keep_q), attn.k_norm.register_forward_hook(edit_scores)]


@contextlib.contextmanager
def timm_score_edit(blocks: Sequence[Any], edit: ScoreEdit) -> Iterator[None]:
    """Within it, every block of ``blocks`` attends with ``softmax(edit(block index, S))`` (module docstring)."""
    problems = score_edit_problem(blocks)
    if problems:
        raise NotImplementedError(f"no score edit for timm attention other than Attention: {', '.join(problems)}")
    handles: List[Any] = []
    try:
        for layer, block in enumerate(blocks):
            handles += _hooks(block.attn, layer, edit)
        yield
    finally:
        for handle in handles:
            handle.remove()
