"""Adapters: the few facts a method needs about a stock model family, read from its own modules.

An adapter never re-implements a model: it calls the model's own submodules in the order of the model's own
``forward`` (so results are bit-identical to ``model(x)``) and names where the tensors that methods hook live.
A new family (Hugging Face BERT, CLIP encoders) is a new adapter class registered in ``ADAPTERS``.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, List, Optional, Tuple

import torch
from torch import Tensor, nn

SUPPORTED_POOLS = ("token", "avg")


class TimmViTAdapter:
    """Stock ``timm.models.vision_transformer.VisionTransformer`` (pre-norm blocks; [CLS] or average pooling)."""

    family = "timm VisionTransformer"

    def __init__(self, model: nn.Module):
        from timm.models.vision_transformer import VisionTransformer

        if not isinstance(model, VisionTransformer):
            raise TypeError(f"{type(model).__name__} is not a timm VisionTransformer")
        if model.global_pool not in SUPPORTED_POOLS:
            raise TypeError(
                f"timm VisionTransformer with global_pool={model.global_pool!r} is not supported; "
                f"supported read-outs: {', '.join(map(repr, SUPPORTED_POOLS))}"
            )
        self.model = model
        self.blocks: List[nn.Module] = list(model.blocks)
        self.num_prefix_tokens: int = int(model.num_prefix_tokens)
        self.has_class_token: bool = bool(getattr(model, "has_class_token", model.cls_token is not None))
        self.patch_size: Tuple[int, int] = tuple(model.patch_embed.patch_size)
        self.global_pool: str = model.global_pool

    # ------------------------------------------------------------------ geometry
    @property
    def depth(self) -> int:
        return len(self.blocks)

    def grid_size(self, images: Tensor) -> Tuple[int, int]:
        return images.shape[-2] // self.patch_size[0], images.shape[-1] // self.patch_size[1]

    # ------------------------------------------------------------------ forward pieces (the model's own order)
    def embed(self, images: Tensor) -> Tensor:
        """Tokens entering block 0: patch embedding, prefix tokens + positional embedding, patch drop, norm_pre."""
        m = self.model
        x = m.patch_embed(images)
        x = m._pos_embed(x)
        x = m.patch_drop(x)
        return m.norm_pre(x)

    def run_blocks(self, tokens: Tensor, start: int = 0, stop: Optional[int] = None) -> Tensor:
        for block in self.blocks[start:stop]:
            tokens = block(tokens)
        return tokens

    def head(self, tokens: Tensor, pre_logits: bool = False) -> Tensor:
        """Final norm, pooling, fc_norm and classifier: the model's own ``forward_head``."""
        m = self.model
        return m.forward_head(m.norm(tokens), pre_logits=pre_logits)

    def forward(self, images: Tensor, grad_from_block: int = 0, pre_logits: bool = False) -> Tensor:
        """``model(images)``, with autograd recorded only from block ``grad_from_block`` on.

        Everything before that block runs under ``torch.no_grad()``: methods that need gradients only down to
        some block's attention pay for no graph below it.
        """
        with torch.no_grad():
            x = self.embed(images)
            x = self.run_blocks(x, 0, grad_from_block)
        with torch.enable_grad():
            x = self.run_blocks(x, grad_from_block)
            return self.head(x, pre_logits=pre_logits)

    # ------------------------------------------------------------------ where methods hook
    def attention_probs_module(self, layer: int) -> nn.Module:
        """Module whose output is block ``layer``'s post-softmax attention ``[B, H, N, N]`` (after dropout,
        identity in eval), the tensor the references hook."""
        return self.blocks[layer].attn.attn_drop

    def value_module(self, layer: int) -> nn.Module:
        """Module whose output holds q, k, v concatenated (``qkv``), bias included."""
        return self.blocks[layer].attn.qkv

    def attention_output_weight(self, layer: int) -> Tensor:
        return self.blocks[layer].attn.proj.weight

    def block(self, layer: int) -> nn.Module:
        return self.blocks[layer]

    def norm1(self, layer: int) -> nn.Module:
        return self.blocks[layer].norm1

    @property
    def embed_dim(self) -> int:
        return int(self.model.embed_dim)

    @property
    def num_heads(self) -> int:
        return int(self.blocks[0].attn.num_heads)

    @contextlib.contextmanager
    def eager_attention(self) -> Iterator[None]:
        """Switch timm's fused attention off (it never materialises the attention matrix) and restore it."""
        modules = [block.attn for block in self.blocks]
        before = [getattr(m, "fused_attn", False) for m in modules]
        for m in modules:
            if hasattr(m, "fused_attn"):
                m.fused_attn = False
        try:
            yield
        finally:
            for m, flag in zip(modules, before):
                if hasattr(m, "fused_attn"):
                    m.fused_attn = flag


ADAPTERS = [TimmViTAdapter]


def supported_families() -> str:
    return ", ".join(a.family for a in ADAPTERS)


def adapter_for(model: nn.Module, families=None):
    """The adapter for ``model``; ``TypeError`` naming the model class and the supported families otherwise."""
    candidates = ADAPTERS if families is None else families
    errors = []
    for adapter_cls in candidates:
        try:
            return adapter_cls(model)
        except TypeError as err:
            errors.append(str(err))
    raise TypeError(
        f"model class {type(model).__module__}.{type(model).__name__} is not supported; supported families: "
        f"{', '.join(a.family for a in candidates)} ({'; '.join(errors)})"
    )


class ActivationRecorder:
    """Forward hooks that keep module outputs (or inputs) during one forward, removed on exit.

    ``require_grad=True`` makes a recorded output (or input) a point autograd can differentiate to, even when
    the model's parameters are frozen and the input carries no gradient.
    """

    def __init__(self):
        self.outputs: dict = {}
        self._handles = []

    def output(self, module: nn.Module, key, require_grad: bool = False, transform=None) -> None:
        def hook(_module, _inputs, out):
            if require_grad and not out.requires_grad:
                out.requires_grad_(True)
            self.outputs[key] = out if transform is None else transform(out)

        self._handles.append(module.register_forward_hook(hook))

    def input(self, module: nn.Module, key, require_grad: bool = False) -> None:
        def hook(_module, inputs):
            x = inputs[0]
            if require_grad and not x.requires_grad:
                x = x.detach().requires_grad_(True)
                inputs = (x,) + tuple(inputs[1:])
            self.outputs[key] = x
            return inputs if require_grad else None

        self._handles.append(module.register_forward_pre_hook(hook))

    def __getitem__(self, key):
        return self.outputs[key]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> "ActivationRecorder":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()
