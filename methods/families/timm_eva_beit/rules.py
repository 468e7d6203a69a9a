"""Where AttnLRP / CP-LRP place their rules in timm's Eva and Beit: their attention computes ``q``, ``k``, ``v``
with a functional linear layer and their GLU MLPs form the gate product inside one module, so the family places
the attention and gate rules itself (:meth:`TimmEvaBeitRules.product_rules`: gradient factors at the attention
products and the gate, as AttnLRP's Eq. 12 / the uniform rule); gated attention, other MLPs and norms other
than LayerNorm have no rule."""
from __future__ import annotations

import contextlib
from typing import Iterator, List, Optional, Tuple

import torch
from torch import nn

from ...adapters.base import MethodUndefinedError
from ...adapters.gradient_rules import input_gradient_scaled, output_gradient_scaled
from ..timm_vit.rules import TimmBlocksRules

#: the MLP classes of timm the blocks may hold, by name: the plain MLP and the two SwiGLU forms
MLP_CLASSES = ("Mlp", "SwiGLU", "GluMlp")


def is_activation_module(module: nn.Module) -> bool:
    """Whether ``module`` is an element-wise activation module of torch or timm (which :mod:`methods.attnlrp`
    gives the identity rule), not ``nn.GLU`` (which splits its input)."""
    return (type(module).__module__ in ("torch.nn.modules.activation", "timm.layers.activations")
            and not isinstance(module, (nn.GLU, nn.Softmax, nn.MultiheadAttention)))


class TimmEvaBeitRules(TimmBlocksRules):
    """The rule placement of :class:`~methods.families.timm_eva_beit.adapter.TimmBeitLikeAdapter` (Eva, Beit)."""

    def problems(self) -> List[str]:
        """Parts without a rule of :mod:`methods.attnlrp`: gated attention, MLPs other than timm's ``Mlp`` /
        ``SwiGLU`` / ``GluMlp``, GLU activations that are not activation modules, norms that are not LayerNorms
        (timm's ``RmsNorm``)."""
        problems = []
        for i, block in enumerate(self.adapter.blocks):
            if getattr(block.attn, "gate", None) is not None:
                problems.append(f"block {i} gated attention (sigmoid gate on the attention output)")
            mlp = block.mlp
            if type(mlp).__name__ not in MLP_CLASSES:
                problems.append(f"block {i} mlp {type(mlp).__name__}")
            elif type(mlp).__name__ != "Mlp" and not is_activation_module(mlp.act):
                problems.append(f"block {i} gated mlp activation {type(mlp.act).__name__}")
        for name, module in self.adapter.model.named_modules():
            if type(module).__name__.endswith("Norm") and not isinstance(module, nn.LayerNorm):
                problems.append(f"{name}: {type(module).__name__} (no relevance rule; LayerNorm only)")
        return problems

    def product_rules(self, attention: Tuple[float, float, float], gate: str,
                      gamma: Optional[float] = None) -> Optional[contextlib.AbstractContextManager[None]]:
        """The rules of the attention products and the gated MLPs, placed here (module docstring).
        The gamma rule cannot reach a fused ``qkv`` with biases (computed by ``F.linear``, its module never
        called): refused there."""
        adapter = self.adapter
        functional = [i for i, block in enumerate(adapter.blocks)
                      if getattr(block.attn, "qkv", None) is not None and block.attn.q_bias is not None]
        if gamma is not None and functional:
            raise MethodUndefinedError(
                f"the gamma rule (gamma={gamma}) is not defined on this {type(adapter.model).__name__} "
                f"({adapter.family}): "
                f"blocks {functional} compute their fused q/k/v projection with q_bias/v_bias by F.linear, not by "
                "the qkv module, so no hook can apply it (leave gamma=None)")
        q_factor, k_factor, v_factor = attention
        if q_factor != k_factor or v_factor == 0:
            raise ValueError(f"{adapter.family}: attention factors (q, k, v) = {attention} cannot be placed at the "
                             "attention products (q and k must share a factor, v must have one)")
        if gate not in ("uniform", "constant"):
            raise ValueError(f"gate rule must be 'uniform' or 'constant', got {gate!r}")
        return self._product_rules(v_factor, q_factor / v_factor, gate)

    @contextlib.contextmanager
    def _product_rules(self, product_factor: float, attention_factor: float, gate: str) -> Iterator[None]:
        handles = []
        with self.adapter.recording.eager_attention():
            try:
                for block in self.adapter.blocks:
                    attn, mlp = block.attn, block.mlp
                    if product_factor != 1:
                        handles.append(attn.proj.register_forward_pre_hook(input_gradient_scaled(product_factor)))
                    handles.append(attn.attn_drop.register_forward_hook(output_gradient_scaled(attention_factor)))
                    kind = type(mlp).__name__
                    if kind == "Mlp":
                        continue
                    if gate == "uniform":
                        handles.append(mlp.drop1.register_forward_pre_hook(input_gradient_scaled(0.5)))
                    elif kind == "SwiGLU":
                        handles.append(mlp.fc1_g.register_forward_hook(output_gradient_scaled(0.0)))
                    else:                      # GluMlp: the packed fc1's gate half held constant
                        half = mlp.fc1.out_features // 2
                        gate_first = not mlp.gate_last
                        factor = torch.tensor([0.0 if gate_first else 1.0] * half + [1.0 if gate_first else 0.0] * half)
                        handles.append(mlp.fc1.register_forward_hook(output_gradient_scaled(factor)))
                yield
            finally:
                for handle in handles:
                    handle.remove()
