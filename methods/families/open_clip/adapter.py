"""Adapters for the two towers of a stock ``open_clip.model.CLIP`` (open_clip's own ``VisionTransformer`` and text
transformer, blocks ``ResidualAttentionBlock`` on ``nn.MultiheadAttention``).

Like :mod:`methods.families.hf_clip`, a method explains one tower through a *scorer* that holds the CLIP and turns
the tower's embedding into logits against fixed embeddings of the other modality (``models.clip.
ZeroShotClassifier``: images -> classes; ``models.clip.PromptScorer``: texts -> images). The protocol: ``model.clip``
(an ``open_clip.model.CLIP``), ``model.clip_tower`` (``"vision"`` / ``"text"``) and
``model.logits_from_embeddings(z)`` (``logit_scale.exp() * cos(z, e_c)``, ``+ logit_bias`` when the CLIP has one).

Design notes: ``NOTES.md`` beside this file (adapter.py).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Hashable, Iterator, Mapping, Optional, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ...adapters.base import (
    AttentionEdit,
    AttentionLinears,
    BlockDecomposition,
    BlockLinears,
    ModelAdapter,
    ModelInputs,
    RawInputs,
    ReadOut,
    Recording,
    SampleIds,
    SequenceContext,
    TokenFlow,
    TokenSequence,
    ValueRecorder,
    check_sample_ids,
    register_adapter,
)
from ...adapters.capability import Capability
from ...adapters.lens import LensImageAdapter
from ...adapters.recorder import ActivationRecorder
from ...adapters.tokens import check_token_inputs
from ...adapters.value_edits import edited_values_change, product_change
from ..hf_clip.adapter import (
    READOUT_POSITIONS,
    TOKEN_EMBEDDING_SCALE,
    ScaledTokenInputs,
    _ScaledTokenText,
    _ScorerHead,
    at_readout_positions,
    scorer_problem,
)
from .rules import OpenCLIPTextRules, OpenCLIPVisionRules
from .score_edit import open_clip_score_edit

#: the vision pooling types (``VisionTransformer.pool_type``) -> read-out
VISION_POOLS = {"tok": "class_token", "avg": "mean_content"}
#: the text pooling types (``CLIP.text_pool_type``) read at one per-sample position
TEXT_POOLS = ("argmax", "eos")


def _open_clip_classes() -> Optional[Tuple[Any, Any, Any]]:
    """``(CLIP, VisionTransformer, ResidualAttentionBlock)`` of open_clip, or ``None`` without open_clip."""
    try:
        from open_clip.model import CLIP
        from open_clip.transformer import ResidualAttentionBlock, VisionTransformer
    except ImportError:  # pragma: no cover - an optional dependency
        return None
    return CLIP, VisionTransformer, ResidualAttentionBlock


def _blocks_problem(transformer: Any, block_class: Any) -> Optional[str]:
    """Why the blocks of an open_clip ``Transformer`` are not the stock pre-norm ``nn.MultiheadAttention`` blocks
    this adapter runs (``None``: they are)."""
    if not getattr(transformer, "batch_first", True):
        return "a transformer with batch_first=False"
    block: Any
    for i, block in enumerate(transformer.resblocks):
        if type(block) is not block_class:
            return (f"block {i} is {type(block).__name__} (open_clip's custom blocks, q/k norm or scaled cosine "
                    "attention, are not supported; need ResidualAttentionBlock)")
        attn = block.attn
        if not isinstance(attn, nn.MultiheadAttention) or not attn._qkv_same_embed_dim or attn.in_proj_bias is None:
            return f"block {i} attention is not a self-attention nn.MultiheadAttention with a packed, biased in_proj"
        if attn.bias_k is not None or attn.add_zero_attn or hasattr(block, "ln_1_kv"):
            return f"block {i} attention has extra key/value tokens or cross-attention"
    return None


def _value_projection(attn: nn.MultiheadAttention, x: Tensor) -> Tensor:
    """The value projection ``[B, N, D]`` (heads merged, bias included) of ``x`` by the module's packed
    ``in_proj_weight`` (its last third)."""
    dim = attn.embed_dim
    bias = attn.in_proj_bias
    return F.linear(x, attn.in_proj_weight[2 * dim:], None if bias is None else bias[2 * dim:])


class _AttentionGradient(torch.autograd.Function):
    """``out`` (an ``nn.MultiheadAttention`` output ``[B, N, D]``) unchanged, joined to its probabilities ``A``
    ``[B, H, N, N]`` (a leaf): backward passes ``out``'s gradient on and gives ``A`` the gradient of ``A v``
    through the output projection, ``dL/dA_h = (dL/dout W_out)_h v_h^T``."""

    @staticmethod
    def forward(ctx: Any, out: Tensor, probabilities: Tensor, values: Tensor, out_weight: Tensor) -> Tensor:
        ctx.save_for_backward(values, out_weight)
        ctx.heads = int(probabilities.shape[1])
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        values, out_weight = ctx.saved_tensors
        batch, tokens, dim = grad.shape
        heads = ctx.heads
        grad_ctx = (grad @ out_weight.to(grad.dtype)).reshape(batch, tokens, heads, dim // heads).transpose(1, 2)
        v = values.to(grad.dtype).reshape(batch, values.shape[1], heads, dim // heads).transpose(1, 2)
        return grad, grad_ctx @ v.transpose(-2, -1), None, None


def _need_weights(_module: nn.Module, args: Tuple[Any, ...], kwargs: dict) -> Tuple[Tuple[Any, ...], dict]:
    """Forward pre-hook: the attention module returns its per-head probabilities."""
    return args, {**kwargs, "need_weights": True, "average_attn_weights": False}


class OpenCLIPDecomposition(BlockDecomposition):
    """Pre-norm ``x + ls_1(out_proj(attention(ln_1(x))))``, then ``ln_2``."""

    norm_names = ("ln_1", "ln_2")

    def attention_output_scale(self, layer: int) -> Optional[Tensor]:
        """``ls_1``'s ``gamma`` (``None`` for the identity)."""
        return getattr(self.adapter.blocks[layer].ls_1, "gamma", None)


