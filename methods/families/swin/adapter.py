"""Adapters for Swin Transformer V1 classifiers: timm ``SwinTransformer`` and transformers
``SwinForImageClassification`` (Liu et al. 2021; NOTES.md beside this file).

A Swin model is stages (four in Swin-T/S/B/L) of windowed-attention blocks, each stage but the first entered
through a 2x2 patch merge (half the grid, twice the width); the head averages the last stage's tokens. The
adapters run the stock blocks and merges in the model's own order (logits bit-identical) and describe:

* **layout**: the last stage's token grid (what the average-pooling read-out reads), as a ``PatchGrid`` without
  prefix tokens; a score covers ``patch * 2^(stages - 1)`` pixels a side (:attr:`patch_size`);
* **token flow**: each stage's token space (:meth:`SwinFlow.token_space`) and the 2x2 patch merge entering a
  stage as a sparse 4:1 transition (:meth:`SwinFlow.transition`), through which rollout and Generic Attribution
  compose; a method that reads one block's map at the read-out row reads the last stage only;
* **attention maps**: a block's windowed (and shifted-window) probabilities ``[B * nW, H, a, a]`` expanded to its
  stage's ``[B, H, N, N]`` map (:class:`~.windows.WindowGeometry`);
* **hidden states** between the adapter's pieces: ``[B, N, C]``, the stage's grid row-major (the image size is
  fixed, so each stage's grid is too: :meth:`SwinAdapter.stage_grid`).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

import torch
from torch import Tensor, nn

from ...adapters.base import (
    AttentionEdit,
    AttentionLinears,
    BlockLinears,
    ImageAdapter,
    ImageInputs,
    InputFormat,
    Layout,
    MethodUndefinedError,
    ModelInputs,
    ReadOut,
    Recording,
    SequenceContext,
    TokenFlow,
    TokenSpace,
    register_adapter,
)
from ...adapters.capability import Capability, lacking
from ...adapters.library import class_problem
from ...adapters.recorder import ActivationRecorder
from ..hf_blocks import HFEncoderBlocks, HFRecording
from ..timm_vit.adapter import timm_fused_attention_off
from .rules import SwinRules
from .windows import WindowGeometry


def _flat_leaf(x: Tensor, require_grad: bool) -> Tuple[Tensor, Tensor]:
    """``x`` ``[B, rows, cols, C]`` as ``[B, N, C]`` (the recorded tensor) and the view of it the model goes on
    with, so that a gradient of the output reaches the recorded tensor; ``require_grad``: a new leaf when ``x``
    is not differentiable."""
    flat = x.reshape(x.shape[0], -1, x.shape[-1])
    if require_grad and not flat.requires_grad:
        flat = flat.detach().requires_grad_(True)
    return flat, flat.view(x.shape)


class SwinFlow(TokenFlow):
    """Per-stage token spaces joined by the patch merges (as sparse 4:1 maps)."""

    adapter: "SwinAdapter"

    def __init__(self, adapter: "SwinAdapter") -> None:
        """:attr:`width` and :attr:`heads`: the last stage's (the read-out's; the stages differ)."""
        super().__init__(adapter, adapter.num_features, adapter.heads_of(len(adapter.blocks) - 1))

    def token_space(self, layer: int, layout: Layout) -> TokenSpace:
        """Block ``layer``'s stage: its grid, width and heads."""
        rows, cols = self.adapter.grids[layer]
        return TokenSpace(rows * cols, (rows, cols), self.adapter.width_of(layer), self.adapter.heads_of(layer))

    def transition(self, layer: int, like: Tensor) -> Optional[Tensor]:
        """The patch merge entering block ``layer``'s stage, ``[N_layer, N_layer-1]`` sparse: merged token
        ``(i, j)`` takes 1/4 of each of its sources ``(2i + di, 2j + dj)``; ``None`` inside a stage."""
        if layer not in self.adapter.merge_before:
            return None
        (rows, cols), (_, before) = self.adapter.grids[layer], self.adapter.grids[layer - 1]
        merged = torch.arange(rows * cols, device=like.device)
        i, j = merged // cols, merged % cols
        sources = torch.stack([(2 * i + di) * before + 2 * j + dj for di in (0, 1) for dj in (0, 1)], dim=1)
        indices = torch.stack([merged[:, None].expand_as(sources).flatten(), sources.flatten()])
        values = torch.full((indices.shape[1],), 0.25, dtype=like.dtype, device=like.device)
        shape = (rows * cols, self.adapter.grids[layer - 1][0] * before)
        return torch.sparse_coo_tensor(indices, values, shape, check_invariants=True).coalesce()


