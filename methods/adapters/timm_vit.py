"""Adapter for stock ``timm.models.vision_transformer.VisionTransformer`` classifiers."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Hashable, Iterator, List, Optional, Tuple

from torch import Tensor, nn

from .base import AttentionLinears, ImageAdapter, ModelInputs, SequenceContext, register_adapter
from .recorder import ActivationRecorder

SUPPORTED_POOLS = ("token", "avg")


@register_adapter
class TimmViTAdapter(ImageAdapter):
    """Stock timm ``VisionTransformer``: pre-norm blocks ``x + attn(norm1(x))``, ``h + mlp(norm2(h))``, fused
    ``qkv`` projection; read-out ``"class_token"`` (``global_pool='token'``) or ``"mean_content"``
    (``global_pool='avg'``). Inputs (:class:`~methods.adapters.base.ImageAdapter`): images whose sides are
    multiples of the patch size. Layout: a patch grid after the prefix tokens ([CLS], registers)."""

    family = "timm VisionTransformer"
    pre_norm = True

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.blocks = list(model.blocks)
        self.num_prefix_tokens = int(model.num_prefix_tokens)
        self.patch_size = (int(model.patch_embed.patch_size[0]), int(model.patch_embed.patch_size[1]))
        self.readout = "class_token" if model.global_pool == "token" else "mean_content"

    @classmethod
    def supports(cls, model: nn.Module) -> Optional[str]:
        try:
            from timm.models.vision_transformer import VisionTransformer
        except ImportError:  # pragma: no cover - timm is a dependency
            return "timm is not installed"
        if not isinstance(model, VisionTransformer):
            return f"{type(model).__name__} is not a timm VisionTransformer"
        if model.global_pool not in SUPPORTED_POOLS:
            return (f"timm VisionTransformer with global_pool={model.global_pool!r} is not supported; supported "
                    f"read-outs: {', '.join(map(repr, SUPPORTED_POOLS))}")
        return None

    @classmethod
    def signature_of(cls, model: Any) -> tuple:
        return (model.global_pool, len(model.blocks), int(model.num_prefix_tokens))

    # ------------------------------------------------------------------ structure
    @property
    def num_heads(self) -> int:
        return int(self.blocks[0].attn.num_heads)

    @property
    def width(self) -> int:
        return int(self.model.embed_dim)

    @property
    def has_class_token(self) -> bool:
        m = self.model
        return bool(getattr(m, "has_class_token", m.cls_token is not None))

    def image_size_problem(self, size: Tuple[int, int]) -> Optional[str]:
        (ph, pw), (h, w) = self.patch_size, size
        return f"image size {size} is not a multiple of the patch size {ph}x{pw}" if h % ph or w % pw else None

    # ------------------------------------------------------------------ forward pieces (the model's own order)
    def embed(self, inputs: ModelInputs) -> Tensor:
        """Patch embedding, prefix tokens + positional embedding, patch drop, norm_pre."""
        m = self.model
        x = m.patch_embed(inputs["pixel_values"])
        x = m._pos_embed(x)
        x = m.patch_drop(x)
        return m.norm_pre(x)

    def run_blocks(self, hidden: Tensor, context: SequenceContext, start: int = 0,
                   stop: Optional[int] = None) -> Tensor:
        for block in self.blocks[start:stop]:
            hidden = block(hidden)
        return hidden

    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """Final norm, pooling, fc_norm and classifier: the model's own ``forward_head``."""
        m = self.model
        return m.forward_head(m.norm(hidden), pre_logits=pre_logits)

    # ------------------------------------------------------------------ where methods hook
    def record_attention(self, rec: ActivationRecorder, layer: int, key: Hashable, require_grad: bool = False,
                         transform: Optional[Callable[[Tensor], Tensor]] = None) -> None:
        rec.output(self.blocks[layer].attn.attn_drop, key, require_grad=require_grad, transform=transform)

    def record_values(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        dim = self.width
        rec.output(self.blocks[layer].attn.qkv, key, transform=lambda out: out[..., 2 * dim:3 * dim])

    def record_attention_input(self, rec: ActivationRecorder, layer: int, key: Hashable,
                               require_grad: bool = False) -> None:
        rec.output(self.blocks[layer].norm1, key, require_grad=require_grad)

    def attention_linears(self, layer: int) -> AttentionLinears:
        attn = self.blocks[layer].attn
        return AttentionLinears(out=attn.proj, qkv=attn.qkv)

    def mlp_linears(self, layer: int) -> Tuple[nn.Linear, nn.Linear]:
        mlp = self.blocks[layer].mlp
        return mlp.fc1, mlp.fc2

    # ------------------------------------------------------------------ relevance rules
    def input_embedding(self) -> nn.Module:
        return self.model.patch_embed

    def rule_problems(self) -> List[str]:
        """Gated MLPs (SwiGLU, GLU) and gated attention have no rule here: the uniform rule on their products is
        not applied."""
        problems = []
        for i, block in enumerate(self.blocks):
            mlp = getattr(block, "mlp", None)
            if mlp is not None and any(hasattr(mlp, name) for name in ("fc1_g", "fc1_x", "gate")):
                problems.append(f"block {i} gated mlp {type(mlp).__name__}")
            if getattr(getattr(block, "attn", None), "gate", None) is not None:
                problems.append(f"block {i} gated attention")
        return problems

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
