"""Pre-softmax attention-score edits in the Hugging Face families (the capability
``Recording.score_edit``).

Within :func:`score_edited_attention` the config whose ``_attn_implementation`` a model's (or tower's) layers read
is switched to :data:`SCORE_EDITED_ATTENTION`, registered through ``transformers.AttentionInterface`` (and, for the
masks the model builds, the eager masks through ``AttentionMaskInterface``): :func:`score_edited_attention_forward`.
For a module of an edited block it computes the block's scaled scores ``S = q k^T * scaling`` as the family's eager
attention does (key heads repeated for grouped-query attention, the family's soft-capping applied), asks the edit
for ``S'`` and calls the module's **own** ``eager_attention_forward`` with the additive mask ``M + (S' - S)``: the
family's scaling, softmax dtype, dropout and value product stay its own, and a column the edit returns unchanged
adds exactly 0 (the model's own attention there, bit for bit). No class or function of ``transformers`` is patched.
"""
from __future__ import annotations

import contextlib
import sys
import weakref
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .hf_implementation import attention_implementation

#: the attention implementation a config is switched to while the scores are edited
SCORE_EDITED_ATTENTION = "token_attributions_score_edit"

#: ``edit(layer, scores) -> scores`` on one block's ``[B, H, N, N]`` pre-softmax scores
ScoreEdit = Callable[[int, Tensor], Tensor]

#: an attention function as transformers calls it: ``(module, query, key, value, mask, **kwargs) -> (out, probs)``
Eager = Callable[..., Tuple[Tensor, Any]]
#: every submodule of the edited blocks: module -> (its block index, the edit, the eager attention to run, ``None``:
#: the module's own)
_ACTIVE: "weakref.WeakKeyDictionary[nn.Module, Tuple[int, ScoreEdit, Optional[Eager]]]" = weakref.WeakKeyDictionary()


def family_eager_attention(module: nn.Module) -> Callable[..., Tuple[Tensor, Tensor]]:
    """The ``eager_attention_forward`` of the python module that defines ``module``'s class."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise TypeError(f"{type(module).__module__} defines no eager_attention_forward to run "
                        f"{type(module).__name__}'s attention with")
    return eager


def eager_scores(query: Tensor, key: Tensor, scaling: Any = None, softcap: Any = None) -> Tensor:
    """``q k^T * scaling`` ``[B, H, N, N]`` as transformers' eager attention computes it (``scaling`` ``None``: the
    head dimension's ``-1/2`` power), key heads repeated to the query heads, then ``softcap * tanh(S / softcap)``
    where the family soft-caps."""
    groups = query.shape[1] // key.shape[1]
    keys = key.repeat_interleave(groups, dim=1) if groups > 1 else key
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, keys.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    return scores


def score_edited_attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                                   attention_mask: Any, **kwargs: Any) -> Tuple[Tensor, Any]:
    """The attention function registered as :data:`SCORE_EDITED_ATTENTION` (module docstring); a module outside
    an active :func:`score_edited_attention` runs its own eager attention unchanged."""
    entry = _ACTIVE.get(module)
    if entry is None:
        return family_eager_attention(module)(module, query, key, value, attention_mask, **kwargs)
    layer, edit, eager = entry
    eager = eager or family_eager_attention(module)
    scores = eager_scores(query, key, kwargs.get("scaling"), kwargs.get("softcap"))
    edited = edit(layer, scores)
    if edited.shape != scores.shape:
        raise RuntimeError(f"block {layer}: the score edit returned shape {tuple(edited.shape)} for scores of shape "
                           f"{tuple(scores.shape)}")
    delta = edited - scores
    mask = delta if attention_mask is None else attention_mask[:, :, :, :key.shape[-2]] + delta
    return eager(module, query, key, value, mask, **kwargs)


@contextlib.contextmanager
def score_edited_attention(config: Any, blocks: Sequence[nn.Module], edit: ScoreEdit,
                           eager: Optional[Eager] = None) -> Iterator[None]:
    """Within it, the attention of every block of ``blocks`` (whose layers read ``config._attn_implementation``)
    runs with its scores edited by ``edit(block index, scores)`` (module docstring) through ``eager`` (``None``:
    each module's own ``eager_attention_forward``; a family whose adapter materialises the attention with its own
    function passes that one); on exit the config's implementation is restored and the blocks released."""
    modules = {module: layer for layer, block in enumerate(blocks) for module in block.modules()}
    if any(module in _ACTIVE for module in modules):
        raise RuntimeError("attention_score_edit: these blocks' scores are already being edited (nested call)")
    for module, layer in modules.items():
        _ACTIVE[module] = (layer, edit, eager)
    try:
        with attention_implementation(config, SCORE_EDITED_ATTENTION, score_edited_attention_forward, True):
            yield
    finally:
        for module in modules:
            _ACTIVE.pop(module, None)
