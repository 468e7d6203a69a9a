"""Adapter for stock ``timm.models.vision_transformer.VisionTransformer`` classifiers."""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Hashable, Iterable, Iterator, List, Optional, Tuple

import torch
from torch import Tensor, nn

from ...adapters.base import (
    AttentionEdit,
    AttentionLinears,
    BlockDecomposition,
    BlockLinears,
    Layout,
    ModelInputs,
    ReadOut,
    Recording,
    SequenceContext,
    TokenFlow,
    register_adapter,
)
from ...adapters.capability import Capability
from ...adapters.lens import LensImageAdapter
from ...adapters.library import class_problem
from ...adapters.recorder import ActivationRecorder
from ...adapters.value_edits import ProjectionValueEdit
from .rules import TimmBlocksRules, TimmViTRules
from .score_edit import score_edit_problem, timm_score_edit

SUPPORTED_POOLS = ("token", "avg", "map")
#: the read-out kind of each supported ``global_pool``
READOUT_OF_POOL = {"token": "class_token", "avg": "mean_content", "map": "attention_pool"}


@contextlib.contextmanager
def timm_fused_attention_off(modules: Iterable[nn.Module]) -> Iterator[None]:
    """timm's ``fused_attn`` flag off on ``modules`` (those that have it) for the block, then each restored."""
    switched: List[Any] = [m for m in modules if hasattr(m, "fused_attn")]
    before = [bool(m.fused_attn) for m in switched]
    for m in switched:
        m.fused_attn = False
    try:
        yield
    finally:
        for m, flag in zip(switched, before):
            m.fused_attn = flag


def has_class_token(model: Any) -> bool:
    """Whether a timm ViT has a class token (its ``has_class_token``; without one, its ``cls_token``)."""
    return bool(getattr(model, "has_class_token", model.cls_token is not None))


class TimmBlocksAdapter(LensImageAdapter):
    """What the adapters of timm's ViT-like models share (:class:`TimmViTAdapter`,
    :class:`~methods.families.timm_eva_beit.adapter.TimmBeitLikeAdapter`): the model's ``blocks`` (each ``attn`` with a
    fused ``qkv`` and ``proj``), ``num_prefix_tokens``, patch size and ``embed_dim``; the attention probabilities
    are ``attn.attn_drop``'s output (materialised with timm's fused attention off), the attention input is
    ``norm1``'s output; the input embedding is ``patch_embed``."""

    rule_map = Capability(TimmBlocksRules)

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.blocks = list(model.blocks)
        self.num_prefix_tokens = int(model.num_prefix_tokens)
        self.patch_size = (int(model.patch_embed.patch_size[0]), int(model.patch_embed.patch_size[1]))

    #: isotropic: ``embed_dim`` wide, block 0's heads
    token_flow = Capability(lambda adapter: TokenFlow(adapter, int(adapter.model.embed_dim),
                                                      int(adapter.blocks[0].attn.num_heads)))

    # ------------------------------------------------------------------ modules the LRP topologies read
    def classifier(self) -> Any:
        """The classification head ``head`` (an ``nn.Linear`` where LRP is defined)."""
        return self.model.head

    def final_norm(self) -> Any:
        """The norm after the last block, ``norm``."""
        return self.model.norm

    def patch_embedding(self) -> Any:
        """``patch_embed``, whose ``proj`` convolution makes the patch tokens."""
        return self.model.patch_embed

    def prefix_parameters(self) -> List[Tensor]:
        """The prefix token parameters before the patches, in the model's order: [CLS] and the registers (those
        the model has)."""
        m = self.model
        return [t for t in (m.cls_token, getattr(m, "reg_token", None)) if t is not None]

    def position_embedding(self) -> Tuple[Optional[Tensor], bool]:
        """``pos_embed`` (``None`` without one) and whether it leaves the prefix tokens out (``no_embed_class``)."""
        return getattr(self.model, "pos_embed", None), bool(getattr(self.model, "no_embed_class", False))

    @property
    def dynamic_image_size(self) -> bool:
        """Whether the model interpolates its positional embedding to each image size (``dynamic_img_size``)."""
        return bool(getattr(self.model, "dynamic_img_size", False))


