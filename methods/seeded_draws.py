"""Per-sample random generators: every random draw of a sampling method (SmoothGrad's noise, KernelSHAP's and
LIME's coalitions) comes from a CPU ``torch.Generator`` seeded by ``(seed, purpose, sample id)``, so a sample gets
the same draws whatever its batch, its position in it, the process or the device (draws are made on the CPU and
moved). The id is the call's ``sample_ids`` entry (the evaluation passes each dataset index); without ids a sample
is keyed by a hash of its real input values (padding left out), as :mod:`methods.random_baseline` does.
"""
from __future__ import annotations

import hashlib
from typing import List

import torch
from torch import Tensor

from .adapters import ModelAdapter, ModelInputs


def generator_for(key: str) -> torch.Generator:
    """A CPU generator seeded by the sha256 of ``key`` (63 bits)."""
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") & ((1 << 63) - 1)
    return torch.Generator().manual_seed(seed)


def sample_keys(adapter: ModelAdapter, inputs: ModelInputs, seed: int, purpose: str) -> List[str]:
    """One key per sample of ``inputs``: ``"<seed>:<purpose>:index:<id>"`` from ``sample_ids``, else a digest of
    the sample's real input values."""
    if inputs.sample_ids is not None:
        return [f"{seed}:{purpose}:index:{int(i)}" for i in inputs.sample_ids.tolist()]
    name = "pixel_values" if "pixel_values" in inputs.tensors else "input_ids"
    samples = adapter.inputs.layout(inputs).without_padding(inputs[name])
    return [f"{seed}:{purpose}:values:" + hashlib.sha256(s.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
            for s in samples]


def sample_generators(adapter: ModelAdapter, inputs: ModelInputs, seed: int, purpose: str) -> List[torch.Generator]:
    """One seeded CPU generator per sample (:func:`sample_keys`)."""
    return [generator_for(key) for key in sample_keys(adapter, inputs, seed, purpose)]


def normal_noise(generator: torch.Generator, shape: tuple, std: float) -> Tensor:
    """``N(0, std^2)`` draws of ``shape`` on the CPU, drawn as Captum's ``NoiseTunnel`` draws them
    (``torch.normal(0, std)`` with a float32 ``std`` tensor; float32 values), from ``generator``."""
    return torch.normal(0.0, torch.full(shape, float(std), dtype=torch.float32), generator=generator)
