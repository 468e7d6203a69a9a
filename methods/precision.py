"""The precision a method computes in: ``accumulate_dtype``, an option of every method (``build_method(name,
accumulate_dtype=...)``), and the dtype of the maps it returns.

Why: a method run in a bf16 / fp16 model's dtype accumulates its products, compositions and sums (relevance passes,
CDAM's products, rollout's compositions, integrated-gradient sums) in 8 or 11 bits of mantissa; maps then move
(full LRP's token ranking against float32's: rank correlation 0.1 on SmolLM2 in bf16). And float32 itself loses
digits where a pass goes through every block down to the input: issue 36 measured full LRP on SmolLM2 (30 blocks)
between a batched row and the row alone at 1.4e-3 of the largest score in float32 and 4e-13 in float64 (the
epsilon rule's divisions amplify the forward's rounding); ``benchmarks/README.md`` has this codebase's numbers.

``accumulate_dtype``:

* ``None`` (``"auto"``; every method's default): at least float32, i.e. float32 for bf16 / fp16 models,
  the model's own dtype for float32 and float64 models (those run exactly as before);
* ``"float32"`` / ``"float64"``: at least that (a float64 model is never narrowed);
* ``"float64"`` is the setting for real (deep) LMs where a row's map must not depend on its batch: full ``lrp``
  (above) and the gradient baselines, whose float32 gradients on SmolLM2 differ between a left-padded row and the
  row alone by float32's rounding of the different shapes, amplified over 30 blocks (``input_x_gradient``
  1.25e-5 of the largest score, 0 in float64; ``benchmarks/README.md``); ``benchmarks/precision.py
  --accumulate-dtype float64`` and the slow SmolLM2 test use it. It is no method's default: it moves the results
  of float32 models (the default run's ``lrp`` AUCs by 0.7 points) and costs a float64 copy of the model per call.
* ``"model"``: the model's own dtype whatever it is (a bf16 model computes in bf16): the arithmetic before this
  option existed, faster and without the float32 copy, at the losses ``benchmarks/README.md`` measures (its
  precision table's "before" columns).

How: for the call the model's floating parameters and buffers are replaced by copies in the compute dtype, and the
floating input tensors cast likewise (:func:`computed_in`): the method's forward, backward and relevance passes all
run there, on the values the model holds (a bf16 weight is exactly representable in float32). The original tensors
are put back afterwards, untouched (no round trip). Cost: one copy of the model in the compute dtype per call.

Maps are returned in float32, float64 for float64 models (inputs) (:func:`result_dtype`).
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List, Literal, Optional, Tuple, Union

import torch
from torch import nn

#: ``accumulate_dtype="model"``: compute in the model's own dtype (module docstring)
MODEL_DTYPE: Literal["model"] = "model"
#: a parsed ``accumulate_dtype``: ``None`` (at least float32), a dtype, or :data:`MODEL_DTYPE`
Accumulate = Union[None, torch.dtype, Literal["model"]]
#: the accepted values of ``accumulate_dtype`` (``None`` and ``"auto"``: at least float32)
ACCUMULATE_DTYPES: Dict[str, Accumulate] = {"auto": None, "float32": torch.float32, "float64": torch.float64,
                                            MODEL_DTYPE: MODEL_DTYPE}


def parse_accumulate_dtype(value: Union[None, str, torch.dtype]) -> Accumulate:
    """``None`` (auto), the named dtype or :data:`MODEL_DTYPE`; an error naming the accepted values."""
    if value is None or isinstance(value, torch.dtype) and value in ACCUMULATE_DTYPES.values():
        return value
    if isinstance(value, str) and value in ACCUMULATE_DTYPES:
        return ACCUMULATE_DTYPES[value]
    raise ValueError(f"accumulate_dtype must be one of {sorted(ACCUMULATE_DTYPES)} or null (auto: at least "
                     f"float32), got {value!r}")


def model_dtype(model: nn.Module) -> Optional[torch.dtype]:
    """The dtype of the model's first floating parameter (``None`` without one)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


def compute_dtype(model: nn.Module, accumulate: Accumulate) -> Optional[torch.dtype]:
    """The dtype a call computes in (module docstring); ``None`` when that is the model's own."""
    own = model_dtype(model)
    if own is None or isinstance(accumulate, str):   # MODEL_DTYPE
        return None
    want = accumulate or torch.float32
    wider = want if torch.finfo(want).bits > torch.finfo(own).bits or own in (torch.bfloat16, torch.float16) else own
    return None if wider == own else wider


def result_dtype(score_dtype: torch.dtype) -> torch.dtype:
    """The dtype of a returned map: float64 for float64 models / inputs, else float32."""
    return torch.float64 if score_dtype == torch.float64 else torch.float32


@contextlib.contextmanager
def computed_in(model: nn.Module, dtype: Optional[torch.dtype]) -> Iterator[None]:
    """The model's floating parameters and buffers replaced by ``dtype`` copies for the block, the original tensors
    put back on exit and on error (``None``: nothing changes)."""
    if dtype is None:
        yield
        return
    saved: List[Tuple[nn.Module, str, str, torch.Tensor]] = []
    try:
        for module in model.modules():
            for kind in ("_parameters", "_buffers"):
                tensors: Dict[str, Optional[torch.Tensor]] = getattr(module, kind)
                for name, tensor in tensors.items():
                    if tensor is None or not tensor.is_floating_point() or tensor.dtype == dtype:
                        continue
                    saved.append((module, kind, name, tensor))
                    if kind == "_parameters":
                        tensors[name] = nn.Parameter(tensor.detach().to(dtype), requires_grad=tensor.requires_grad)
                    else:
                        tensors[name] = tensor.to(dtype)
        yield
    finally:
        for module, kind, name, tensor in reversed(saved):
            getattr(module, kind)[name] = tensor