class SwinInputs(ImageInputs):
    """Images as every family's; no position can be removed (module docstring)."""

    def drop_positions(self, hidden: Tensor, context: SequenceContext,
                       removed: Tensor) -> Tuple[Tensor, SequenceContext]:
        raise MethodUndefinedError(
            f"token_ablation is not defined on {self.adapter.family}: its window partition, shift masks and 2x2 patch "
            "merges need every position of the grid, so a removed patch has no place to be left out of (an "
            "occlusion by a baseline token would be another method)")




class SwinAdapter(ImageAdapter):
    """What both libraries' Swin adapters share: the flat list of blocks with their stage, the grid each block
    saw in the last forward, the expansion of windowed maps and the refusals (module docstring)."""

    readout: Capability[ReadOut] = Capability(lambda adapter: ReadOut(adapter, "mean_content"))
    num_prefix_tokens = 0
    rule_map = Capability(SwinRules)
    token_flow: Capability[TokenFlow] = Capability(SwinFlow)
    inputs: Capability[InputFormat] = Capability(SwinInputs)
    #: per stage: its blocks (a list of modules) and the patch merge entering it (``None`` for the first stage)
    stages: List[Tuple[List[nn.Module], Optional[nn.Module]]]
    #: the patch embedding's patch side (pixels) and the model's image size (rows, cols of pixels)
    stem_patch: int
    image_size: Tuple[int, int]

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.stages = self.stages_of(model)
        self.blocks = [block for blocks, _ in self.stages for block in blocks]
        self.stage_of = [s for s, (blocks, _) in enumerate(self.stages) for _ in blocks]
        self.merge_before = {sum(len(b) for b, _ in self.stages[:s]): merge
                             for s, (_, merge) in enumerate(self.stages) if merge is not None}
        side = self.stem_patch * 2 ** (len(self.stages) - 1)
        self.patch_size = (side, side)
        self.grids = [self.stage_grid(s) for s in self.stage_of]

    def stage_grid(self, stage: int) -> Tuple[int, int]:
        """The (rows, cols) token grid of ``stage`` (0-based): the patch grid halved by each merge before it."""
        return self.image_size[0] // self.stem_patch >> stage, self.image_size[1] // self.stem_patch >> stage

    @staticmethod
    def grid_problem(rows: int, cols: int, windows: List[List[int]]) -> Optional[str]:
        """Why a patch grid of ``rows x cols`` does not go through stages whose blocks have the window sides
        ``windows`` (per stage, per block) without padding (``None``: it does)."""
        for stage, sides in enumerate(windows):
            r, c = rows >> stage, cols >> stage
            if (r << stage, c << stage) != (rows, cols):
                return f"the {rows}x{cols} patch grid does not halve evenly {stage} times (Swin pads it)"
            for side in sides:
                problem = WindowGeometry((r, c), min(side, r, c), 0).problem()
                if problem:
                    return f"stage {stage + 1}: {problem} (Swin pads it)"
        return None

    @classmethod
    def stages_of(cls, model: Any) -> List[Tuple[List[nn.Module], Optional[nn.Module]]]:
        raise NotImplementedError

    def width_of(self, layer: int) -> int:
        raise NotImplementedError

    @property
    def num_features(self) -> int:
        """The width of the last stage's tokens, which the head reads."""
        raise NotImplementedError

    @property
    def last_stage(self) -> int:
        return len(self.stages) - 1

    def heads_of(self, layer: int) -> int:
        raise NotImplementedError

    def image_size_problem(self, size: Tuple[int, int]) -> Optional[str]:
        if tuple(size) != tuple(self.image_size):
            return (f"{self.family} reads images of {self.image_size[0]}x{self.image_size[1]} pixels (its windows "
                    f"and shift masks are built for that grid), got {size[0]}x{size[1]}")
        return None

    # ------------------------------------------------------------------ windows
    def geometry(self, layer: int) -> WindowGeometry:
        """The windows of block ``layer`` in the last forward (its grid, window side and shift)."""
        raise NotImplementedError

    def _expanded(self, layer: int, windows: Tensor, require_grad: bool) -> Tuple[Tensor, Tensor]:
        """The full map ``[B, H, N, N]`` of block ``layer``'s windowed probabilities and the windowed tensor the
        model goes on with: gathered back from the full map (the same values), so that ``d logit / d full`` is
        the model's gradient at each window entry and 0 between windows."""
        geometry = self.geometry(layer)
        if require_grad and not windows.requires_grad:
            windows = windows.detach().requires_grad_(True)
        full = geometry.expand(windows)
        return full, geometry.gather(full) if require_grad else windows

    # ------------------------------------------------------------------ forward pieces
    def run_blocks(self, hidden: Tensor, context: SequenceContext, start: int = 0,
                   stop: Optional[int] = None) -> Tensor:
        """Blocks ``start`` to ``stop`` on ``[B, N, C]``; the patch merge entering a stage runs before the
        stage's first block."""
        for layer in range(start, len(self.blocks) if stop is None else stop):
            merge = self.merge_before.get(layer)
            if merge is not None:
                hidden = self.merge(merge, hidden, self.grids[layer - 1])
            hidden = self.block(layer, hidden)
        return hidden

    def merge(self, merge: nn.Module, hidden: Tensor, grid: Tuple[int, int]) -> Tensor:
        """The patch merge ``merge`` on ``[B, N, C]`` tokens of a ``grid``: ``[B, N / 4, C']``."""
        raise NotImplementedError

    def block(self, layer: int, hidden: Tensor) -> Tensor:
        raise NotImplementedError

    # ------------------------------------------------------------------ where methods hook

    def _flat_input(self, layer: int, x: Tensor, require_grad: bool) -> Tuple[Tensor, Tensor]:
        """The block input as ``[B, N, C]`` and what the block goes on with."""
        raise NotImplementedError

    def attention_norm(self, layer: int) -> nn.Module:
        raise NotImplementedError