class _OpenCLIPTower(_ScorerHead, ModelAdapter):
    """Shared machinery of the two open_clip towers (see the module docstring); a subclass names its tower."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.clip: Any = model.clip
        self.transformer = self.transformer_of(self.clip)
        self.blocks = list(self.transformer.resblocks)

    @classmethod
    def transformer_of(cls, clip: Any) -> Any:
        return clip.visual.transformer if cls.tower == "vision" else clip.transformer

    @classmethod
    def supports(cls, model: nn.Module) -> Optional[str]:
        classes = _open_clip_classes()
        if classes is None:  # pragma: no cover
            return "open_clip is not installed"
        clip_class, _, block_class = classes
        return (scorer_problem(model, clip_class, cls.tower, "an open_clip CLIP", "an open_clip CLIP scorer",
                               "an open_clip.model.CLIP")
                or cls.tower_problem(model.clip) or _blocks_problem(cls.transformer_of(model.clip), block_class))

    @classmethod
    def tower_problem(cls, clip: Any) -> Optional[str]:
        """Why this tower of ``clip`` is not supported (``None``: it is)."""
        raise NotImplementedError

    @classmethod
    def signature_of(cls, model: Any) -> tuple:
        return (cls.tower, len(cls.transformer_of(model.clip).resblocks))

    # ------------------------------------------------------------------ structure
    #: isotropic: the transformer's width, block 0's heads
    token_flow = Capability(lambda adapter: TokenFlow(adapter, int(adapter.transformer.width),
                                                      int(adapter.blocks[0].attn.num_heads)))

    # ------------------------------------------------------------------ forward pieces
    def block_mask(self, hidden: Tensor) -> Optional[Tensor]:
        """The ``attn_mask`` the blocks take (``None``: none)."""
        return None

    def run_blocks(self, hidden: Tensor, context: SequenceContext, start: int = 0,
                   stop: Optional[int] = None) -> Tensor:
        """``Transformer.forward``'s loop: ``block(x, attn_mask=mask)``."""
        blocks = self.blocks[start:stop]
        if not blocks:
            return hidden
        mask = self.block_mask(hidden)
        for block in blocks:
            hidden = block(hidden, attn_mask=mask)
        return hidden

    def pooled(self, hidden: Tensor, context: SequenceContext) -> Tensor:
        """The normed read-out token ``[B, D]`` (before the projection)."""
        raise NotImplementedError

    def project(self, pooled: Tensor) -> Tensor:
        """The joint-space embedding of the pooled token."""
        raise NotImplementedError

    def projection_weight(self) -> Optional[Tensor]:
        """The projection as a Linear weight ``[out, in]`` (``None``: no projection)."""
        raise NotImplementedError

    def embedding(self, hidden: Tensor, context: SequenceContext) -> Tensor:
        """Read-out and final norm (:meth:`pooled`), then :meth:`project`."""
        return self.project(self.pooled(hidden, context))

    recording = Capability(lambda adapter: OpenCLIPRecording(adapter))
    # ------------------------------------------------------------------ where methods hook


    def linears(self, layer: int) -> BlockLinears:
        """The attention's ``out_proj`` (its weight; the module applies it functionally) and the attention module
        itself (:attr:`AttentionLinears.multihead`): there is no q/k/v projection module; the MLP's ``c_fc``,
        ``c_proj``."""
        attn, mlp = self.blocks[layer].attn, self.blocks[layer].mlp
        return BlockLinears(AttentionLinears(out=attn.out_proj, multihead=attn), (mlp.c_fc, mlp.c_proj))

    decomposition = Capability(OpenCLIPDecomposition)



