"""Registry of LRP topologies: one per adapter class (model family)."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Type, TypeVar

import torch
from torch import Tensor, nn

from ..adapters import ActivationRecorder, AttentionLinears, MethodUndefinedError, ModelAdapter, Projection
from .sublayers import block_relprop, block_tensors, folded_linear, record_block

T = TypeVar("T", bound="Type[Topology]")
TOPOLOGIES: Dict[Type[ModelAdapter], Type[Topology]] = {}
#: where full LRP may stop on a text model: the encoder input, or the token embeddings (other shares dropped)
INPUT_POINTS = ("encoder_input", "word_embeddings")


def register_topology(adapter_class: Type[ModelAdapter]) -> Callable[[T], T]:
    """Class decorator: the topology used for models whose adapter is ``adapter_class``."""
    def decorator(cls: T) -> T:
        TOPOLOGIES[adapter_class] = cls
        return cls
    return decorator


class Topology:
    """Base of the per-family topologies: validates the model (``check``) and keeps its adapter.

    A topology implements ``record(rec, blocks, to_input, grad_blocks, layer_outputs)``, ``head_relprop``,
    ``block_relprop`` and ``input_relprop`` (see :class:`methods.lrp.engine.LRPEngine`), mostly by calling the
    shared sub-layers of :mod:`methods.lrp.sublayers`. The defaults here: :meth:`record` records each block
    (:meth:`record_block`), then the head (:meth:`record_head`) and the input (:meth:`record_input`) a family
    names; :meth:`block_relprop` is the shared pre-norm block, with the layer scales a family names
    (:meth:`layer_scales`) folded into the Linear layers before them.

    Engine options (set by :class:`~methods.lrp.engine.LRPEngine` on every topology; a family without the
    capability ignores them): ``mask_value``, the additive mask the Add rule sees at padded keys (families with
    padding masks); ``input_point``, where full LRP stops: one of ``input_points`` (empty: the family has one
    input, e.g. the pixels); ``streamed_attention_from``, on a topology that ``streams_attention`` (its
    adapter's ``attention_recompute``): the first block whose attention map is
    not recorded but handed to the engine during the backward (``None``: every map recorded).
    """

    mask_value = "dtype_min"
    input_point = "encoder_input"
    input_points: Tuple[str, ...] = ()
    #: whether ``record`` leaves the maps of the blocks from ``streamed_attention_from`` up to the engine
    streams_attention = False
    streamed_attention_from: Optional[int] = None

    @staticmethod
    def check(adapter) -> None:
        """Raise ``TypeError`` naming what has no LRP rule in this model."""

    def __init__(self, adapter):
        self.check(adapter)
        self.adapter = adapter
        self.model = adapter.model
        #: per block with layer scale (``x + gamma * branch``, a constant per channel: relevance passes it
        #: unchanged), the output projection and the MLP's second Linear with the scales folded in
        self.scaled: Dict[int, Tuple[nn.Linear, nn.Linear]] = {}
        for i in range(len(adapter.blocks)):
            scales = self.layer_scales(i)
            if scales is not None:
                linears, (_, fc2) = self.rule_linears(i)
                self.scaled[i] = (folded_linear(linears.out, scales[0][1]), folded_linear(fc2, scales[1][1]))

    def layer_scales(self, layer: int) -> Optional[Tuple[Tuple[nn.Module, Tensor], Tuple[nn.Module, Tensor]]]:
        """Block ``layer``'s layer scales (``x + gamma * branch``: DINOv2, CaiT-style ``init_values``), as
        ``(module, gamma)`` after the attention and after the MLP, the modules' outputs being the scaled branches;
        ``None`` (default): the block has none."""
        return None

    def rule_linears(self, layer: int) -> Tuple[AttentionLinears, Tuple[Projection, Projection]]:
        """The attention and MLP linears whose weights the rules of block ``layer`` read (the adapter's)."""
        linears = self.adapter.linears(layer)
        return linears.attention, linears.mlp

    # ------------------------------------------------------------------ recording
    def record(self, rec: ActivationRecorder, blocks: Sequence[int], to_input: bool,
               grad_blocks: Sequence[int] = (), layer_outputs: bool = True) -> None:
        """Hooks for the rule inputs of ``blocks`` (:meth:`record_block`), the head (:meth:`record_head`) and,
        with ``to_input``, the input (:meth:`record_input`); the attention probabilities of ``grad_blocks`` are
        made differentiable (for ``d logit / d A``). ``layer_outputs``: also the outputs of the Linear layers
        that nothing else needs (``fc1``), for rule sets whose Linear rule reads them
        (:attr:`RuleSet.linear_uses_output`). On a topology that :attr:`streams_attention`, the maps of the blocks
        from :attr:`streamed_attention_from` up are not recorded (the engine receives them recomputed during the
        backward)."""
        streamed = self.streamed_attention_from
        for l in blocks:
            if streamed is None or l < streamed:
                self.adapter.recording.attention(rec, l, ("attn", l), require_grad=l in grad_blocks)
            self.record_block(rec, l, layer_outputs)
        self.record_head(rec, layer_outputs)
        if to_input:
            self.record_input(rec)

    def record_block(self, rec: ActivationRecorder, layer: int, layer_outputs: bool) -> None:
        """The keys of :func:`~methods.lrp.sublayers.block_tensors` for block ``layer``
        (:func:`~methods.lrp.sublayers.record_block`) and, with layer scale, the scaled branches."""
        record_block(rec, self.adapter, layer, layer_outputs)
        self.record_scaled_branches(rec, layer)

    def record_scaled_branches(self, rec: ActivationRecorder, layer: int) -> None:
        """With layer scale, the scaled attention and MLP branches of block ``layer`` (:meth:`layer_scales`)."""
        scales = self.layer_scales(layer)
        if scales is not None:
            rec.output(scales[0][0], ("scaled_attn_out", layer))
            rec.output(scales[1][0], ("scaled_mlp_out", layer))

    def record_head(self, rec: ActivationRecorder, layer_outputs: bool) -> None:
        """Hooks for what :meth:`head_relprop` reads."""
        raise NotImplementedError  # pragma: no cover - per family

    def record_input(self, rec: ActivationRecorder) -> None:
        """Hooks for what :meth:`input_relprop` reads."""
        raise NotImplementedError  # pragma: no cover - per family

    # ------------------------------------------------------------------ relevance pass
    @torch.no_grad()
    def block_relprop(self, rules, acts, layer: int, relevance: Tensor, need_below: bool):
        """Relevance through block ``layer`` of a stock pre-norm block (the shared sub-layers of
        :func:`methods.lrp.sublayers.block_relprop`): ``(R at the block input or None, R_A [B, H, N, N])``. With
        layer scale, the scaled branches and the Linear layers with the scales folded in (the z-rule through
        ``gamma * a`` is the identity: one input per output)."""
        linears, mlp = self.rule_linears(layer)
        extra = {}
        if layer in self.scaled:
            out, fc2 = self.scaled[layer]
            linears, mlp = replace(linears, out=out), (mlp[0], fc2)
            extra = dict(attn_out=acts.pop(("scaled_attn_out", layer)), mlp_out=acts.pop(("scaled_mlp_out", layer)))
        return block_relprop(rules, block_tensors(acts, layer, **extra), linears, mlp, self.adapter.token_flow.heads,
                             relevance, need_below)

    def stops_at_encoder_input(self) -> bool:
        """Whether full LRP stops at the encoder input (``input_point="encoder_input"``; else at the token
        embeddings); ``ValueError`` for an input point not in :attr:`input_points`."""
        if self.input_point not in self.input_points:
            raise ValueError(f"input_point must be one of {self.input_points}, got {self.input_point!r}")
        return self.input_point == "encoder_input"


def topology_for(adapter: ModelAdapter):
    """The LRP topology of ``adapter``'s family; :class:`~methods.adapters.MethodUndefinedError` naming the
    supported families otherwise."""
    cls = TOPOLOGIES.get(type(adapter))
    if cls is None:
        raise MethodUndefinedError(
            f"no LRP topology for model class {type(adapter.model).__name__} ({adapter.family}); "
            f"supported families: {', '.join(a.family for a in TOPOLOGIES)}"
        )
    return cls(adapter)


def refuse(what: str, problems: List[str], supported: str = "") -> None:
    """Where there are ``problems``, :class:`~methods.adapters.MethodUndefinedError` "LRP rules are not defined
    for this ``what``: " the first six of them, then ``supported``."""
    if problems:
        raise MethodUndefinedError(f"LRP rules are not defined for this {what}: {'; '.join(problems[:6])}{supported}")


def linear_layer_problems(adapter: ModelAdapter) -> List[str]:
    """The blocks whose q, k, v, output projections or MLP layers are not ``nn.Linear`` (the Linear rule's
    layers, for the families whose blocks have separate projections)."""
    problems = []
    for i in range(len(adapter.blocks)):
        linears = adapter.linears(i).attention
        if not all(isinstance(x, nn.Linear) for x in (linears.q, linears.k, linears.v, linears.out)):
            problems.append(f"layer {i} attention projections are not nn.Linear")
        if not all(isinstance(x, nn.Linear) for x in adapter.linears(i).mlp):
            problems.append(f"layer {i} MLP layers are not nn.Linear")
    return problems
