"""Where the generic gradient baselines take their input ``x``: a named point of the model, and its gradients.

``point``:

* ``"embedding"``: the output of the adapter's :meth:`~methods.adapters.ModelAdapter.input_embedding` (text,
  decoders, CLIP / SigLIP text towers: the word embeddings, position and token-type embeddings keep their own
  share, as AttnLRP's ``level="tokens"`` and LXT's ``inputs_embeds``; images: the patch embedding output);
* ``"pixels"`` (images only): the normalised image;
* ``"auto"`` (default): ``"pixels"`` for images, ``"embedding"`` otherwise.

The values at the point are replaced by a forward hook on the input embedding (or by the pixel tensor itself), so
the model runs its own forward from there on (:func:`logits_at`). Scores per token / patch (:func:`reduce_scores`):
an element-wise map at the point is reduced over the width by the adapter's
:meth:`~methods.adapters.ModelAdapter.embedding_scores`; at the pixels it is summed over the channels and over the
pixels of each patch (the pixels' share of each patch token, as AttnLRP's ``level="patches"``), ``[B, P]`` in
row-major grid order. ``reduction``: ``"sum"`` (signed sum), ``"abs"`` (sum of absolute values), ``"l2"`` (the
Euclidean norm over the width, or over the channels and pixels of a patch).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Tuple

import torch
from torch import Tensor, nn

from .adapters import MethodUndefinedError, ModelAdapter, ModelInputs, PatchGrid

POINTS = ("auto", "embedding", "pixels")
REDUCTIONS = ("sum", "abs", "l2")


def check_choice(value: Any, choices: Tuple[str, ...], option: str, name: str) -> str:
    """``value`` if it is one of ``choices``, else ``ValueError`` naming the method and the option."""
    if value not in choices:
        raise ValueError(f"{name}: {option} must be one of {choices}, got {value!r}")
    return value


def resolve_point(adapter: ModelAdapter, point: str, name: str) -> str:
    """The concrete point (``"embedding"`` or ``"pixels"``) of ``point`` on ``adapter``'s model; ``ValueError``
    for pixels of a model that reads no image, :class:`MethodUndefinedError` for an adapter that names no input
    embedding."""
    check_choice(point, POINTS, "point", name)
    if point == "auto":
        point = "pixels" if adapter.inputs.layout_class.modality == "image" else "embedding"
    if point == "pixels" and adapter.inputs.layout_class.modality != "image":
        raise ValueError(f"{name}: point='pixels' needs an image model; {type(adapter.model).__name__} "
                         f"({adapter.family}) reads {adapter.inputs.layout_class.modality}")
    if point == "embedding":
        try:
            adapter.rule_map.input_embedding()
        except NotImplementedError as err:
            raise MethodUndefinedError(f"{name}: {err}") from None
    return point


@contextlib.contextmanager
def replaced_output(module: nn.Module, values: Tensor) -> Iterator[None]:
    """Within it, ``module`` returns ``values`` instead of its own output (same shape, checked)."""
    def hook(_module: nn.Module, _inputs: Tuple[Any, ...], output: Tensor) -> Tensor:
        if output.shape != values.shape:
            raise RuntimeError(f"the replaced input embedding has shape {tuple(values.shape)}, the model's "
                               f"{tuple(output.shape)}")
        return values
    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _run(adapter: ModelAdapter, inputs: ModelInputs) -> Tensor:
    context = adapter.inputs.context(inputs)
    return adapter.head(adapter.run_blocks(adapter.embed(inputs), context), context)


def point_values(adapter: ModelAdapter, inputs: ModelInputs, point: str) -> Tensor:
    """The values of ``inputs`` at ``point`` (detached): the pixels, or the input embedding's output."""
    if point == "pixels":
        return inputs["pixel_values"].detach()
    captured = {}

    def hook(_module: nn.Module, _inputs: Tuple[Any, ...], output: Tensor) -> None:
        captured["x"] = output.detach()
    handle = adapter.rule_map.input_embedding().register_forward_hook(hook)
    try:
        with torch.no_grad():
            adapter.embed(inputs)
    finally:
        handle.remove()
    return captured["x"]


def logits_at(adapter: ModelAdapter, inputs: ModelInputs, point: str, values: Tensor) -> Tensor:
    """The model's logits on ``inputs`` with the values at ``point`` replaced by ``values`` (one row per row of
    ``inputs``); differentiable w.r.t. ``values`` when it requires grad."""
    if point == "pixels":
        return _run(adapter, inputs.with_tensors(pixel_values=values))
    with replaced_output(adapter.rule_map.input_embedding(), values):
        return _run(adapter, inputs)


def repeat_inputs(inputs: ModelInputs, times: int) -> ModelInputs:
    """``times * B`` rows, copy-major (``[c0 s0, c0 s1, ..., c1 s0, ...]``): every tensor of ``inputs`` repeated."""
    if times == 1:
        return inputs
    repeated = {name: t.repeat((times,) + (1,) * (t.dim() - 1)) for name, t in inputs.tensors.items()}
    return inputs.with_tensors(torch.arange(inputs.batch_size).repeat(times), **repeated)


def select_rows(inputs: ModelInputs, rows: Tensor) -> ModelInputs:
    """The rows ``rows`` (``LongTensor``, repeats allowed) of every tensor of ``inputs`` (and of its embedding
    offset)."""
    return inputs.with_tensors(rows, **{name: t[rows.to(t.device)] for name, t in inputs.tensors.items()})


def reduce_scores(adapter: ModelAdapter, inputs: ModelInputs, point: str, values: Tensor,
                  reduction: str = "sum") -> Tensor:
    """An element-wise map ``values`` at ``point`` reduced to one score per token / patch (module docstring)."""
    transformed = values.abs() if reduction == "abs" else values * values if reduction == "l2" else values
    if point == "embedding":
        scores = adapter.rule_map.embedding_scores(transformed)
    else:
        pixels = transformed.sum(dim=1)
        layout = adapter.inputs.layout(inputs)
        assert isinstance(layout, PatchGrid)   # images (resolve_point)
        rows, cols = layout.grid
        batch, height, width = pixels.shape
        scores = pixels.reshape(batch, rows, height // rows, cols, width // cols).sum(dim=(2, 4)).flatten(1)
    return scores.sqrt() if reduction == "l2" else scores


def real_rows(adapter: ModelAdapter, inputs: ModelInputs, point: str) -> Optional[Tensor]:
    """For sequences at the embedding point: a bool ``[B, N]`` mask of the real (non-padded) positions of the
    input embedding's output, the positions a per-sample random draw fills in order; ``None`` for images."""
    layout = adapter.inputs.layout(inputs)
    if point == "pixels" or not layout.has_padding:
        return None
    return layout.real_positions(inputs[next(iter(inputs.tensors))]).bool()
