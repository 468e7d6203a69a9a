"""Occlusion by replacement: how much the explained output drops when a window of the input is replaced by a
baseline.

Zeiler & Fergus 2014, "Visualizing and Understanding Convolutional Networks" (Sec. 4.2); Captum 0.9.0
``Occlusion`` (images) and ``FeatureAblation`` (one token at a time). Score of an element: the mean over the
windows that cover it of ``y(x) - y(x with the window replaced)``, ``y`` the explained output (``explain``,
:mod:`methods.explanation_targets`).

* Images: windows of ``window`` pixels (default: the patch size) moved by ``stride`` (default: the window) over
  the normalised image, all channels at once, replaced by the baseline image's pixels (``baseline``: ``"zero"``
  default, ``"black"``, ``"blur"`` or a tensor, :mod:`methods.input_baselines`); Captum's pixel map reduced to
  ``[B, P]`` by its **mean** over each patch (with the default window and stride each patch's score is exactly
  the drop when that patch is replaced); pixels no window covers score 0.
* Sequences: windows of ``window`` consecutive content tokens (default 1: each content token alone; special
  tokens and padding are skipped, never counted) moved by ``stride`` (default: the window) over each sample's
  content tokens: Captum's ``ceil((M - window) / stride) + 1`` windows for ``M`` content tokens, the last one cut
  at the sequence's end (one window of all of them where ``M < window``, which Captum refuses), replaced by the
  ``baseline`` (``"zero"``: the zero word embedding; ``"pad"`` / ``"mask"`` / ``"unk"`` or an id) with the
  attention mask kept, unlike ``token_ablation``, which removes it; content tokens no window covers (a stride
  longer than the window), special tokens and padding score 0.

``batch_size``: perturbed rows per forward. One clean forward plus one per window (token).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .adapters import ModelAdapter, ModelInputs, PatchGrid
from .explanation_targets import explained_scores
from .feature_replacement import ReplacementAttribution, coalition_scores, feature_positions
from .input_baselines import IMAGENET_MEAN, IMAGENET_STD
from .input_points import logits_at, select_rows
from .registry import register_method
from .targets import TargetType

Size = Optional[Union[int, Sequence[int]]]


def _pair(value: Size, default: Tuple[int, int], option: str) -> Tuple[int, int]:
    if value is None:
        return default
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= 1 for v in pair):
        raise ValueError(f"occlusion: {option} must be a positive int or (height, width), got {value!r}")
    return (int(pair[0]), int(pair[1]))


def token_windows(count: int, window: int, stride: int) -> Tensor:
    """``[W, count]`` bool: the windows over ``count`` content tokens (module docstring)."""
    if count == 0:
        return torch.zeros(0, 0, dtype=torch.bool)
    starts = torch.arange(-(-max(count - window, 0) // stride) + 1) * stride
    index = torch.arange(count)
    return (index[None, :] >= starts[:, None]) & (index[None, :] < starts[:, None] + window)


def window_corners(size: Tuple[int, int], window: Tuple[int, int], stride: Tuple[int, int]) -> Tensor:
    """``[W, 2]`` top-left corners of the windows, Captum's ``ceil((size - window) / stride) + 1`` per axis: where
    the stride does not divide ``size - window`` the last window starts past ``size - window`` and is cut at the
    image's edge (as Captum's ``Occlusion`` cuts it), so every pixel is covered."""
    if window[0] > size[0] or window[1] > size[1]:
        raise ValueError(f"occlusion: window {window} is larger than the image {size}")
    tops, lefts = (torch.arange(-(-(n - w) // s) + 1) * s for n, w, s in zip(size, window, stride))
    return torch.cartesian_prod(tops, lefts).reshape(-1, 2)


@register_method("occlusion")
class Occlusion(ReplacementAttribution):
    """Occlusion by replacement (Zeiler & Fergus 2014; Captum ``Occlusion`` / ``FeatureAblation``); options
    ``window``, ``stride`` (pixels on images, content tokens on sequences), ``baseline``, ``batch_size``,
    ``explain``; see :mod:`methods.occlusion`."""

    tags = ("generic_baseline", "perturbation", "opt_in")

    def __init__(self, window: Size = None, stride: Size = None, baseline: Any = "zero", batch_size: int = 64,
                 explain: str = "logit", foil: Optional[int] = None, image_mean: Sequence[float] = IMAGENET_MEAN,
                 image_std: Sequence[float] = IMAGENET_STD, blur_sigma: float = 5.0):
        _pair(window, (1, 1), "window"), _pair(stride, (1, 1), "stride")
        super().__init__(baseline, batch_size, explain, foil, image_mean, image_std, blur_sigma)
        self.window, self.stride = window, stride

    def check_adapter(self, adapter: ModelAdapter) -> None:
        super().check_adapter(adapter)
        for option in ("window", "stride"):
            value = getattr(self, option)
            if adapter.inputs.layout_class.modality != "image" and value is not None and not isinstance(value, int):
                raise ValueError(f"occlusion: on a sequence {option} counts content tokens, one int, got {value!r}")

    def attribute(self, adapter: ModelAdapter, inputs: ModelInputs, target: TargetType) -> Tensor:
        point, x, start = self.replacement_start(adapter, inputs)
        with torch.no_grad():
            logits = logits_at(adapter, inputs, point, x)
        target, foil = self.resolve(logits, target)
        clean = explained_scores(logits, target, self.explain, foil)
        layout = adapter.inputs.layout(inputs)
        if not isinstance(layout, PatchGrid):
            positions = feature_positions(adapter, inputs)
            window, stride = _pair(self.window, (1, 1), "window")[0], _pair(self.stride, (0, 0), "stride")[0]
            hidden = [token_windows(len(p), window, stride or window) for p in positions]
            dropped = coalition_scores(adapter, inputs, point, x, start, [~h for h in hidden], target, foil,
                                       self.explain, self.batch_size)
            scores = torch.zeros(inputs.batch_size, layout.num_scores, dtype=x.dtype, device=x.device)
            for b, (p, h, d) in enumerate(zip(positions, hidden, dropped)):
                covered = h.to(device=x.device, dtype=x.dtype)
                drops = (clean[b] - d) @ covered / covered.sum(dim=0).clamp(min=1)
                scores[b, p.to(x.device)] = drops
            return scores
        return self._image_scores(adapter, inputs, layout, x, start, target, foil, clean)

    def _image_scores(self, adapter: ModelAdapter, inputs: ModelInputs, layout: PatchGrid, x: Tensor, start: Tensor,
                      target: Tensor, foil: Optional[Tensor], clean: Tensor) -> Tensor:
        height, width = x.shape[-2:]
        patch = (height // layout.rows, width // layout.cols)
        window = _pair(self.window, patch, "window")
        stride = _pair(self.stride, window, "stride")
        corners = window_corners((height, width), window, stride)
        masks = torch.zeros(len(corners), height, width, dtype=torch.bool)
        for w, (top, left) in enumerate(corners.tolist()):
            masks[w, top:top + window[0], left:left + window[1]] = True
        masks = masks.to(x.device)
        batch, count = inputs.batch_size, len(corners)
        drops = torch.empty(batch, count, dtype=x.dtype, device=x.device)
        jobs = [(b, w) for b in range(batch) for w in range(count)]
        for i in range(0, len(jobs), self.batch_size):
            chunk = jobs[i:i + self.batch_size]
            rows = torch.tensor([b for b, _ in chunk], device=x.device)
            windows = torch.tensor([w for _, w in chunk], device=x.device)
            hidden = masks[windows][:, None]
            values = torch.where(hidden, start[rows], x[rows])
            with torch.no_grad():
                logits = logits_at(adapter, select_rows(inputs, rows), "pixels", values)
            out = explained_scores(logits, target[rows], self.explain, None if foil is None else foil[rows])
            drops[rows, windows] = clean[rows] - out
        covered = masks.to(x.dtype)
        counts = covered.sum(dim=0)
        pixel_map = torch.einsum("bw,whv->bhv", drops, covered) / counts.clamp(min=1)
        rows_, cols_ = layout.grid
        return pixel_map.reshape(batch, rows_, patch[0], cols_, patch[1]).mean(dim=(2, 4)).flatten(1)