@register_adapter
class OpenCLIPVisionAdapter(LensImageAdapter, _OpenCLIPTower):
    """The vision tower of a stock ``open_clip.model.CLIP`` behind a scorer with ``clip_tower = "vision"``
    (``models.clip.ZeroShotClassifier``). Inputs: images ``[B, 3, H, W]`` at the tower's ``image_size``, normalised
    as the model's preprocessing does. Read-out: ``"class_token"`` (``pool_type="tok"``) or ``"mean_content"``
    (``"avg"``). Layout: ``PatchGrid(H/p, W/p, prefix=1)``. Integrated gradients scale the normalised pixels."""

    rule_map = Capability(OpenCLIPVisionRules)

    family = "open_clip CLIP vision tower (ZeroShotClassifier)"
    tower = "vision"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        visual = self.clip.visual
        self.visual = visual
        self.patch_size = (int(visual.patch_size[0]), int(visual.patch_size[1]))

    @classmethod
    def tower_problem(cls, clip: Any) -> Optional[str]:
        classes = _open_clip_classes()
        assert classes is not None
        visual: Any = clip.visual
        if not isinstance(visual, classes[1]):
            return (f"vision tower {type(visual).__name__} (need open_clip's VisionTransformer; ModifiedResNet and "
                    "timm towers are not supported)")
        if getattr(visual, "attn_pool", None) is not None:
            return ("attention pooling (attentional_pool: an AttentionalPooler, cross-attention with learned "
                    "queries over all tokens) is not supported: no read-out of the methods here covers it")
        if visual.pool_type not in VISION_POOLS:
            return f"vision pool_type {visual.pool_type!r} (supported: {', '.join(map(repr, VISION_POOLS))})"
        if visual.proj is None:
            return "a vision tower without its projection (proj pruned)"
        return None

    @classmethod
    def signature_of(cls, model: Any) -> tuple:
        visual = model.clip.visual
        return super().signature_of(model) + (visual.pool_type, bool(visual.final_ln_after_pool))

    #: ``pool_type``'s read-out; the class embedding is always there
    readout: Capability[ReadOut] = Capability(lambda adapter: ReadOut(adapter, VISION_POOLS[adapter.visual.pool_type],
                                                                      True))

    def image_size_problem(self, size: Tuple[int, int]) -> Optional[str]:
        expected = tuple(int(s) for s in self.visual.image_size)
        if size != expected:
            return (f"image size {size} does not match the open_clip vision tower's image_size "
                    f"{expected[0]}x{expected[1]} (its positional embedding is fixed)")
        return None

    def embed(self, inputs: ModelInputs) -> Tensor:
        """``VisionTransformer._embeds``: patches, class token, positions, patch dropout, ``ln_pre``."""
        return self.visual._embeds(inputs["pixel_values"])

    def pooled(self, hidden: Tensor, context: SequenceContext) -> Tensor:
        """``VisionTransformer._pool``: ``ln_post`` and the pooling (the pooled token)."""
        return self.visual._pool(hidden)[0]

    def project(self, pooled: Tensor) -> Tensor:
        return pooled @ self.visual.proj

    def projection_weight(self) -> Optional[Tensor]:
        return self.visual.proj.t()


