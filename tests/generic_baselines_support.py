"""What the generic-baseline tests share: families by name, padded batches of any size, Captum's view of a model."""
from __future__ import annotations

from typing import Dict, List

import torch
from torch import Tensor

from methods.adapters import adapter_for
from methods.input_points import reduce_scores, resolve_point
from methods.seeded_draws import generator_for, sample_keys
from tests.families import FAMILIES, Family

#: the four models of the Captum goldens: a timm ViT, a BERT, decoders (left / right padding), a CLIP tower
GOLDEN_FAMILIES = ("timm_vit_cls", "hf_bert_types_special", "hf_gpt2_left", "hf_qwen3_right", "hf_clip_text",
                   "hf_clip_vision")
#: padding values of a token batch's tensors
PAD_VALUES = {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0, "special_tokens_mask": 1}


def family(name: str) -> Family:
    return next(f for f in FAMILIES if f.name == name)


def samples(fam: Family) -> List[object]:
    """Six distinct unpadded samples of ``fam`` (lengths 9 and 6 for text)."""
    out = []
    for batch in (1, 2, 3):
        inputs = fam.inputs(batch)
        out += [fam.single(inputs, i) for i in range(batch)]
    return out


def left_padded(fam: Family) -> bool:
    padding = fam.padding(fam.inputs(3))
    return padding is not None and bool(padding[2, 0])


def batch_of(fam: Family, rows: List[object]) -> object:
    """``rows`` (unpadded samples) as one batch, padded on the family's side to the longest."""
    if isinstance(rows[0], Tensor):
        return torch.cat(rows)
    n = max(r["input_ids"].shape[1] for r in rows)
    left = left_padded(fam)
    out: Dict[str, List[Tensor]] = {k: [] for k in rows[0]}
    for r in rows:
        for k, v in r.items():
            pad = torch.full((1, n - v.shape[1]), PAD_VALUES[k], dtype=v.dtype)
            out[k].append(torch.cat([pad, v] if left else [v, pad], dim=1))
    return {k: torch.cat(v) for k, v in out.items()}


def unpadded_row(fam: Family, batch: object, out: Tensor, i: int, length: int) -> Tensor:
    """Row ``i`` of a batched output at the real positions of a sample of ``length`` tokens."""
    if isinstance(batch, Tensor) or out.shape[1] == length:
        return out[i:i + 1]
    return out[i:i + 1, -length:] if left_padded(fam) else out[i:i + 1, :length]


def length_of(sample: object) -> int:
    return int(sample.shape[-1]) if isinstance(sample, Tensor) else int(sample["input_ids"].shape[1])


def assert_batched_equals_alone(fam: Family, model, method, pool: List[object], label: str,
                                id_offset: int = 0) -> List[Tensor]:
    """``method`` on each sample of ``pool`` alone (target ``i % 5``, sample id ``id_offset + i``), then on padded
    batches of 1, 3 and 16 of them: every row equals its sample alone within 1e-6 of the largest score, padding
    exactly 0. Returns the rows alone."""
    alone = [method(model, s, target=i % 5, sample_ids=[id_offset + i]) for i, s in enumerate(pool)]
    for size in (1, 3, 16):
        rows = [i % len(pool) for i in range(size)]
        batch = batch_of(fam, [pool[r] for r in rows])
        out = method(model, batch, target=torch.tensor([r % 5 for r in rows]),
                     sample_ids=[id_offset + r for r in rows])
        for i, r in enumerate(rows):
            row = unpadded_row(fam, batch, out, i, length_of(pool[r]))
            torch.testing.assert_close(row, alone[r], rtol=0, atol=1e-6 * max(1.0, float(alone[r].abs().max())),
                                       msg=f"{label}: row {i} (sample {r}) at batch {size}")
        padding = fam.padding(batch) if not isinstance(batch, Tensor) else None
        if padding is not None and padding.any():
            assert (out[padding] == 0).all(), label
    return alone


def captum_view(model, inputs, point: str = "auto"):
    """``(adapter, batch, point, layout)`` of ``inputs``, for reducing Captum's element-wise maps as ours."""
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare(inputs)
    return adapter, batch, resolve_point(adapter, point, "test"), adapter.inputs.layout(batch)


def reduced(model, inputs, values: Tensor, reduction: str = "sum", point: str = "auto") -> Tensor:
    """Captum's element-wise ``values`` reduced per token / patch as the methods reduce theirs, padding 0."""
    adapter, batch, point, layout = captum_view(model, inputs, point)
    scores = reduce_scores(adapter, batch, point, values, reduction)
    return layout.output(scores) if layout.has_padding else scores


def sample_seed(model, sample, seed: int, purpose: str) -> int:
    """The seed of sample id 7's draws for ``purpose`` (``methods.seeded_draws``): Captum seeded with it draws the
    same coalitions / noise as the method."""
    adapter = adapter_for(model)
    keys = sample_keys(adapter, adapter.inputs.prepare(sample, sample_ids=[7]), seed, purpose)
    return generator_for(keys[0]).initial_seed()


def captum_surrogate(kind: str, forward):
    """Captum 0.9.0's ``KernelShap`` (``kind="kernel_shap"``) or ``Lime`` with the Lasso the LIME tests compare with,
    explaining ``forward``."""
    import captum.attr as captum_attr
    from captum._utils.models.linear_model import SkLearnLasso
    if kind == "kernel_shap":
        return captum_attr.KernelShap(forward)
    return captum_attr.Lime(forward, interpretable_model=SkLearnLasso(alpha=0.01, tol=1e-14, max_iter=1000000))