@register_adapter
class TimmViTAdapter(TimmBlocksAdapter):
    """Stock timm ``VisionTransformer``: pre-norm blocks ``x + attn(norm1(x))``, ``h + mlp(norm2(h))`` (with
    layer scale where the model has it), fused ``qkv`` projection. Inputs
    (:class:`~methods.adapters.base.ImageAdapter`): images whose sides are multiples of the patch size.

    Layout: ``num_prefix_tokens`` prefix tokens (the class token if any, then the ``reg_tokens`` register tokens:
    DINOv2-reg) before the patch grid. Prefix tokens are never scored (a method's output is the patch columns),
    but they are positions of every token-to-token matrix: rollout and the relevance methods carry the attention
    to and through the registers, and a row normalisation (rollout's) runs over all ``N`` positions, registers
    included, so the patch scores of a row sum to less than one where attention rests on the registers.

    Read-out, by ``global_pool`` (what ``forward_head`` does after the final ``norm``): ``'token'`` (the [CLS]
    row), ``'avg'`` (the mean over the patch rows, ``fc_norm`` in the head) or ``'map'`` (the attention pool's
    head-mean attention, :meth:`readout_weights`); details in ``NOTES.md`` beside this file.
    """

    rule_map = Capability(TimmViTRules)

    family = "timm VisionTransformer"

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self._readout_cache: Optional[Tuple[weakref.ReferenceType, Tensor]] = None

    @classmethod
    def supports(cls, model: Any) -> Optional[str]:
        problem = class_problem(model, "timm.models.vision_transformer", "VisionTransformer")
        if problem is not None:
            return problem
        if model.global_pool not in SUPPORTED_POOLS:
            return (f"timm VisionTransformer with global_pool={model.global_pool!r} is not supported; supported "
                    f"read-outs: {', '.join(map(repr, SUPPORTED_POOLS))}")
        if model.global_pool == "avg" and getattr(model, "pool_include_prefix", False):
            return ("timm VisionTransformer with global_pool='avg' and pool_include_prefix=True (a mean over the "
                    "prefix tokens too) is not supported: the mean read-out is over the patch tokens")
        if model.global_pool == "map":
            return cls._attention_pool_problem(model.attn_pool)
        return None

    @staticmethod
    def _attention_pool_problem(pool: nn.Module) -> Optional[str]:
        """Why the attention pooling head ``pool`` is not supported (``None``: it is): timm's
        ``AttentionPoolLatent`` with one latent query and no positional embedding of its own."""
        from timm.layers import AttentionPoolLatent

        if not isinstance(pool, AttentionPoolLatent):
            return f"attention pooling head {type(pool).__name__} is not supported (supported: AttentionPoolLatent)"
        if pool.latent_len != 1 or pool.pos_embed is not None or pool.pool != "token":
            return (f"AttentionPoolLatent with latent_len={pool.latent_len}, pos_embed="
                    f"{'abs' if pool.pos_embed is not None else None}, pool_type={pool.pool!r} is not supported "
                    "(supported: one latent query, no positional embedding, pool_type='token')")
        return None

    @classmethod
    def signature_of(cls, model: Any) -> tuple:
        return (model.global_pool, len(model.blocks), int(model.num_prefix_tokens),
                bool(getattr(model, "pool_include_prefix", False)))

    # ------------------------------------------------------------------ structure
    #: ``global_pool``'s read-out; a class token where the model has one; ``map``: :meth:`readout_weights`
    readout: Capability[ReadOut] = Capability(lambda adapter: ReadOut(
        adapter, READOUT_OF_POOL[adapter.model.global_pool], has_class_token(adapter.model), adapter.readout_weights))

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

    # ------------------------------------------------------------------ attention pooling read-out
    def attention_pool(self) -> Any:
        """The ``map`` pooling head (timm's ``AttentionPoolLatent``), ``None`` for the other read-outs' models."""
        return getattr(self.model, "attn_pool", None)

    @property
    def pool_start(self) -> int:
        """The first position the pooling head reads: 0 with ``pool_include_prefix``, else the first patch."""
        return 0 if getattr(self.model, "pool_include_prefix", False) else self.num_prefix_tokens

    def pool_attention(self, inputs: ModelInputs) -> Tensor:
        """The attention of the ``map`` pooling head's query over the positions, per head: ``[B, H, N]`` (0 at
        the positions before :attr:`pool_start`). One forward without autograd; the probabilities are the eager
        form of the pool's attention, ``softmax(q_norm(q) * scale @ k_norm(k)^T)`` from its own ``q``, ``kv``,
        ``q_norm`` and ``k_norm`` (its fused form never materialises them)."""
        m = self.model
        pool = m.attn_pool
        with torch.no_grad():
            hidden = m.norm(self.run_blocks(self.embed(inputs), self.inputs.context(inputs)))
            tokens = hidden[:, self.pool_start:]
            batch, n, _ = tokens.shape
            heads, dim = pool.num_heads, pool.head_dim
            q = pool.q(pool.latent.expand(batch, -1, -1)).reshape(batch, 1, heads, dim).transpose(1, 2)
            k = pool.kv(tokens).reshape(batch, n, 2, heads, dim)[:, :, 0].transpose(1, 2)
            q, k = pool.q_norm(q), pool.k_norm(k)
            attn = (q * pool.scale @ k.transpose(-2, -1)).softmax(dim=-1)[:, :, 0]
            weights = attn.new_zeros(batch, heads, hidden.shape[1])
            weights[..., self.pool_start:] = attn
        return weights

    def readout_weights(self, inputs: ModelInputs, layout: Layout) -> Tensor:
        """The ``map`` pool's attention, mean over its heads: ``[B, N]`` (:meth:`pool_attention`), computed once
        per batch object (a method reads it for several matrices)."""
        cached = self._readout_cache
        if cached is not None and cached[0]() is inputs:
            return cached[1]
        weights = self.pool_attention(inputs).mean(dim=1)
        self._readout_cache = (weakref.ref(inputs), weights)
        return weights

    # ------------------------------------------------------------------ where methods hook
    recording = Capability(lambda adapter: TimmViTRecording(adapter))

    def linears(self, layer: int) -> BlockLinears:
        block = self.blocks[layer]
        return BlockLinears(AttentionLinears(out=block.attn.proj, qkv=block.attn.qkv), (block.mlp.fc1, block.mlp.fc2))


    decomposition = Capability(lambda adapter: TimmDecomposition(adapter)
                               if decomposition_problem(adapter.blocks) is None else None)


