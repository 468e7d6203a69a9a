"""What the adapters of timm's BEiT-derived ViTs share (:mod:`.timm_eva`: ``Eva``; :mod:`.timm_beit`: ``Beit``).

Both families build pre-norm blocks ``x + gamma_1 * attn(norm1(x))``, ``h + gamma_2 * mlp(norm2(h))`` (layer scale
``gamma`` optional), an attention module that computes its fused ``q | k | v`` projection *functionally* when it
has biases (``F.linear(x, qkv.weight, cat(q_bias, k_bias, v_bias))``, the zero ``k_bias`` a buffer: the ``qkv``
module itself is never called), adds position information inside the attention logits (EVA-02's rotary
embedding of ``q`` and ``k``; BEiT's relative position bias) and reads out the [CLS] token
(``global_pool='token'``) or the mean of the patch tokens (``'avg'``, then ``fc_norm``).

Design notes: ``NOTES.md`` beside this file (adapter.py).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Hashable, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...adapters.base import (
    AttentionEdit,
    AttentionLinears,
    BlockDecomposition,
    BlockLinears,
    ImageInputs,
    ReadOut,
    SequenceContext,
)
from ...adapters.capability import Capability
from ...adapters.recorder import ActivationRecorder
from ...adapters.value_edits import edited_values_change, product_change
from ..timm_vit.adapter import TimmBlocksAdapter, TimmRecording
from .rules import TimmEvaBeitRules

SUPPORTED_POOLS = ("token", "avg")


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


class TimmBeitLikeAdapter(TimmBlocksAdapter):
    """Shared by :class:`~methods.families.timm_eva_beit.eva.TimmEvaAdapter` and
    :class:`~methods.families.timm_eva_beit.beit.TimmBeitAdapter` (see the module docstring). A subclass gives
    :meth:`embed`, :meth:`run_blocks` (with :meth:`key_mask_of`'s masks) and the family checks."""

    rule_map = Capability(TimmEvaBeitRules)
    inputs = Capability(lambda adapter: EvaBeitInputs(adapter))

    readout: Capability[ReadOut] = Capability(lambda adapter: ReadOut(
        adapter, "class_token" if adapter.model.global_pool == "token" else "mean_content"))

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
        :meth:`EvaBeitInputs.drop_positions` removed)."""
        mask = context.attention_mask
        if mask is None:
            return None
        return mask.to(device=hidden.device).bool()[:, None, None, :]

    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """Final norm, then the model's own ``forward_head`` (pooling, ``fc_norm``, ``head_drop``, ``head``); with
        removed positions (:meth:`EvaBeitInputs.drop_positions`) the average pooling is over the remaining patches."""
        m = self.model
        hidden = m.norm(hidden)
        mask = context.attention_mask
        if mask is None:
            return m.forward_head(hidden, pre_logits=pre_logits)
        if self.readout.kind == "class_token":
            pooled = hidden[:, 0]
        else:
            p = self.num_prefix_tokens
            keep = mask[:, p:, None].to(device=hidden.device, dtype=hidden.dtype)
            pooled = (hidden[:, p:] * keep).sum(dim=1) / keep.sum(dim=1)
        pooled = m.head_drop(m.fc_norm(pooled))
        return pooled if pre_logits else m.head(pooled)

    # ------------------------------------------------------------------ where methods hook
    def value_projection(self, layer: int, x: Tensor) -> Tensor:
        """The values ``[B, N, H * head_dim]`` (bias included) of block ``layer`` from its attention input."""
        attn = self.blocks[layer].attn
        width = attention_width(attn)
        return qkv_projection(attn, x)[..., 2 * width:3 * width]

    recording = Capability(lambda adapter: EvaBeitRecording(adapter))
    def linears(self, layer: int) -> BlockLinears:
        """The fused ``qkv`` and ``proj``; the MLP's ``fc1`` and ``fc2`` (timm ``SwiGLU``: ``fc1_x`` and ``fc2``, the
        gate ``fc1_g``; ``GluMlp``: the packed ``fc1`` whose halves are gate and input)."""
        attn, mlp = self.blocks[layer].attn, self.blocks[layer].mlp
        return BlockLinears(AttentionLinears(out=attn.proj, qkv=attn.qkv),
                            ((mlp.fc1_x if hasattr(mlp, "fc1_x") else mlp.fc1), mlp.fc2))

    #: an attention gate (``x * sigmoid(gate(x))`` before ``proj``) is not decomposed
    decomposition = Capability(lambda adapter: EvaBeitDecomposition(adapter) if all(
        getattr(block.attn, "gate", None) is None for block in adapter.blocks) else None)



class EvaBeitInputs(ImageInputs):
    """Images as every family's; a removed position becomes padding (the attention's position terms belong to the
    full grid)."""

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




class EvaBeitDecomposition(BlockDecomposition):
    """Pre-norm ``x + gamma_1 * proj(norm(A v))`` (``norm``: EVA-02's sub-LN or the identity), ``norm1``, ``norm2``."""

    def attention_output_scale(self, layer: int) -> Optional[Tensor]:
        """The layer scale ``gamma_1`` (``None`` without one)."""
        return self.adapter.blocks[layer].gamma_1

    def attention_output_norm(self, layer: int) -> Optional[Tuple[nn.Module, str]]:
        """EVA-02's sub-LN ``attn.norm`` on the merged heads before ``proj`` (``None``: the identity, BEiT)."""
        norm = getattr(self.adapter.blocks[layer].attn, "norm", None)
        return None if norm is None or isinstance(norm, nn.Identity) else (norm, "before_proj")


class EvaBeitValueEdit(AttentionEdit):
    """The values of EVA and BEiT, computed by a functional linear layer, edited through the attention product."""

    adapter: "TimmBeitLikeAdapter"

    @contextlib.contextmanager
    def __call__(self, edit: Callable[[int, Tensor], Tensor]) -> Iterator[None]:
        """The attention computes ``q``, ``k``, ``v`` with a functional linear layer, so no hook reaches the
        values: within eager attention (timm's fused attention off), each block's product ``A v`` entering the
        attention's ``norm`` (EVA's sub-LN or identity) or, in BEiT, its ``proj`` gets ``A (edit(v) - v)`` added
        (:func:`~methods.adapters.value_edits.product_change`: ``A`` from ``attn_drop``, ``v`` recomputed from
        the attention input by :meth:`value_projection`): the product with the edited values."""
        handles: List[Any] = []
        seen: Dict[int, Tensor] = {}

        def keep_input(layer: int) -> Callable[..., None]:
            def hook(_module: nn.Module, args: Tuple[Any, ...]) -> None:
                seen[layer] = args[0]
            return hook

        def keep_probabilities(layer: int) -> Callable[..., None]:
            def hook(_module: nn.Module, _args: Any, out: Tensor) -> None:
                change = edited_values_change(layer, edit, self.adapter.value_projection(layer, seen.pop(layer)),
                                              self.adapter.token_flow.heads)
                seen[-1 - layer] = product_change(out, change)
            return hook

        def correct(layer: int) -> Callable[..., Tuple[Any, ...]]:
            def hook(_module: nn.Module, args: Tuple[Any, ...]) -> Tuple[Any, ...]:
                return (args[0] + seen.pop(-1 - layer).to(args[0].dtype),) + tuple(args[1:])
            return hook

        with self.adapter.recording.eager_attention():
            try:
                for layer, block in enumerate(self.adapter.blocks):
                    attn = block.attn
                    handles.append(attn.register_forward_pre_hook(keep_input(layer)))
                    handles.append(attn.attn_drop.register_forward_hook(keep_probabilities(layer)))
                    merged = attn.norm if hasattr(attn, "norm") else attn.proj
                    handles.append(merged.register_forward_pre_hook(correct(layer)))
                yield
            finally:
                for handle in handles:
                    handle.remove()


class EvaBeitRecording(TimmRecording):
    """EVA's and BEiT's values, recomputed from the attention input."""

    adapter: "TimmBeitLikeAdapter"
    value_edit = Capability(lambda recording: EvaBeitValueEdit(recording.adapter))

    def values(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        rec.output(self.adapter.blocks[layer].norm1, key, transform=lambda x: self.adapter.value_projection(layer, x))
