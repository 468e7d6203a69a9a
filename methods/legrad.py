"""LeGrad: per-layer gradients of a logit-lens score through each block's attention (Bousselham et al., ICCV 2025).

Long notes (the reference's conventions, its bug under today's open_clip, the goldens): ``docs/legrad.md``.
"""
from __future__ import annotations

from typing import List, Union

import torch
from torch import Tensor

from .adapters import ActivationRecorder, MethodUndefinedError, ModelAdapter, ModelInputs, SequenceContext
from .base import AttributionMethod
from .registry import OPT_IN, register_method
from .targets import TargetType, class_score, resolve_target

#: legrad-torch's ``LeWrapper(model, layer_index=-2)``: its default reads the last two blocks
PACKAGE_LAYERS = 2
#: how a block's output becomes the lens's input: the mean of every position (the reference's
#: ``compute_legrad_clip``), or the model's own read-out (its ``head`` on the block output)
POOLS = ("mean", "readout")


def check_layers(layers: Union[str, int]) -> Union[str, int]:
    if layers == "all":
        return layers
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"legrad: layers must be 'all' or a number k >= 1 of last blocks, got {layers!r}")
    return layers


def minmax_rows(scores: Tensor) -> Tensor:
    """Each row of ``scores`` ``[B, P]`` mapped to ``[0, 1]`` by its own minimum and maximum; a constant row
    (no positive gradient anywhere) gives 0s rather than the reference's 0 / 0."""
    low = scores.amin(dim=-1, keepdim=True)
    span = scores.amax(dim=-1, keepdim=True) - low
    return torch.where(span > 0, (scores - low) / torch.where(span > 0, span, torch.ones_like(span)), 0.0)


@register_method("legrad")
class LeGrad(AttributionMethod):
    """LeGrad (Bousselham et al., ICCV 2025, Sec. 3): for each chosen block ``l``, the lens score
    ``s_l = lens(pool(z_l))[c]`` of its output tokens ``z_l`` (the family's own final norm and head,
    ``ModelAdapter.lens``; CLIP / SigLIP / open_clip: the scorer's logit, a positive
    multiple of the reference's cosine plus a constant); ``E_l = mean_h mean_q ReLU(ds_l / dA_l)`` over the heads
    and every query row, [CLS] included (the reference's ``grad.mean(dim=1).mean(dim=1)``), at the patch columns;
    the map ``sum_l E_l``, min-max normalised per sample (``minmax=True``; a constant map gives 0s, not 0 / 0).
    Gradients stop at each block (``ds_l / dA_l`` through block ``l`` only): one forward, one backward.
    ``layers``: ``"all"`` (the paper) or the last ``k`` blocks (default 2: legrad-torch's ``layer_index=-2``).
    ``pool``: ``"mean"`` (default; every position's mean before the final norm, the reference's CLIP code
    ``ln_post(mean(z_l)) @ proj``) or ``"readout"`` (the model's own read-out). Departures, named: the reference's
    SigLIP / CoCa code differentiates the attention *pool* instead and subtracts an "empty prompt" map (not
    implemented); its pixel upsampling is :func:`methods.tokens_to_map`'s, which commutes with the min-max.
    Defined on the families with a ``lens`` (timm ViT / DeiT / EVA / BEiT, transformers ViT-like, CLIP / SigLIP /
    open_clip vision towers); refused by name elsewhere."""

    tags = (OPT_IN,)

    def __init__(self, layers: Union[str, int] = PACKAGE_LAYERS, pool: str = "mean", minmax: bool = True):
        if pool not in POOLS:
            raise ValueError(f"legrad: pool must be one of {POOLS}, got {pool!r}")
        self.layers = check_layers(layers)
        self.pool = pool
        self.minmax = bool(minmax)

    def check_adapter(self, adapter: ModelAdapter) -> None:
        super().check_adapter(adapter)
        if adapter.lens is None:
            raise MethodUndefinedError(f"legrad: {adapter.family}: no logit lens (adapter.lens: the final norm and "
                                       "head read at any block's output); LeGrad is defined on ViT, CLIP and SigLIP "
                                       "image towers")
        if isinstance(self.layers, int) and self.layers > len(adapter.blocks):
            raise ValueError(f"legrad: layers={self.layers} asks for more blocks than {type(adapter.model).__name__} "
                             f"has ({len(adapter.blocks)})")

    def chosen_layers(self, adapter: ModelAdapter) -> List[int]:
        depth = len(adapter.blocks)
        return list(range(depth)) if self.layers == "all" else list(range(depth - int(self.layers), depth))

    def lens(self, adapter: ModelAdapter, hidden: Tensor, context: SequenceContext) -> Tensor:
        """The lens logits ``[B, C]`` of one block's output ``[B, N, D]``."""
        if self.pool == "readout":
            return adapter.head(hidden, context)
        assert adapter.lens is not None, "check_adapter refuses a family without a lens"
        return adapter.lens.logits(hidden.mean(dim=1, keepdim=True), context)[:, 0]

    def attribute(self, adapter: ModelAdapter, inputs: ModelInputs, target: TargetType) -> Tensor:
        layers = self.chosen_layers(adapter)
        context = adapter.inputs.context(inputs)
        layout = adapter.inputs.layout(inputs)
        with torch.no_grad():
            hidden = adapter.run_blocks(adapter.embed(inputs), context, 0, layers[0])
        lens: List[Tensor] = []
        with ActivationRecorder() as rec, torch.enable_grad():
            for layer in layers:
                adapter.recording.attention(rec, layer, layer, require_grad=True)
            for layer in layers:
                # the gradient stops at the block's input: s_l reaches A_l through block l alone
                hidden = adapter.run_blocks(hidden.detach().requires_grad_(True), context, layer, layer + 1)
                lens.append(self.lens(adapter, hidden, context))
            attentions = [rec[layer] for layer in layers]
        with torch.no_grad():
            logits = adapter.head(hidden, context)
        target = resolve_target(logits, target)
        total = torch.stack([class_score(scores, target) for scores in lens]).sum()
        grads = torch.autograd.grad(total, attentions)
        rows = layout.real_positions(grads[0]).to(grads[0].dtype)          # [B, N]: every query row of the sample
        rows = rows / rows.sum(dim=-1, keepdim=True)
        merged = torch.zeros_like(rows)
        for grad in grads:   # ReLU, then the mean over heads and query rows
            merged = merged + torch.einsum("bhqk,bq->bk", grad.clamp(min=0), rows) / grad.shape[1]
        scores = layout.output(merged)
        return minmax_rows(scores) if self.minmax else scores