def text_readout_positions(input_ids: Tensor, pool_type: str, eos_token_id: Optional[int]) -> Tensor:
    """Each text's read-out position as ``open_clip.transformer.text_global_pool`` finds it: the argmax of the ids
    (``"argmax"``) or the first ``eos_token_id`` (``"eos"``)."""
    if pool_type == "argmax":
        return input_ids.argmax(dim=-1)
    return torch.eq(input_ids, int(eos_token_id or 0)).int().argmax(dim=-1)


@register_adapter
class OpenCLIPTextAdapter(_ScaledTokenText, _OpenCLIPTower):
    """The text tower of a stock ``open_clip.model.CLIP`` behind a scorer with ``clip_tower = "text"``
    (``models.clip.PromptScorer``). Inputs: token ids ``[T, context_length]`` as open_clip's tokenizer returns them
    (a tensor or ``{"input_ids": ...}``; no attention mask). Read-out ``"position"``: each text's EOS. Layout:
    ``[T, context_length]`` scores, exactly 0 after the EOS (module docstring). Integrated gradients scale the
    token embeddings before the positional embedding is added (as :class:`~methods.families.hf_clip.adapter.
    HFCLIPTextAdapter`)."""

    rule_map = Capability(OpenCLIPTextRules)
    inputs = Capability(lambda adapter: OpenCLIPTextInputs(adapter))

    family = "open_clip CLIP text tower (PromptScorer)"

    @classmethod
    def tower_problem(cls, clip: Any) -> Optional[str]:
        if clip.attn_mask is None:
            return ("a text tower without its causal mask (no_causal_mask): the model reads no padding mask, so its "
                    "padding would reach the read-out")
        if clip.text_pool_type not in TEXT_POOLS:
            return f"text_pool_type {clip.text_pool_type!r} (supported: {', '.join(map(repr, TEXT_POOLS))})"
        return None

    @classmethod
    def signature_of(cls, model: Any) -> tuple:
        return super().signature_of(model) + (model.clip.text_pool_type,)

    @property
    def context_length(self) -> int:
        return int(self.clip.positional_embedding.shape[0])

    def embed(self, inputs: ModelInputs) -> Tensor:
        """``encode_text``: token embeddings (times the per-sample ``token_embedding_scale`` set by
        ``inputs.interpolate``) plus the positional embedding, in the transformer's cast dtype."""
        clip = self.clip
        cast_dtype = clip.transformer.get_cast_dtype()
        x = clip.token_embedding(inputs["input_ids"]).to(cast_dtype)
        scale = inputs.tensors.get(TOKEN_EMBEDDING_SCALE)
        if scale is not None:
            x = scale.to(x.dtype)[:, None, None] * x
        return x + clip.positional_embedding.to(cast_dtype)

    def block_mask(self, hidden: Tensor) -> Optional[Tensor]:
        """The model's causal ``attn_mask`` (its top-left corner for a sequence shortened by token ablation)."""
        mask = self.clip.attn_mask
        n = hidden.shape[1]
        return mask if n == mask.shape[0] else mask[:n, :n]

    def pooled(self, hidden: Tensor, context: SequenceContext) -> Tensor:
        return at_readout_positions(self.clip.ln_final(hidden), context)

    def project(self, pooled: Tensor) -> Tensor:
        projection = self.clip.text_projection
        if projection is None:
            return pooled
        return projection(pooled) if isinstance(projection, nn.Linear) else pooled @ projection

    def projection_weight(self) -> Optional[Tensor]:
        projection = self.clip.text_projection
        if projection is None:
            return None
        return projection.weight if isinstance(projection, nn.Linear) else projection.t()


