"""What the adapters of timm's BEiT-derived ViTs share (:mod:`.timm_eva`: ``Eva``; :mod:`.timm_beit`: ``Beit``).

Both families build pre-norm blocks ``x + gamma_1 * attn(norm1(x))``, ``h + gamma_2 * mlp(norm2(h))`` (layer scale
``gamma`` optional), an attention module that computes its fused ``q | k | v`` projection *functionally* when it
has biases (``F.linear(x, qkv.weight, cat(q_bias, k_bias, v_bias))``, the zero ``k_bias`` a buffer: the ``qkv``
module itself is never called), adds position information inside the attention logits (EVA-02's rotary
embedding of ``q`` and ``k``; BEiT's relative position bias) and reads out the [CLS] token
(``global_pool='token'``) or the mean of the patch tokens (``'avg'``, then ``fc_norm``).

Conventions (both families):

Design notes: ``NOTES.md`` beside this file (adapter.py).
"""
from __future__ import annotations

import contextlib
from typing import Any, Hashable, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...adapters.base import MethodUndefinedError, SequenceContext
from ...adapters.gradient_rules import scale_gradient
from ...adapters.recorder import ActivationRecorder
from ..timm_vit.adapter import TimmBlocksAdapter

SUPPORTED_POOLS = ("token", "avg")
#: the MLP classes of timm the blocks may hold, by name: the plain MLP and the two SwiGLU forms
MLP_CLASSES = ("Mlp", "SwiGLU", "GluMlp")


def qkv_projection(attn: Any, x: Tensor) -> Tensor:
    """The fused ``q | k | v`` projection ``[B, N, 3 * H * head_dim]`` of ``x``, computed as the attention
    module of EVA / BEiT computes it (bit for bit): ``qkv(x)`` without biases; with them ``F.linear`` on the
    concatenated ``q_bias, k_bias, v_bias`` (or the biases added after the product, ``qkv_bias_separate``). The
    ``qkv`` module's forward is not called (no hook of it fires, as in the model)."""
    if attn.q_bias is None:
        return F.linear(x, attn.qkv.weight, attn.qkv.bias)
    bias = torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))
    if getattr(attn, "qkv_bias_separate", False):
        out = F.linear(x, attn.qkv.weight, attn.qkv.bias)
        out += bias
        return out
    return F.linear(x, attn.qkv.weight, bias)


def qkv_bias(attn: Any) -> Optional[Tensor]:
    """The bias of the fused projection (``None`` without one)."""
    if attn.q_bias is None:
        return attn.qkv.bias
    return torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))


