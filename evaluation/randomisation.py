"""Model-parameter randomisation for the sanity checks (Adebayo et al. 2018, "Sanity checks for saliency maps",
sec. 3.1: cascading and independent randomisation), at the granularity of a Transformer's blocks.

Groups (:func:`randomisation_groups`), bottom-up: ``embedding`` (every parameter outside the blocks that does not
follow the adapter's last block in the model's parameter order: patch / token embedding, class, distillation and
register tokens, position embeddings), ``block_0`` ... ``block_{L-1}`` (the adapter's blocks,
``methods.adapters.adapter_for(model).blocks``), ``head`` (every parameter after the last block: final norm,
pooling, classifier). In the CLIP wrappers the other tower's parameters fall into ``embedding`` or ``head`` by the
same order rule.

Randomisation (:func:`randomised_copy`) works on a deep copy (the caller's model is never written: checked) and
replaces **every** parameter of the chosen groups, whatever module owns it (fused ``qkv``, ``nn.MultiheadAttention``'s
``in_proj_weight`` / ``in_proj_bias``, tokens, position tables, relative-position bias tables), by a draw
``mean + s * z``, z ~ N(0, 1), with ``mean`` the tensor's own mean and ``s`` its own standard deviation floored at
``min_std`` (normalisation layers: at ``norm_std``, so that a norm gets random affine parameters, not the identity
that ``LayerNorm.reset_parameters()`` restores). Each tensor's draw is seeded by ``(seed, its name)`` alone, so a
parameter gets the same random values in every step of a cascade and in an independent step. Buffers (index
tables, fixed sin-cos positions) are left alone. :func:`coverage` is the fraction of parameter entries changed.
"""
from __future__ import annotations

import copy
import zlib
from typing import Dict, Iterator, List, Sequence, Tuple

import torch
from torch import nn

from methods.adapters import adapter_for

ORDERS = ("top_down", "bottom_up", "independent")


def randomisation_groups(model: nn.Module) -> List[Tuple[str, List[str]]]:
    """``[(group, parameter names)]`` bottom-up: ``embedding``, ``block_<i>`` per adapter block, ``head``
    (module docstring); empty groups are left out. A model no adapter supports is a ``TypeError`` (the adapter's)."""
    blocks = adapter_for(model).blocks
    owner: Dict[int, int] = {}
    for i, block in enumerate(blocks):
        for parameter in block.parameters():
            owner[id(parameter)] = i
    names = [(name, owner.get(id(p))) for name, p in model.named_parameters()]
    block_rows = [k for k, (_, b) in enumerate(names) if b is not None]
    if not block_rows:
        raise ValueError("randomisation: the adapter's blocks hold no parameter of the model")
    last = block_rows[-1]
    groups: Dict[str, List[str]] = {"embedding": []}
    groups.update({f"block_{i}": [] for i in range(len(blocks))})
    groups["head"] = []
    for k, (name, block) in enumerate(names):
        if block is not None:
            groups[f"block_{block}"].append(name)
        else:
            groups["head" if k > last else "embedding"].append(name)
    return [(g, members) for g, members in groups.items() if members]


def _norm_parameters(model: nn.Module) -> set:
    """Names of the parameters owned by normalisation layers (a module class named ``*Norm*``)."""
    out = set()
    for prefix, module in model.named_modules():
        if "norm" in type(module).__name__.lower():
            out |= {f"{prefix}.{n}" if prefix else n for n, _ in module.named_parameters(recurse=False)}
    return out


def _draw(name: str, like: torch.Tensor, seed: int, floor: float) -> torch.Tensor:
    values = like.detach().to(torch.float64).cpu()
    mean = values.mean() if values.numel() else torch.tensor(0.0, dtype=torch.float64)
    std = values.std() if values.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)
    scale = max(float(std), floor)
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + zlib.crc32(name.encode()))
    z = torch.randn(values.shape, generator=gen, dtype=torch.float64)
    return (mean + scale * z).to(dtype=like.dtype, device=like.device)


def randomised_copy(model: nn.Module, groups: Sequence[str], seed: int = 0, min_std: float = 0.02,
                    norm_std: float = 0.5) -> nn.Module:
    """A deep copy of ``model`` whose parameters of ``groups`` (names of :func:`randomisation_groups`) are random
    (module docstring); the copy is in eval mode and needs no gradient. An unknown group is a ``ValueError``."""
    if min_std <= 0 or norm_std <= 0:
        raise ValueError(f"randomisation: min_std and norm_std must be > 0, got {min_std}, {norm_std}")
    known = dict(randomisation_groups(model))
    unknown = [g for g in groups if g not in known]
    if unknown:
        raise ValueError(f"randomisation: unknown groups {unknown}; the model has {list(known)}")
    chosen = {name for g in groups for name in known[g]}
    clone = copy.deepcopy(model)
    originals = {id(p) for p in model.parameters()} | {p.data_ptr() for p in model.parameters() if p.numel()}
    norms = _norm_parameters(clone)
    with torch.no_grad():
        for name, parameter in clone.named_parameters():
            if id(parameter) in originals or (parameter.numel() and parameter.data_ptr() in originals):
                raise RuntimeError(f"randomisation: the copy shares parameter {name!r} with the user's model")
            if name in chosen:
                parameter.copy_(_draw(name, parameter, seed, norm_std if name in norms else min_std))
    clone.requires_grad_(False)
    return clone.eval()


def randomisation_steps(model: nn.Module, order: str = "top_down") -> List[Tuple[str, List[str]]]:
    """``[(step name, groups randomised at that step)]``: ``top_down`` cascades from the head down to the
    embedding (the last step randomises everything), ``bottom_up`` from the embedding up, ``independent`` one
    group at a time."""
    if order not in ORDERS:
        raise ValueError(f"randomisation: order must be one of {ORDERS}, got {order!r}")
    names = [g for g, _ in randomisation_groups(model)]
    if order == "independent":
        return [(g, [g]) for g in names]
    sequence = names[::-1] if order == "top_down" else names
    return [(g, sequence[:k + 1]) for k, g in enumerate(sequence)]


def randomised_models(model: nn.Module, order: str = "top_down", seed: int = 0, **options: float
                      ) -> Iterator[Tuple[str, nn.Module]]:
    """``(step name, randomised copy)`` for every step of :func:`randomisation_steps`."""
    for step, groups in randomisation_steps(model, order):
        yield step, randomised_copy(model, groups, seed, **options)


def coverage(original: nn.Module, randomised: nn.Module) -> float:
    """The fraction of parameter entries of ``original`` whose value differs in ``randomised`` (same names)."""
    theirs = dict(randomised.named_parameters())
    changed = total = 0
    for name, parameter in original.named_parameters():
        if name not in theirs or theirs[name].shape != parameter.shape:
            raise ValueError(f"coverage: the two models differ at parameter {name!r}")
        changed += int((theirs[name].detach() != parameter.detach()).sum())
        total += parameter.numel()
    return changed / total if total else 0.0