@register_adapter
class TimmSwinAdapter(SwinAdapter):
    """timm ``SwinTransformer`` (V1): ``patch_embed`` (NHWC), ``layers[s]`` = ``downsample`` (a ``PatchMerging``
    for ``s > 0``) then ``blocks``; ``norm``; ``head`` (average pooling, ``fc``). Attention probabilities: the
    output of ``attn.attn_drop`` with timm's fused attention off (module docstring)."""

    family = "timm SwinTransformer"

    def __init__(self, model: Any) -> None:
        self.stem_patch = int(model.patch_embed.patch_size[0])
        self.image_size = (int(model.patch_embed.img_size[0]), int(model.patch_embed.img_size[1]))
        super().__init__(model)

    @classmethod
    def supports(cls, model: Any) -> Optional[str]:
        problem = class_problem(model, "timm.models.swin_transformer", "SwinTransformer")
        if problem is not None:
            return problem
        head = model.head
        if getattr(head, "global_pool", None) is None or getattr(head.global_pool, "pool_type", "") != "avg":
            return "timm SwinTransformer without average pooling is not supported (supported read-out: 'avg')"
        embed = model.patch_embed
        patch = embed.patch_size
        if patch[0] != patch[1] or not embed.strict_img_size or embed.dynamic_img_pad:
            return "timm SwinTransformer with non-square patches or dynamic image sizes is not supported"
        size, side = embed.img_size, int(patch[0])
        windows = [[int(block.window_size[0]) for block in layer.blocks] for layer in model.layers]
        return cls.grid_problem(int(size[0]) // side, int(size[1]) // side, windows)

    @classmethod
    def signature_of(cls, model: Any) -> tuple:
        return (len(model.layers), sum(len(layer.blocks) for layer in model.layers))

    @classmethod
    def stages_of(cls, model: Any) -> List[Tuple[List[nn.Module], Optional[nn.Module]]]:
        return [(list(layer.blocks), None if isinstance(layer.downsample, nn.Identity) else layer.downsample)
                for layer in model.layers]

    @property
    def num_features(self) -> int:
        return int(self.model.num_features)

    def heads_of(self, layer: int) -> int:
        return int(self.blocks[layer].attn.num_heads)

    def width_of(self, layer: int) -> int:
        return int(self.blocks[layer].attn.qkv.in_features)

    def geometry(self, layer: int) -> WindowGeometry:
        block = self.blocks[layer]
        return WindowGeometry(self.grids[layer], int(block.window_size[0]), int(block.shift_size[0]))

    # ------------------------------------------------------------------ forward pieces (the model's own order)
    def embed(self, inputs: ModelInputs) -> Tensor:
        """``patch_embed`` (the normed patch grid, channels last), flattened to ``[B, N, C]``."""
        return self.model.patch_embed(inputs["pixel_values"]).flatten(1, 2)

    def merge(self, merge: nn.Module, hidden: Tensor, grid: Tuple[int, int]) -> Tensor:
        return merge(hidden.unflatten(1, grid)).flatten(1, 2)

    def block(self, layer: int, hidden: Tensor) -> Tensor:
        return self.blocks[layer](hidden.unflatten(1, self.grids[layer])).flatten(1, 2)

    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """Final ``norm``, then ``forward_head`` (average pooling over the grid, ``fc``)."""
        m = self.model
        return m.forward_head(m.norm(hidden).unflatten(1, self.grids[-1]), pre_logits=pre_logits)

    # ------------------------------------------------------------------ where methods hook
    def _flat_input(self, layer: int, x: Tensor, require_grad: bool) -> Tuple[Tensor, Tensor]:
        return _flat_leaf(x, require_grad)

    def attention_norm(self, layer: int) -> nn.Module:
        return self.blocks[layer].norm1

    recording = Capability(lambda adapter: TimmSwinRecording(adapter))
    def linears(self, layer: int) -> BlockLinears:
        attn, mlp = self.blocks[layer].attn, self.blocks[layer].mlp
        return BlockLinears(AttentionLinears(out=attn.proj, qkv=attn.qkv), (mlp.fc1, mlp.fc2))

    def patch_projection(self) -> nn.Module:
        """The patch embedding's convolution (its output ``[B, C, rows, cols]``)."""
        return self.model.patch_embed.proj


@register_adapter
class HFSwinAdapter(SwinAdapter, HFEncoderBlocks):
    """transformers ``SwinForImageClassification``: ``swin.embeddings`` (patch embedding, norm, optional absolute
    positions), ``swin.encoder.layers[s]`` = ``blocks`` then ``downsample`` (a ``SwinPatchMerging``, ending every
    stage but the last: the adapter runs it as the next stage's entry), ``swin.layernorm``, average pooling,
    ``classifier``. Attention probabilities: the second output of each ``SwinAttention`` under eager attention;
    with ``require_grad`` the module's output is joined to the full map (NOTES.md)."""

    family = "transformers SwinForImageClassification"
    recording = Capability(lambda adapter: HFSwinRecording(adapter))

    def __init__(self, model: Any) -> None:
        config = model.config
        self.config = config
        self.stem_patch = int(config.patch_size)
        self.image_size = self.image_size_of(config)
        super().__init__(model)

    @classmethod
    def supports(cls, model: Any) -> Optional[str]:
        problem = class_problem(model, "transformers", "SwinForImageClassification")
        if problem is not None:
            return problem
        if not isinstance(model.classifier, nn.Linear) or model.swin.pooler is None:
            return "SwinForImageClassification without average pooling and a Linear classifier is not supported"
        config = model.config
        size = cls.image_size_of(config)
        windows = [[int(config.window_size)] * int(depth) for depth in config.depths]
        return cls.grid_problem(size[0] // config.patch_size, size[1] // config.patch_size, windows)

    @staticmethod
    def image_size_of(config: Any) -> Tuple[int, int]:
        """``config.image_size`` (an int or a pair) as ``(height, width)``."""
        size = config.image_size if isinstance(config.image_size, (tuple, list)) else (config.image_size,) * 2
        return int(size[0]), int(size[1])

    @classmethod
    def signature_of(cls, model: Any) -> tuple:
        layers = model.swin.encoder.layers
        return (len(layers), sum(len(layer.blocks) for layer in layers))

    @classmethod
    def stages_of(cls, model: Any) -> List[Tuple[List[nn.Module], Optional[nn.Module]]]:
        layers = list(model.swin.encoder.layers)
        return [(list(layer.blocks), None if s == 0 else layers[s - 1].downsample) for s, layer in enumerate(layers)]

    @property
    def num_features(self) -> int:
        return int(self.model.swin.num_features)

    def heads_of(self, layer: int) -> int:
        return int(self.blocks[layer].attention.num_attention_heads)

    def width_of(self, layer: int) -> int:
        return int(self.blocks[layer].attention.q_proj.in_features)

    def geometry(self, layer: int) -> WindowGeometry:
        block = self.blocks[layer]
        return WindowGeometry(self.grids[layer], int(block.window_size), int(block.shift_size))

    # ------------------------------------------------------------------ forward pieces (the model's own order)
    def embed(self, inputs: ModelInputs) -> Tensor:
        """``swin.embeddings``: ``[B, N, C]``."""
        return self.model.swin.embeddings(inputs["pixel_values"])[0]

    def merge(self, merge: nn.Module, hidden: Tensor, grid: Tuple[int, int]) -> Tensor:
        return merge(hidden, grid)

    def block(self, layer: int, hidden: Tensor) -> Tensor:
        return self.blocks[layer](hidden, self.grids[layer])[0]

    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """``swin.layernorm``, the average pool over the tokens, ``classifier``: the model's own order."""
        swin = self.model.swin
        hidden = swin.layernorm(hidden)
        pooled = torch.flatten(swin.pooler(hidden.transpose(1, 2)), 1)
        return pooled if pre_logits else self.model.classifier(pooled)

    # ------------------------------------------------------------------ where methods hook
    def _flat_input(self, layer: int, x: Tensor, require_grad: bool) -> Tuple[Tensor, Tensor]:
        if require_grad and not x.requires_grad:
            x = x.detach().requires_grad_(True)
        return x, x

    def attention_norm(self, layer: int) -> nn.Module:
        return self.blocks[layer].layernorm_before

    def linears(self, layer: int) -> BlockLinears:
        attn, mlp = self.blocks[layer].attention, self.blocks[layer].mlp
        return BlockLinears(AttentionLinears(out=attn.o_proj, q=attn.q_proj, k=attn.k_proj, v=attn.v_proj),
                            (mlp.fc1, mlp.fc2))

    def patch_projection(self) -> nn.Module:
        """The patch embedding's convolution (its output ``[B, C, rows, cols]``)."""
        return self.model.swin.embeddings.patch_embeddings.projection


class SwinRecording(Recording):
    """What both libraries' Swin recordings share: the block input and the attention input."""

    adapter: "SwinAdapter"
    #: a block's scores are per window with the relative position bias and the shift mask added inside the
    #: family's own attention, not a ``[B, H, N, N]`` map over the stage's tokens: no score edit
    score_edit: Capability[Optional[AttentionEdit]] = Capability(lacking)

    def block_input(self, rec: ActivationRecorder, layer: int, key: Hashable,
                    require_grad: bool = False) -> None:
        """The residual stream entering block ``layer`` (after its stage's merge), as ``[B, N, C]``."""
        def hook(_module: nn.Module, args: Tuple[Any, ...]) -> Tuple[Any, ...]:
            flat, x = self.adapter._flat_input(layer, args[0], require_grad)
            rec.outputs[key] = flat
            return (x,) + tuple(args[1:])

        rec._handles.append(self.adapter.blocks[layer].register_forward_pre_hook(hook))

    def attention_input(self, rec: ActivationRecorder, layer: int, key: Hashable,
                        require_grad: bool = False) -> None:
        """The output of block ``layer``'s first norm, ``[B, N, C]`` (grid positions, before the shift)."""
        def hook(_module: nn.Module, _args: Tuple[Any, ...], out: Tensor) -> Tensor:
            flat = out.reshape(out.shape[0], -1, out.shape[-1])
            if require_grad and not flat.requires_grad:
                flat = flat.detach().requires_grad_(True)
            rec.outputs[key] = flat
            return flat.view(out.shape)

        rec._handles.append(self.adapter.attention_norm(layer).register_forward_hook(hook))


class TimmSwinRecording(SwinRecording):
    """Where methods hook in a timm Swin."""

    adapter: "TimmSwinAdapter"

    def attention(self, rec: ActivationRecorder, layer: int, key: Hashable, require_grad: bool = False,
                  transform: Optional[Callable[[Tensor], Tensor]] = None) -> None:
        """The full map ``[B, H, N, N]`` of block ``layer``'s stage (module docstring); ``require_grad``: the model
        goes on with the windows gathered back from it (the same values)."""

        def hook(_module: nn.Module, _args: Tuple[Any, ...], out: Tensor) -> Optional[Tensor]:
            full, windows = self.adapter._expanded(layer, out, require_grad)
            rec.outputs[key] = full if transform is None else transform(full)
            return windows if require_grad else None

        rec._handles.append(self.adapter.blocks[layer].attn.attn_drop.register_forward_hook(hook))

    def values(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        """The value projection ``[B, N, C]`` at the grid positions (heads merged, bias included)."""
        dim = int(self.adapter.blocks[layer].attn.qkv.in_features)

        def hook(_module: nn.Module, _args: Tuple[Any, ...], out: Tensor) -> None:
            rec.outputs[key] = self.adapter.geometry(layer).tokens(out[..., 2 * dim:3 * dim])

        rec._handles.append(self.adapter.blocks[layer].attn.qkv.register_forward_hook(hook))

    def eager_attention(self) -> contextlib.AbstractContextManager[None]:
        """timm's fused attention off (it never materialises the probabilities), restored on exit."""
        return timm_fused_attention_off(block.attn for block in self.adapter.blocks)


class HFSwinRecording(SwinRecording, HFRecording):
    """Where methods hook in a transformers Swin."""

    adapter: "HFSwinAdapter"

    hidden_requires_grad = True

    def attention(self, rec: ActivationRecorder, layer: int, key: Hashable, require_grad: bool = False,
                  transform: Optional[Callable[[Tensor], Tensor]] = None) -> None:
        """The full map ``[B, H, N, N]`` of block ``layer``'s stage. ``require_grad`` (autograd recorded from this
        block on): the module's output plus ``o_proj((gather(full) - A) v)``, exactly 0, so that the logits are
        unchanged and ``d logit / d full`` is the gradient at each window entry."""
        attention = self.adapter.blocks[layer].attention
        values: Dict[str, Tensor] = {}

        def keep_values(_module: nn.Module, _args: Tuple[Any, ...], out: Tensor) -> None:
            values["v"] = out

        def hook(_module: nn.Module, _args: Tuple[Any, ...], output: Any) -> Any:
            out, weights = output
            if weights is None:
                raise RuntimeError(f"{self.adapter.family}: the attention probabilities of block {layer} are "
                                   "materialised only under adapter.recording.eager_attention()")
            full, windows = self.adapter._expanded(layer, weights, require_grad)
            rec.outputs[key] = full if transform is None else transform(full)
            if not require_grad:
                return None
            v = values.pop("v")
            v = v.reshape(v.shape[0], v.shape[1], -1, attention.head_dim).transpose(1, 2)
            delta = ((windows - weights) @ v).transpose(1, 2).reshape(out.shape)
            return out + nn.functional.linear(delta, attention.o_proj.weight), weights

        rec._handles.append(attention.v_proj.register_forward_hook(keep_values))
        rec._handles.append(attention.register_forward_hook(hook))

    def values(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        """The value projection ``[B, N, C]`` at the grid positions (heads merged, bias included)."""

        def hook(_module: nn.Module, _args: Tuple[Any, ...], out: Tensor) -> None:
            rec.outputs[key] = self.adapter.geometry(layer).tokens(out)

        rec._handles.append(self.adapter.blocks[layer].attention.v_proj.register_forward_hook(hook))