def attention_width(attn: Any) -> int:
    """``H * head_dim`` of an attention module."""
    return int(attn.num_heads) * int(attn.head_dim if hasattr(attn, "head_dim") else attn.proj.in_features
                                      // attn.num_heads)


def is_activation_module(module: nn.Module) -> bool:
    """Whether ``module`` is an element-wise activation module of torch or timm (which :mod:`methods.attnlrp`
    gives the identity rule), not ``nn.GLU`` (which splits its input)."""
    return (type(module).__module__ in ("torch.nn.modules.activation", "timm.layers.activations")
            and not isinstance(module, (nn.GLU, nn.Softmax, nn.MultiheadAttention)))


def _scale_output(factor: Any):
    def hook(_module: nn.Module, _inputs: Any, output: Tensor) -> Tensor:
        return scale_gradient(output, factor)
    return hook


def _scale_input(factor: Any):
    def hook(_module: nn.Module, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        return (scale_gradient(inputs[0], factor),) + tuple(inputs[1:])
    return hook


class TimmBeitLikeAdapter(TimmBlocksAdapter):
    """Shared by :class:`~methods.families.timm_eva_beit.eva.TimmEvaAdapter` and
    :class:`~methods.families.timm_eva_beit.beit.TimmBeitAdapter` (see the module docstring). A subclass gives
    :meth:`embed`, :meth:`run_blocks` (with :meth:`key_mask_of`'s masks) and the family checks."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.readout = "class_token" if model.global_pool == "token" else "mean_content"

    @classmethod
    def pool_problem(cls, model: Any) -> Optional[str]:
        if model.global_pool not in SUPPORTED_POOLS:
            return (f"{type(model).__name__} with global_pool={model.global_pool!r} is not supported; supported "
                    f"read-outs: {', '.join(map(repr, SUPPORTED_POOLS))}")
        if getattr(model, "attn_pool", None) is not None:
            return f"{type(model).__name__} with attention pooling (attn_pool) is not supported"
        return None

    @classmethod
    def signature_of(cls, model: Any) -> tuple:
        return (model.global_pool, len(model.blocks), int(model.num_prefix_tokens))

    # ------------------------------------------------------------------ structure
    def image_size_problem(self, size: Tuple[int, int]) -> Optional[str]:
        expected = tuple(int(s) for s in self.model.patch_embed.img_size)
        if tuple(size) != expected:
            return (f"image size {tuple(size)} differs from the model's img_size {expected} ({self.family}: the "
                    "position embeddings are built for that patch grid)")
        return None

    # ------------------------------------------------------------------ forward pieces
    def key_mask_of(self, context: SequenceContext, hidden: Tensor) -> Optional[Tensor]:
        """``None``, or bool ``[B, 1, 1, N]``: the keys every query may attend to (``False`` at the positions
        :meth:`drop_positions` removed)."""
        mask = context.attention_mask
        if mask is None:
            return None
        return mask.to(device=hidden.device).bool()[:, None, None, :]

    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """Final norm, then the model's own ``forward_head`` (pooling, ``fc_norm``, ``head_drop``, ``head``); with
        removed positions (:meth:`drop_positions`) the average pooling is over the remaining patches."""
        m = self.model
        hidden = m.norm(hidden)
        mask = context.attention_mask
        if mask is None:
            return m.forward_head(hidden, pre_logits=pre_logits)
        if self.readout == "class_token":
            pooled = hidden[:, 0]
        else:
            p = self.num_prefix_tokens
            keep = mask[:, p:, None].to(device=hidden.device, dtype=hidden.dtype)
            pooled = (hidden[:, p:] * keep).sum(dim=1) / keep.sum(dim=1)
        pooled = m.head_drop(m.fc_norm(pooled))
        return pooled if pre_logits else m.head(pooled)

    def drop_positions(self, hidden: Tensor, context: SequenceContext,
                       removed: Tensor) -> Tuple[Tensor, SequenceContext]:
        """``len(removed) * B`` sequences (sample-major), each with one position of ``removed`` turned into
        padding (masked as a key in every block, left out of the average pooling) rather than cut out: the
        position embeddings inside the attention logits belong to the full grid (see the module docstring)."""
        batch, n = hidden.shape[:2]
        r = len(removed)
        keep = torch.ones(batch, r, n, dtype=torch.long, device=hidden.device)
        keep[:, torch.arange(r, device=hidden.device), removed.to(hidden.device)] = 0
        if context.attention_mask is not None:
            keep = keep * context.attention_mask.to(hidden.device).long()[:, None, :]
        repeated = hidden[:, None].expand(batch, r, *hidden.shape[1:]).flatten(0, 1)
        return repeated, SequenceContext(attention_mask=keep.flatten(0, 1))

    # ------------------------------------------------------------------ where methods hook
    def value_projection(self, layer: int, x: Tensor) -> Tensor:
        """The values ``[B, N, H * head_dim]`` (bias included) of block ``layer`` from its attention input."""
        attn = self.blocks[layer].attn
        width = attention_width(attn)
        return qkv_projection(attn, x)[..., 2 * width:3 * width]

    def record_values(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        rec.output(self.blocks[layer].norm1, key, transform=lambda x: self.value_projection(layer, x))

    def mlp_linears(self, layer: int) -> Tuple[nn.Linear, nn.Linear]:
        """``fc1`` and ``fc2`` (timm ``SwiGLU``: ``fc1_x`` and ``fc2``, the gate ``fc1_g``; ``GluMlp``: the packed
        ``fc1`` whose halves are gate and input)."""
        mlp = self.blocks[layer].mlp
        return (mlp.fc1_x if hasattr(mlp, "fc1_x") else mlp.fc1), mlp.fc2

    # ------------------------------------------------------------------ relevance rules
    def rule_problems(self) -> List[str]:
        """Parts without a rule of :mod:`methods.attnlrp`: gated attention, MLPs other than timm's ``Mlp`` /
        ``SwiGLU`` / ``GluMlp``, GLU activations that are not activation modules, norms that are not LayerNorms
        (timm's ``RmsNorm``)."""
        problems = []
        for i, block in enumerate(self.blocks):
            if getattr(block.attn, "gate", None) is not None:
                problems.append(f"block {i} gated attention (sigmoid gate on the attention output)")
            mlp = block.mlp
            if type(mlp).__name__ not in MLP_CLASSES:
                problems.append(f"block {i} mlp {type(mlp).__name__}")
            elif type(mlp).__name__ != "Mlp" and not is_activation_module(mlp.act):
                problems.append(f"block {i} gated mlp activation {type(mlp.act).__name__}")
        for name, module in self.model.named_modules():
            if type(module).__name__.endswith("Norm") and not isinstance(module, nn.LayerNorm):
                problems.append(f"{name}: {type(module).__name__} (no relevance rule; LayerNorm only)")
        return problems

    def product_rules(self, attention: Tuple[float, float, float], gate: str,
                      gamma: Optional[float] = None) -> Optional[contextlib.AbstractContextManager[None]]:
        """The rules of the attention products and the gated MLPs, placed by this adapter (module docstring).
        The gamma rule cannot reach a fused ``qkv`` with biases (computed by ``F.linear``, its module never
        called): refused there."""
        functional = [i for i, block in enumerate(self.blocks)
                      if getattr(block.attn, "qkv", None) is not None and block.attn.q_bias is not None]
        if gamma is not None and functional:
            raise MethodUndefinedError(
                f"the gamma rule (gamma={gamma}) is not defined on this {type(self.model).__name__} ({self.family}): "
                f"blocks {functional} compute their fused q/k/v projection with q_bias/v_bias by F.linear, not by "
                "the qkv module, so no hook can apply it (leave gamma=None)")
        q_factor, k_factor, v_factor = attention
        if q_factor != k_factor or v_factor == 0:
            raise ValueError(f"{self.family}: attention factors (q, k, v) = {attention} cannot be placed at the "
                             "attention products (q and k must share a factor, v must have one)")
        if gate not in ("uniform", "constant"):
            raise ValueError(f"gate rule must be 'uniform' or 'constant', got {gate!r}")
        return self._product_rules(v_factor, q_factor / v_factor, gate)

    @contextlib.contextmanager
    def _product_rules(self, product_factor: float, attention_factor: float, gate: str) -> Iterator[None]:
        handles = []
        with self.eager_attention():
            try:
                for block in self.blocks:
                    attn, mlp = block.attn, block.mlp
                    if product_factor != 1:
                        handles.append(attn.proj.register_forward_pre_hook(_scale_input(product_factor)))
                    handles.append(attn.attn_drop.register_forward_hook(_scale_output(attention_factor)))
                    kind = type(mlp).__name__
                    if kind == "Mlp":
                        continue
                    if gate == "uniform":
                        handles.append(mlp.drop1.register_forward_pre_hook(_scale_input(0.5)))
                    elif kind == "SwiGLU":
                        handles.append(mlp.fc1_g.register_forward_hook(_scale_output(0.0)))
                    else:                      # GluMlp: the packed fc1's gate half held constant
                        half = mlp.fc1.out_features // 2
                        gate_first = not mlp.gate_last
                        factor = torch.tensor([0.0 if gate_first else 1.0] * half + [1.0 if gate_first else 0.0] * half)
                        handles.append(mlp.fc1.register_forward_hook(_scale_output(factor)))
                yield
            finally:
                for handle in handles:
                    handle.remove()
