"""Token removal by a zeroed input embedding (AttnLRP's faithfulness recipe, Achtibat et al. 2024, as its authors
describe it in LXT#40: the removed tokens' input embeddings are set to 0, the sequence keeps its length and its
attention mask).

:class:`ZeroEmbeddingPerturber` marks a removed token by a negative input id (``-1``) instead of changing the token;
:func:`zeroed_embeddings` is the context in which the model's input embedding layer (``get_input_embeddings()``,
the word embeddings before position and type embeddings are added) reads a marked id as id 0 and outputs a zero
vector there. Any model with ``get_input_embeddings()`` (Hugging Face encoders, decoder LMs, CLIP's text tower)
and any classifier of this package run unchanged inside it.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Mapping

from torch import Tensor, nn

from .perturbers import TokenPerturber

#: the input id that marks a removed token
REMOVED_ID = -1


class ZeroEmbeddingPerturber(TokenPerturber):
    """Removed tokens keep their position and attention; their input id becomes :data:`REMOVED_ID`, read as a zero
    embedding inside :func:`zeroed_embeddings` (options as :class:`~evaluation.perturbers.TokenPerturber`)."""

    def __init__(self, fraction_of: str = "real", remove_special_tokens: bool = False, clamp: bool = False) -> None:
        super().__init__("pad", fraction_of, remove_special_tokens, clamp)
        self.removal = self.name = "zero_embedding"

    def perturb(self, batch: Mapping[str, Any], removed: Tensor, classifier: Any) -> Dict[str, Tensor]:
        ids = self._tensor(batch, "input_ids")
        steps = removed.shape[0]
        removed = removed & self.removable(batch)[None]
        out = {k: batch[k][None].expand(steps, *ids.shape) for k in ("input_ids", "token_type_ids")
               if isinstance(batch.get(k), Tensor)}
        out["input_ids"] = out["input_ids"].masked_fill(removed, REMOVED_ID)
        out["attention_mask"] = self._real(batch)[None].expand(steps, *ids.shape).long()
        return {k: v.reshape(-1, ids.shape[1]) for k, v in out.items()}


@contextlib.contextmanager
def zeroed_embeddings(model: nn.Module) -> Iterator[None]:
    """Within the context, ``model``'s input embedding layer outputs 0 at the ids :data:`REMOVED_ID`."""
    getter = getattr(model, "get_input_embeddings", None)
    layer = getter() if callable(getter) else None
    if not isinstance(layer, nn.Module):
        raise ValueError(f"zeroed embeddings need a model with get_input_embeddings(); {type(model).__name__} has "
                         "none")
    marks: list = []

    def before(module: nn.Module, args: tuple) -> tuple:
        ids = args[0]
        marks.append(ids == REMOVED_ID)
        return (ids.clamp(min=0),) + tuple(args[1:])

    def after(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        marked = marks.pop()
        return output.masked_fill(marked[..., None].to(output.device), 0.0) if bool(marked.any()) else output

    handles = [layer.register_forward_pre_hook(before), layer.register_forward_hook(after)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
