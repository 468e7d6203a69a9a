"""Features of a sample and their replacement by a baseline: what occlusion, KernelSHAP and LIME perturb.

A feature is a content position: a content token of a sequence (not a special token, not padding) or a patch of
an image. Replacing it puts the baseline there at the input point (:mod:`methods.input_points`): the baseline
id's word embedding (or the zero embedding) at that position, the attention mask kept (so the sequence keeps its
length and positions, unlike ``token_ablation``'s removal); the baseline image's pixels over the patch. The model
then runs its own forward (:func:`methods.input_points.logits_at`). Rows of many samples and coalitions are
evaluated ``batch_size`` at a time; rows never interact, so a sample's values do not depend on its batch.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .adapters import ModelAdapter, ModelInputs, PatchGrid
from .explained_output import ExplainedOutput
from .explanation_targets import explained_scores
from .input_baselines import IMAGENET_MEAN, IMAGENET_STD, baseline_values, check_baseline
from .input_points import logits_at, point_values, resolve_point, select_rows


def feature_positions(adapter: ModelAdapter, inputs: ModelInputs) -> List[Tensor]:
    """Per sample, the positions of its features: content token positions (``LongTensor[M_b]``), or for images
    the patch indices ``0 .. P - 1`` in row-major grid order."""
    layout = adapter.inputs.layout(inputs)
    if isinstance(layout, PatchGrid):
        return [torch.arange(layout.num_scores) for _ in range(inputs.batch_size)]
    content = layout.content_positions(inputs["input_ids"]).cpu()
    return [row.nonzero().flatten() for row in content]


def present_elements(adapter: ModelAdapter, inputs: ModelInputs, sample: int, present: Tensor,
                     x: Tensor) -> Tensor:
    """A bool mask broadcastable to ``x[sample]``-shaped rows, ``[S, ...]``: where coalitions ``present``
    (``[S, M]`` bool over the sample's features) keep the input; every non-feature position is kept."""
    layout = adapter.inputs.layout(inputs)
    if isinstance(layout, PatchGrid):
        rows, cols = layout.grid
        height, width = x.shape[-2:]
        grid = present.reshape(-1, rows, cols)
        pixels = grid.repeat_interleave(height // rows, dim=1).repeat_interleave(width // cols, dim=2)
        return pixels[:, None].to(x.device)
    positions = feature_positions(adapter, inputs)[sample]
    keep = torch.ones(present.shape[0], x.shape[1], dtype=torch.bool)
    keep[:, positions] = present.cpu()
    return keep[..., None].to(x.device)


def replaced_values(adapter: ModelAdapter, inputs: ModelInputs, sample: int, present: Tensor, x: Tensor,
                    start: Tensor) -> Tensor:
    """``[S, ...]`` values at the point: sample ``sample``'s ``x`` where ``present``, its baseline ``start``
    elsewhere."""
    keep = present_elements(adapter, inputs, sample, present, x)
    return torch.where(keep, x[sample][None], start[sample][None])


def coalition_scores(adapter: ModelAdapter, inputs: ModelInputs, point: str, x: Tensor, start: Tensor,
                     coalitions: List[Tensor], target: Tensor, foil: Optional[Tensor], explain: str,
                     batch_size: int) -> List[Tensor]:
    """The explained score (:func:`~methods.explanation_targets.explained_scores`) of every coalition of every
    sample: ``coalitions[b]`` ``[S_b, M_b]`` bool (``True``: the feature is present); ``[S_b]`` per sample."""
    jobs: List[Tuple[int, int]] = [(b, s) for b, c in enumerate(coalitions) for s in range(len(c))]
    scores = [torch.empty(len(c), dtype=x.dtype, device=x.device) for c in coalitions]
    for i in range(0, len(jobs), batch_size):
        chunk = jobs[i:i + batch_size]
        rows = torch.tensor([b for b, _ in chunk])
        parts = []
        for b in dict.fromkeys(int(r) for r in rows):    # each sample's rows of the chunk, in order
            picked = torch.tensor([s for bb, s in chunk if bb == b])
            parts.append(replaced_values(adapter, inputs, b, coalitions[b][picked], x, start))
        values = torch.cat(parts)
        with torch.no_grad():
            logits = logits_at(adapter, select_rows(inputs, rows), point, values)
        out = explained_scores(logits, target[rows.to(target.device)], explain,
                               None if foil is None else foil[rows.to(foil.device)])
        for (b, s), value in zip(chunk, out):
            scores[b][s] = value
    return scores


class ReplacementAttribution(ExplainedOutput):
    """The options and set-up shared by the methods that replace features by a baseline (occlusion, KernelSHAP,
    LIME): ``baseline``, ``batch_size`` (rows per forward), the explained output, and the image baselines'
    ``image_mean`` / ``image_std`` / ``blur_sigma``; the input point is the family's default (``"auto"``)."""

    reads_attention = False

    def __init__(self, baseline: Any = "zero", batch_size: int = 64, explain: str = "logit",
                 foil: Optional[int] = None, image_mean: Sequence[float] = IMAGENET_MEAN,
                 image_std: Sequence[float] = IMAGENET_STD, blur_sigma: float = 5.0):
        super().__init__(explain, foil)
        self.baseline = check_baseline(baseline, self.name)
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise ValueError(f"{self.name}: batch_size must be a positive int, got {batch_size!r}")
        self.batch_size = batch_size
        self.image_mean, self.image_std, self.blur_sigma = tuple(image_mean), tuple(image_std), float(blur_sigma)

    def check_adapter(self, adapter: ModelAdapter) -> None:
        super().check_adapter(adapter)
        resolve_point(adapter, "auto", self.name)

    def replacement_start(self, adapter: ModelAdapter, inputs: ModelInputs) -> Tuple[str, Tensor, Tensor]:
        """``(point, x, start)``: the input point, the inputs' values there and the baseline's values there."""
        point = resolve_point(adapter, "auto", self.name)
        x = point_values(adapter, inputs, point)
        start = baseline_values(adapter, inputs, point, self.baseline, self.name, x, image_mean=self.image_mean,
                                image_std=self.image_std, blur_sigma=self.blur_sigma)
        return point, x, start
