"""Registry of LRP topologies: one per adapter class (model family)."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple, Type, TypeVar

import torch
from torch import Tensor, nn

from ..adapters import MethodUndefinedError, ModelAdapter
from .sublayers import block_relprop, block_tensors

T = TypeVar("T", bound="Type[Topology]")
TOPOLOGIES: Dict[Type[ModelAdapter], Type[Topology]] = {}


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
    shared sub-layers of :mod:`methods.lrp.sublayers`.

    Engine options (set by :class:`~methods.lrp.engine.LRPEngine` on every topology; a family without the
    capability ignores them): ``mask_value``, the additive mask the Add rule sees at padded keys (families with
    padding masks); ``input_point``, where full LRP stops: one of ``input_points`` (empty: the family has one
    input, e.g. the pixels); ``streamed_attention_from``, on a topology that ``streams_attention`` (its
    adapter's :meth:`~methods.adapters.ModelAdapter.recomputed_attention`): the first block whose attention map is
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

    @torch.no_grad()
    def block_relprop(self, rules, acts, layer: int, relevance: Tensor, need_below: bool):
        """Relevance through block ``layer`` of a stock pre-norm block (the shared sub-layers of
        :func:`methods.lrp.sublayers.block_relprop`): ``(R at the block input or None, R_A [B, H, N, N])``."""
        tensors = block_tensors(acts, layer)
        return block_relprop(rules, tensors, self.adapter.attention_linears(layer), self.adapter.mlp_linears(layer),
                             self.adapter.num_heads, relevance, need_below)


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


def linear_layer_problems(adapter: ModelAdapter) -> List[str]:
    """The blocks whose q, k, v, output projections or MLP layers are not ``nn.Linear`` (the Linear rule's
    layers, for the families whose blocks have separate projections)."""
    problems = []
    for i in range(adapter.depth):
        linears = adapter.attention_linears(i)
        if not all(isinstance(x, nn.Linear) for x in (linears.q, linears.k, linears.v, linears.out)):
            problems.append(f"layer {i} attention projections are not nn.Linear")
        if not all(isinstance(x, nn.Linear) for x in adapter.mlp_linears(i)):
            problems.append(f"layer {i} MLP layers are not nn.Linear")
    return problems