class OpenCLIPTextInputs(ScaledTokenInputs):
    """The inputs of :class:`OpenCLIPTextAdapter`: token ids padded to the context length, no attention mask, each
    text read at its EOS."""

    adapter: "OpenCLIPTextAdapter"

    def prepare(self, inputs: RawInputs, sample_ids: SampleIds = None) -> ModelInputs:
        adapter, clip = self.adapter, self.adapter.clip
        if isinstance(inputs, Mapping) and inputs.get("attention_mask") is not None:
            raise ValueError("open_clip's CLIP text tower takes no attention_mask (its tokenizer pads with 0 to the "
                             "context length and the causal mask keeps the padding from the read-out): pass the "
                             "input_ids alone")
        _, ids, _ = check_token_inputs(inputs, adapter.family, int(clip.vocab_size), adapter.context_length,
                                        batch="T", positions_of="the open_clip text tower's")
        if ids.shape[1] != adapter.context_length:
            raise ValueError(f"input_ids have {ids.shape[1]} positions; open_clip's CLIP adds all its "
                             f"{adapter.context_length} positional embeddings: pad to context_length as its tokenizer "
                             "does")
        ids = ids.long()
        pool, eos_id = clip.text_pool_type, getattr(clip, "text_eos_id", None)
        positions = text_readout_positions(ids, pool, eos_id)
        if pool == "eos":
            rows = torch.arange(ids.shape[0], device=ids.device)
            missing = torch.ne(ids[rows, positions], int(eos_id or 0)).nonzero().flatten()
            if len(missing):
                raise ValueError(f"input_ids: samples {missing.tolist()} hold no EOS token (id {eos_id}); the "
                                 "open_clip text tower reads each text at its EOS")
        tensors = {"input_ids": ids, READOUT_POSITIONS: positions}
        dtype = clip.token_embedding.weight.dtype
        return ModelInputs(tensors, int(ids.shape[0]), dtype, ids.device,
                           check_sample_ids(sample_ids, int(ids.shape[0])))

    def layout(self, inputs: Union[ModelInputs, RawInputs]) -> TokenSequence:
        if not isinstance(inputs, ModelInputs):
            inputs = self.prepare(inputs)
        ids, eos = inputs["input_ids"], inputs[READOUT_POSITIONS]
        positions = torch.arange(ids.shape[1], device=ids.device)[None, :]
        real = positions <= eos[:, None]
        content = (positions > 0) & (positions < eos[:, None])
        return TokenSequence(attention_mask=real.long(), content_mask=content)

    def context(self, inputs: ModelInputs) -> SequenceContext:
        """No attention mask (the model reads none); the EOS positions."""
        return SequenceContext(readout_positions=inputs[READOUT_POSITIONS])




class OpenCLIPValueEdit(AttentionEdit):
    """The values of ``nn.MultiheadAttention``, computed from its packed ``in_proj``, edited through its output."""

    @contextlib.contextmanager
    def __call__(self, edit: Callable[[int, Tensor], Tensor]) -> Iterator[None]:
        """``nn.MultiheadAttention`` computes its values functionally from its packed ``in_proj``, so no hook
        reaches them: within ``recording.eager_attention()`` (the module returns its probabilities ``A``), each block's
        attention output gets ``out_proj.weight (A (edit(v) - v))`` added
        (:func:`~methods.adapters.value_edits.product_change`, ``v`` the last third of ``in_proj`` applied to the
        module's value input): the output with the edited values."""
        def correct(layer: int) -> Callable[..., Any]:
            def hook(module: nn.MultiheadAttention, args: Tuple[Any, ...], kwargs: dict, output: Any) -> Any:
                out, weights = output
                value_input = args[2] if len(args) > 2 else kwargs["value"]
                change = edited_values_change(layer, edit, _value_projection(module, value_input), module.num_heads)
                return out + F.linear(product_change(weights, change).to(out.dtype), module.out_proj.weight), weights
            return hook

        with self.adapter.recording.eager_attention():
            handles = [block.attn.register_forward_hook(correct(layer), with_kwargs=True)
                       for layer, block in enumerate(self.adapter.blocks)]
            try:
                yield
            finally:
                for handle in handles:
                    handle.remove()


