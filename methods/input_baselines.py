"""Named baselines (references) of the generic baselines: what "absent" means for Integrated Gradients, occlusion,
KernelSHAP and LIME.

Sequences (``baseline=``):

* ``"zero"``: the zero vector at the input embedding of every real position (Captum's default ``baselines=0`` on
  an embedding input); padding keeps its embedding (a padded position a read-out reads, as SigLIP's last one,
  would otherwise carry attribution that the padding's exact 0 hides);
* ``"pad"``, ``"mask"``, ``"unk"`` or a token id (``int``): every content token (not a special token, not
  padding) replaced by that id, special tokens and padding kept (Captum's BERT tutorial ``[CLS] [PAD] ... [SEP]``,
  Inseq's ``UNK`` ids keeping EOS, ALTI's ``[MASK]``); a named id is read from the model's config
  (``pad_token_id``, ``mask_token_id``, ``unk_token_id``), or given as the ``int``.

Images (the normalised image, ``[B, 3, H, W]``):

* ``"zero"``: the all-zero normalised image (the dataset's mean colour; Captum's default ``baselines=0``, TIS);
* ``"black"``: pixel value 0 in normalised space, ``-mean / std`` (``image_mean`` / ``image_std``, ImageNet's by
  default);
* ``"blur"``: the image blurred by a Gaussian of standard deviation ``blur_sigma`` pixels (Fong & Vedaldi 2017),
  reflect padding, in normalised space;
* a tensor ``[3, H, W]`` or ``[B, 3, H, W]`` (normalised).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .adapters import ModelAdapter, ModelInputs
from .adapters.tokens import config_token_id
from .input_points import point_values

SEQUENCE_BASELINES = ("zero", "pad", "mask", "unk")
IMAGE_BASELINES = ("zero", "black", "blur")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
Baseline = Union[str, int, Tensor]


def check_baseline(baseline: Any, name: str) -> Baseline:
    """A baseline of a known kind (module docstring); ``ValueError`` naming the method otherwise."""
    if isinstance(baseline, Tensor) or (isinstance(baseline, int) and not isinstance(baseline, bool)
                                        and baseline >= 0):
        return baseline
    if baseline in SEQUENCE_BASELINES + IMAGE_BASELINES:
        return baseline
    raise ValueError(f"{name}: baseline must be one of {SEQUENCE_BASELINES} (sequences), {IMAGE_BASELINES} "
                     f"(images), a token id or a tensor, got {baseline!r}")


def named_token_id(adapter: ModelAdapter, baseline: Union[str, int], name: str) -> int:
    """The token id of a sequence baseline: the ``int`` itself, or ``<baseline>_token_id`` of the model's config
    (its text config for a two-tower model)."""
    if isinstance(baseline, int):
        return baseline
    key = f"{baseline}_token_id"
    value = config_token_id(adapter.model, key)
    if value is not None:
        return value
    raise ValueError(f"{name}: baseline={baseline!r} needs the model's {key}, which its config does not name; "
                     f"give the id itself (baseline=tokenizer.{baseline}_token_id)")


def baseline_ids(adapter: ModelAdapter, inputs: ModelInputs, token_id: int) -> Tensor:
    """``input_ids`` with every content position replaced by ``token_id`` (special tokens, padding kept)."""
    ids = inputs["input_ids"]
    content = adapter.inputs.layout(inputs).content_positions(ids).to(ids.device)
    return torch.where(content, torch.full_like(ids, token_id), ids)


def real_positions_at(adapter: ModelAdapter, inputs: ModelInputs, x: Tensor) -> Tensor:
    """A bool mask broadcastable to ``x`` (values at the input embedding ``[B, N, D]``) of the real positions."""
    layout = adapter.inputs.layout(inputs)
    real = layout.real_positions(inputs["input_ids"]).to(x.device).bool()
    return real.reshape(real.shape + (1,) * (x.dim() - real.dim()))


def gaussian_blur(images: Tensor, sigma: float) -> Tensor:
    """``images`` ``[B, C, H, W]`` blurred by a separable Gaussian of standard deviation ``sigma`` pixels
    (kernel radius ``ceil(3 sigma)``, reflect padding)."""
    radius = max(1, int(torch.tensor(3.0 * sigma).ceil()))
    offsets = torch.arange(-radius, radius + 1, dtype=images.dtype, device=images.device)
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    kernel = kernel / kernel.sum()
    channels = images.shape[1]
    out = F.pad(images, (radius, radius, radius, radius), mode="reflect")
    out = F.conv2d(out, kernel.reshape(1, 1, 1, -1).expand(channels, 1, 1, -1), groups=channels)
    return F.conv2d(out, kernel.reshape(1, 1, -1, 1).expand(channels, 1, -1, 1), groups=channels)


def baseline_images(images: Tensor, baseline: Baseline, name: str, image_mean: Sequence[float] = IMAGENET_MEAN,
                    image_std: Sequence[float] = IMAGENET_STD, blur_sigma: float = 5.0) -> Tensor:
    """The baseline image of each image of ``images`` ``[B, 3, H, W]`` (normalised)."""
    if isinstance(baseline, Tensor):
        base = baseline.to(device=images.device, dtype=images.dtype)
        if base.shape not in (images.shape, images.shape[1:]):
            raise ValueError(f"{name}: a baseline tensor must have shape {tuple(images.shape[1:])} or "
                             f"{tuple(images.shape)}, got {tuple(base.shape)}")
        return base.expand_as(images).clone()
    if baseline == "zero":
        return torch.zeros_like(images)
    if baseline == "black":
        mean = torch.as_tensor(image_mean, dtype=images.dtype, device=images.device)
        std = torch.as_tensor(image_std, dtype=images.dtype, device=images.device)
        return (-mean / std)[None, :, None, None].expand_as(images).clone()
    if baseline == "blur":
        return gaussian_blur(images, blur_sigma)
    raise ValueError(f"{name}: baseline={baseline!r} is a sequence baseline; images take {IMAGE_BASELINES} or a "
                     "tensor")


def baseline_inputs(adapter: ModelAdapter, inputs: ModelInputs, baseline: Baseline, name: str,
                    **image_options: Any) -> ModelInputs:
    """``inputs`` with their model inputs at the baseline (ids or pixels); not for ``"zero"`` on sequences,
    which has no ids. Built, not rows of the inputs: no embedding offset (:mod:`methods.adapters.embedding_offset`)."""
    if adapter.inputs.layout_class.modality == "image":
        images = baseline_images(inputs["pixel_values"], baseline, name, **image_options)
        return replace(inputs.with_tensors(pixel_values=images), embedding_offset=None)
    if isinstance(baseline, Tensor) or baseline in IMAGE_BASELINES:
        raise ValueError(f"{name}: baseline={baseline if isinstance(baseline, str) else 'a tensor'!r} is an image "
                         f"baseline; sequences take {SEQUENCE_BASELINES} or a token id")
    assert not isinstance(baseline, Tensor)
    ids = baseline_ids(adapter, inputs, named_token_id(adapter, baseline, name))
    return replace(inputs.with_tensors(input_ids=ids), embedding_offset=None)


def baseline_values(adapter: ModelAdapter, inputs: ModelInputs, point: str, baseline: Baseline, name: str,
                    x: Tensor, **image_options: Any) -> Tensor:
    """The baseline at ``point`` for every sample of ``inputs`` (``x``: their values there)."""
    if adapter.inputs.layout_class.modality != "image" and baseline == "zero":
        real = real_positions_at(adapter, inputs, x)
        return torch.where(real, torch.zeros_like(x), x)
    return point_values(adapter, baseline_inputs(adapter, inputs, baseline, name, **image_options), point)
