"""Forward hooks that keep chosen activations of one forward pass."""
from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

from torch import Tensor, nn


class ActivationRecorder:
    """Forward hooks that keep module outputs (or inputs) during one forward, removed on exit.

    ``require_grad=True`` makes a recorded output (or input) a point autograd can differentiate to, even when
    the model's parameters are frozen and the input carries no gradient. ``transform`` is applied to what is
    kept (e.g. a head mean, or the value slice of a fused projection); the model itself sees the untransformed
    tensor.
    """

    def __init__(self) -> None:
        self.outputs: Dict[Hashable, Any] = {}
        self._handles: List[Any] = []

    def output(self, module: nn.Module, key: Hashable, require_grad: bool = False,
               transform: Optional[Callable[[Tensor], Tensor]] = None, index: Optional[int] = None) -> None:
        """Keep ``module``'s output (element ``index`` of a tuple output when given). With ``index``, the kept
        tensor has already been used by the module, so ``require_grad`` cannot make it a point to differentiate
        to: it must already be part of the autograd graph (``RuntimeError`` otherwise)."""
        def hook(_module: nn.Module, _inputs: Any, out: Any) -> None:
            if index is not None:
                out = out[index]
                if require_grad and not out.requires_grad:
                    raise RuntimeError(f"recorded output {key!r} of {type(_module).__name__} is not differentiable: "
                                       "autograd must be recorded from an earlier point of the forward")
            elif require_grad and not out.requires_grad:
                out.requires_grad_(True)
            self.outputs[key] = out if transform is None else transform(out)

        self._handles.append(module.register_forward_hook(hook))

    def input(self, module: nn.Module, key: Hashable, require_grad: bool = False) -> None:
        def hook(_module: nn.Module, inputs: Tuple[Any, ...]) -> Optional[Tuple[Any, ...]]:
            x = inputs[0]
            if require_grad and not x.requires_grad:
                x = x.detach().requires_grad_(True)
                inputs = (x,) + tuple(inputs[1:])
            self.outputs[key] = x
            return inputs if require_grad else None

        self._handles.append(module.register_forward_pre_hook(hook))

    def __getitem__(self, key: Hashable) -> Any:
        return self.outputs[key]

    def __contains__(self, key: Hashable) -> bool:
        return key in self.outputs

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> "ActivationRecorder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
