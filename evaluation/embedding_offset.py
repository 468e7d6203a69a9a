"""Continuous perturbations of a text in embedding space (Yeh et al. 2019's infidelity and max-sensitivity on texts,
decoders and CLIP's text tower; :mod:`callbacks.robustness`).

* :func:`embedding_noise`: each sample's perturbation ``[N, D]`` at the output of the adapter's input embedding
  (the word embeddings, before position and token-type shares). Only the *perturbable* positions are drawn, in order
  (the real tokens; special tokens only when asked): their values come from
  :func:`evaluation.robustness.sample_noise` seeded with ``(seed, sample index)`` for the sample's own count of
  positions, so a sample's draws do not depend on its batch, its padding or the process. Padding is never perturbed.
  ``scale="absolute"``: the std / radius in embedding units; ``"relative"``: multiplied by the sample's
  per-coordinate embedding scale ``mean_t ‖e_t‖₂ / √D`` over the perturbable positions (a token's noise norm is
  then about ``std`` times its typical embedding norm, whatever the model's embedding scale).
* :func:`offset_embeddings`: the context in which the input embedding module adds a per-row offset ``[M, N, D]``
  to its output, whatever rows a method feeds it: a call of ``k M`` rows that repeat the ``M`` inputs copy-major
  gets the offset repeated; otherwise each row is matched to the input whose token ids it carries; a row of ids
  that is none of the inputs (a baseline the method builds, e.g. an all-``[PAD]`` text) is left unperturbed; a row
  matching several inputs with different offsets is an error.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Sequence, Tuple

import torch
from torch import Tensor, nn

from .robustness import sample_noise

SCALES = ("relative", "absolute")


def embedding_scale(embeddings: Tensor, perturbable: Tensor) -> Tensor:
    """float64 ``[B]``: each sample's mean embedding norm over its perturbable positions, divided by √D."""
    norms = embeddings.detach().to(torch.float64).norm(dim=-1) * perturbable.to(torch.float64)
    count = perturbable.sum(dim=-1).clamp(min=1).to(torch.float64)
    return (norms.sum(dim=-1) / count / embeddings.shape[-1] ** 0.5).cpu()


def embedding_noise(sample_ids: Sequence[int], perturbable: Tensor, width: int, runs: int, seed: int, kind: str,
                    std: float, scales: Tensor) -> Tensor:
    """float64 ``[R, B, N, D]`` (``D = width``): ``kind`` (``infidelity``: Gaussian, ``sensitivity``: uniform)
    draws at each sample's perturbable positions (``perturbable`` bool ``[B, N]``), scaled by ``std * scales[b]``,
    zero elsewhere (module docstring)."""
    perturbable = perturbable.bool().cpu()
    out = torch.zeros(runs, perturbable.shape[0], perturbable.shape[1], width, dtype=torch.float64)
    for row, sample in enumerate(int(s) for s in sample_ids):
        where = perturbable[row].nonzero().flatten()
        draws = sample_noise([sample], (len(where), width), runs, seed, kind, std * float(scales[row]))[:, 0]
        out[:, row, where] = draws
    return out


def _rows_of(ids: Tensor, inputs: Tensor, offsets: Tensor) -> Tensor:
    """For each row of ``ids`` ``[m, N]``: the index of the input row (of ``inputs`` ``[M, N]``) whose offset it
    gets, or -1 (none matches: unperturbed)."""
    m, total = ids.shape[0], inputs.shape[0]
    if m % total == 0 and torch.equal(ids, inputs.repeat(m // total, 1)):
        return torch.arange(m) % total
    same = (ids[:, None, :] == inputs[None, :, :]).all(dim=-1).cpu()     # [m, M]
    rows = torch.full((m,), -1, dtype=torch.long)
    flat = offsets.flatten(1)
    for j in range(m):
        hits = same[j].nonzero().flatten()
        if len(hits) == 0:
            continue
        if any(not torch.equal(flat[int(h)], flat[int(hits[0])]) for h in hits[1:]):
            raise ValueError(f"embedding offset: a row of the method's call carries the token ids of inputs "
                             f"{hits.tolist()}, which have different perturbations: it cannot be told which one "
                             "it is (identical texts in one batch, explained by a method that regroups rows)")
        rows[j] = int(hits[0])
    return rows


@contextlib.contextmanager
def offset_embeddings(module: nn.Module, input_ids: Tensor, offset: Tensor) -> Iterator[None]:
    """Within it, ``module`` (the input embedding, called with token ids ``[m, N]``) returns its output plus the
    offset of the input (``input_ids`` ``[M, N]``, ``offset`` ``[M, N, D]``) each row is (module docstring)."""
    if offset.shape[:2] != input_ids.shape:
        raise ValueError(f"embedding offset: shape {tuple(offset.shape)} does not fit the inputs' token ids "
                         f"{tuple(input_ids.shape)} ([M, N, D] expected)")
    seen: Dict[str, Any] = {}

    def before(_module: nn.Module, args: Tuple[Any, ...]) -> None:
        ids = args[0] if args else None
        if not isinstance(ids, Tensor) or ids.dtype.is_floating_point:
            raise ValueError(f"embedding offset: the input embedding {type(_module).__name__} is not called with "
                             "token ids; the offset needs the ids to tell which input each row is")
        seen["ids"] = ids

    def after(_module: nn.Module, _args: Tuple[Any, ...], output: Tensor) -> Tensor:
        ids = seen.pop("ids")
        if ids.shape[1] != input_ids.shape[1] or output.shape[-1] != offset.shape[-1]:
            raise ValueError(f"embedding offset: the method embeds {tuple(output.shape)} but the offset is "
                             f"{tuple(offset.shape)}: a method that changes the sequence length cannot be re-explained "
                             "under an embedding perturbation")
        rows = _rows_of(ids.to(input_ids.device), input_ids, offset)
        padded = torch.cat([offset, torch.zeros_like(offset[:1])])          # row -1: no offset
        return (output.to(torch.float64) + padded[rows].to(output.device)).to(output.dtype)

    handles = [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
