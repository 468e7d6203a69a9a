"""A bridge to Captum: any supported model as a Captum forward function of its input at a named point.

``forward, x, extra = captum_forward(model, inputs, point="auto")`` gives

* ``forward(values, *extra)``: the model's logits ``[rows, C]`` with its values at ``point`` (the word-embedding
  output for text, decoders and CLIP / SigLIP text towers; the normalised pixels for images; see
  :mod:`methods.input_points`) replaced by ``values``;
* ``x``: the values of ``inputs`` there (``[B, ...]``), the ``inputs`` argument of a Captum method;
* ``extra``: the rest of the batch (ids, attention mask, read-out positions, ...) as a tuple of tensors, the
  ``additional_forward_args`` of a Captum method, which Captum expands along with ``x`` (repeated per step,
  per noise sample or per perturbation as each method does).

So ``captum.attr.IntegratedGradients(forward).attribute(x, target=t, additional_forward_args=extra)`` runs
Captum's own Integrated Gradients on the model (any other Captum method likewise); reduce the element-wise result
per token / patch with :func:`methods.input_points.reduce_scores` if wanted. The model is put in eval mode; run
the attribution inside :func:`torch.enable_grad` if gradients are off. Captum is not a dependency of the package:
this module only shapes the function. Not a registered method (Captum's batching of its sampling methods is not
batch-invariant: ``methods.smoothgrad`` and friends are).
"""
from __future__ import annotations

from typing import Callable, Tuple

from torch import Tensor, nn

from .adapters import RawInputs, adapter_for
from .input_points import logits_at, point_values, resolve_point


def captum_forward(model: nn.Module, inputs: RawInputs,
                   point: str = "auto") -> Tuple[Callable[..., Tensor], Tensor, Tuple[Tensor, ...]]:
    """``(forward, x, additional_forward_args)`` of ``model`` on ``inputs`` at ``point`` (module docstring)."""
    adapter = adapter_for(model)
    model.eval()
    batch = adapter.inputs.prepare(inputs)
    point = resolve_point(adapter, point, "captum_forward")
    names = tuple(batch.tensors)

    def forward(values: Tensor, *tensors: Tensor) -> Tensor:
        if len(tensors) != len(names):
            raise TypeError(f"captum_forward: expected the {len(names)} additional_forward_args {names}, got "
                            f"{len(tensors)}")
        rows = batch.with_tensors(**dict(zip(names, tensors)))
        return logits_at(adapter, rows, point, values)

    return forward, point_values(adapter, batch, point), tuple(batch.tensors[n] for n in names)