class TimmDecomposition(BlockDecomposition):
    """Every block timm's pre-norm ``Block`` (:func:`decomposition_problem`): ``norm1`` and ``norm2``, the layer
    scale ``ls1``."""

    def attention_output_scale(self, layer: int) -> Optional[Tensor]:
        """``ls1``'s ``gamma`` (a ``LayerScale``; ``None`` for the identity)."""
        return getattr(self.adapter.blocks[layer].ls1, "gamma", None)


def decomposition_problem(blocks: List[nn.Module]) -> Optional[str]:
    """Why ALTI's per-token decomposition does not reach the blocks (``None``: it does): each must be timm's
    pre-norm ``Block`` ``x + ls1(attn(norm1(x)))`` whose ``Attention`` has no norm (``scale_norm``) nor gate
    between the attention product and ``proj``, and whose ``ls1`` is a ``LayerScale`` or the identity."""
    from timm.layers import Attention, LayerScale
    from timm.models.vision_transformer import Block

    for layer, block in enumerate(blocks):
        if type(block) is not Block or type(block.attn) is not Attention:
            return f"block {layer} is a {type(block).__name__} with {type(block.attn).__name__}, not timm's Block"
        if not isinstance(block.attn.norm, nn.Identity) or getattr(block.attn, "gate", None) is not None:
            return f"block {layer}'s attention has a norm or a gate before its output projection"
        if not isinstance(block.ls1, (LayerScale, nn.Identity)):
            return f"block {layer}'s ls1 is a {type(block.ls1).__name__}"
    return None


class TimmScoreEdit(AttentionEdit):
    """timm's plain ``Attention``: the scores edited through hooks on each block's ``attn``."""

    @contextlib.contextmanager
    def __call__(self, edit: Callable[[int, Tensor], Tensor]) -> Iterator[None]:
        """Fused attention off and the scores edited through hooks on each block's ``attn``, ``q_norm`` and
        ``k_norm`` (:mod:`methods.families.timm_vit.score_edit`), all restored on exit."""
        with self.adapter.recording.eager_attention(), timm_score_edit(self.adapter.blocks, edit):
            yield


class TimmRecording(Recording):
    """Where methods hook in timm's ViT-like models: ``attn.attn_drop``'s output (materialised with timm's fused
    attention off), ``norm1``'s output."""

    def attention(self, rec: ActivationRecorder, layer: int, key: Hashable, require_grad: bool = False,
                  transform: Optional[Callable[[Tensor], Tensor]] = None) -> None:
        rec.output(self.adapter.blocks[layer].attn.attn_drop, key, require_grad=require_grad, transform=transform)

    def attention_input(self, rec: ActivationRecorder, layer: int, key: Hashable,
                        require_grad: bool = False) -> None:
        rec.output(self.adapter.blocks[layer].norm1, key, require_grad=require_grad)

    def eager_attention(self) -> contextlib.AbstractContextManager[None]:
        """Switch timm's fused attention off (it never materialises the attention matrix) and restore it."""
        return timm_fused_attention_off(block.attn for block in self.adapter.blocks)


class TimmViTRecording(TimmRecording):
    """timm ViT's values: the last third of the fused ``qkv``."""

    value_edit = Capability(lambda recording: ProjectionValueEdit(recording.adapter))
    score_edit = Capability(lambda recording: None if score_edit_problem(recording.adapter.blocks)
                            else TimmScoreEdit(recording.adapter))

    def values(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        dim = self.adapter.token_flow.width
        rec.output(self.adapter.blocks[layer].attn.qkv, key, transform=lambda out: out[..., 2 * dim:3 * dim])
