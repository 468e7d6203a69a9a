"""A per-row shift of a model's input embedding that travels with the rows (``ModelInputs.embedding_offset``).

The offset ``[B, N, D]`` belongs to the rows of a :class:`~methods.adapters.ModelInputs` (``method(...,
embedding_offset=...)``): row ``b`` shifts the output of the adapter's input embedding (``rule_map.input_embedding()``:
the word embeddings of a text, before the position and token-type shares) for row ``b``. The row helpers
(``ModelInputs.with_tensors(rows=...)``, ``scaled_copies``, ``methods.input_points.select_rows`` / ``repeat_inputs``)
take each new row's offset from the row it stems from, and every family's ``embed`` adds it (:func:`offset_added`,
wrapped by ``ModelAdapter.__init_subclass__`` around the ``embed`` each adapter class resolves, its own or a
mixin's): whatever forwards a method runs, regrouped or repeated, they see the offset of their rows and nothing
else. A row a method builds from scratch (the all-``[PAD]`` ids of a baseline,
``methods.input_baselines.baseline_inputs``; a zero embedding) has no offset by construction: it is not a row of
the inputs. Images: the input embedding is the patch embedding; ``interpolate`` of the image families does not
carry an offset (refused by ``with_tensors``), and no caller shifts images this way (their pixels are perturbed).

The hook is registered first (``prepend``): the hooks a method puts on the input embedding (a recorder, the
replaced output of ``methods.input_points.logits_at``, whose values the method read from the shifted embedding)
see or replace the shifted output. The sum is made in **float64** and rounded once to the embedding's dtype, so
the shifted embedding is ``round(e + offset)`` whatever the offset's dtype: the very values the robustness test's
forwards from the embedding compute (``(e.double() - noise).to(dtype)``), not a float32 offset rounded before
and after the addition.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import replace
from typing import Any, Callable, Iterator, Set, Tuple, TypeVar, cast

import torch
from torch import Tensor, nn

Embed = TypeVar("Embed", bound=Callable[..., Tensor])
#: the ``embed`` functions :func:`offset_added` made (an adapter class whose ``embed`` is one adds the offset)
_ADDING: Set[Callable[..., Tensor]] = set()


def check_embedding_offset(offset: Any, batch_size: int, positions: int) -> Tensor:
    """``offset`` if it is a floating ``[batch_size, positions, D]`` tensor, else ``ValueError`` naming the
    problem."""
    if not isinstance(offset, Tensor) or not offset.dtype.is_floating_point or offset.dim() != 3:
        kind = f"{offset.dtype} {tuple(offset.shape)}" if isinstance(offset, Tensor) else type(offset).__name__
        raise ValueError(f"embedding_offset must be a floating tensor [B, N, D] (one shift per row, position and "
                         f"embedding coordinate), got {kind}")
    if tuple(offset.shape[:2]) != (batch_size, positions):
        raise ValueError(f"embedding_offset has shape {tuple(offset.shape)} but the batch has {batch_size} rows of "
                         f"{positions} positions ([B, N, D] expected)")
    return offset.detach()


@contextlib.contextmanager
def added_output(module: nn.Module, offset: Tensor) -> Iterator[None]:
    """Within it, ``module`` returns ``round(output + offset)`` (float64 sum, module docstring); the shapes must
    agree."""
    def hook(_module: nn.Module, _inputs: Tuple[Any, ...], output: Tensor) -> Tensor:
        if not isinstance(output, Tensor) or tuple(output.shape) != tuple(offset.shape):
            shape = tuple(output.shape) if isinstance(output, Tensor) else type(output).__name__
            raise ValueError(f"embedding offset: the input embedding {type(_module).__name__} returned {shape} for "
                             f"rows whose offset is {tuple(offset.shape)}")
        return (output.to(torch.float64) + offset.to(device=output.device, dtype=torch.float64)).to(output.dtype)

    handle = module.register_forward_hook(hook, prepend=True)
    try:
        yield
    finally:
        handle.remove()


def offset_added(embed: Embed) -> Embed:
    """An adapter's ``embed(inputs)`` that adds ``inputs.embedding_offset`` to its input embedding's output (the
    inner call gets the inputs without it, so an ``embed`` that calls its base class's adds it once); ``embed``
    itself if it already does."""
    if embed in _ADDING:
        return embed

    @functools.wraps(embed)
    def embed_with_offset(adapter: Any, inputs: Any) -> Tensor:
        offset = inputs.embedding_offset
        if offset is None:
            return embed(adapter, inputs)
        with added_output(adapter.rule_map.input_embedding(), offset):
            return embed(adapter, replace(inputs, embedding_offset=None))

    _ADDING.add(embed_with_offset)
    return cast(Embed, embed_with_offset)