class OpenCLIPScoreEdit(AttentionEdit):
    """open_clip's scores edited through each block's float ``attn_mask``."""

    @contextlib.contextmanager
    def __call__(self, edit: Callable[[int, Tensor], Tensor]) -> Iterator[None]:
        """The materialised attention (``recording.eager_attention()``) with each block's float ``attn_mask``
        replaced by ``mask + edit(layer, S) - S`` (:mod:`methods.families.open_clip.score_edit`), hooks removed on
        exit."""
        with self.adapter.recording.eager_attention(), open_clip_score_edit(self.adapter.blocks, edit):
            yield


class OpenCLIPPostAttentionValues(ValueRecorder):
    """Beyond Intuition's CLIP token scale reads every open_clip tower's blocks."""

    def __call__(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        """Beyond Intuition's CLIP token scale: the value projection of ``ln_1`` applied to the residual stream
        after the attention sub-layer (the input of ``ln_2``), as
        :class:`methods.families.hf_clip.adapter.CLIPPostAttentionValues`; ``ln_1.forward`` is called directly, so no
        hook on it fires."""
        block = self.adapter.blocks[layer]

        def hook(_module: nn.Module, args: Tuple[Any, ...]) -> None:
            with torch.no_grad():
                rec.outputs[key] = _value_projection(block.attn, block.ln_1.forward(args[0]))

        rec._handles.append(block.ln_2.register_forward_pre_hook(hook))


class OpenCLIPRecording(Recording):
    """Where methods hook in an open_clip tower."""

    value_edit = Capability(lambda recording: OpenCLIPValueEdit(recording.adapter))
    score_edit = Capability(lambda recording: OpenCLIPScoreEdit(recording.adapter))
    post_attention_values = Capability(lambda recording: OpenCLIPPostAttentionValues(recording.adapter))

    @contextlib.contextmanager
    def eager_attention(self) -> Iterator[None]:
        """Within it every block's attention module is called with ``need_weights=True,
        average_attn_weights=False`` (a forward pre-hook on its keyword arguments, removed on exit): torch's
        explicit softmax, whose probabilities ``[B, H, N, N]`` the module returns. The model itself is not
        changed."""
        handles = [block.attn.register_forward_pre_hook(_need_weights, with_kwargs=True)
                   for block in self.adapter.blocks]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def attention(self, rec: ActivationRecorder, layer: int, key: Hashable, require_grad: bool = False,
                  transform: Optional[Callable[[Tensor], Tensor]] = None) -> None:
        """The probabilities ``[B, H, N, N]`` the attention module returns under ``recording.eager_attention()`` (after
        dropout: identity in eval). ``require_grad``: they become a leaf joined to the attention output, so that
        ``d logit / d A`` is the gradient of ``A v`` (module docstring); autograd must be recorded from this
        block on."""
        attn = self.adapter.blocks[layer].attn

        def hook(module: nn.MultiheadAttention, args: Tuple[Any, ...], kwargs: dict, output: Any) -> Any:
            out, weights = output
            if weights is None:
                raise RuntimeError(f"{self.adapter.family}: the attention probabilities of block {layer} are "
                                   "materialised only under adapter.recording.eager_attention()")
            if require_grad:
                value_input = args[2] if len(args) > 2 else kwargs["value"]
                with torch.no_grad():
                    values = _value_projection(module, value_input)
                weights = weights.detach().requires_grad_(True)
                out = _AttentionGradient.apply(out, weights, values, module.out_proj.weight.detach())
            rec.outputs[key] = weights if transform is None else transform(weights)
            return (out, weights) if require_grad else None

        rec._handles.append(attn.register_forward_hook(hook, with_kwargs=True))

    def values(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        """The value projection ``[B, N, D]`` of the attention input (``ln_1``'s output), computed from the
        module's ``in_proj_weight`` (no gradient)."""
        block = self.adapter.blocks[layer]

        def hook(_module: nn.Module, _args: Tuple[Any, ...], out: Tensor) -> None:
            with torch.no_grad():
                rec.outputs[key] = _value_projection(block.attn, out)

        rec._handles.append(block.ln_1.register_forward_hook(hook))

    def attention_input(self, rec: ActivationRecorder, layer: int, key: Hashable,
                        require_grad: bool = False) -> None:
        rec.output(self.adapter.blocks[layer].ln_1, key, require_grad=require_grad)
