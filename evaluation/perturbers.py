"""Perturbers: how a perturbation test removes the units of one kind of input.

The core of the test (:mod:`evaluation.ranking`, :mod:`evaluation.perturbation`, :mod:`evaluation.auc`) ranks
*units* by scores ``[B, N]`` and asks for the inputs with the top-ranked units removed; a :class:`Perturber` says
what a unit is and how it is removed:

* :meth:`~Perturber.unit_scores`: raw relevance (a method's output) -> one score per unit ``[B, N]``;
* :meth:`~Perturber.tie_scores`: the random baseline's map of each sample in the same units (the ``random`` tie
  convention);
* :meth:`~Perturber.num_units`: what the fractions are fractions of (one number, or one per sample);
* :meth:`~Perturber.removable`: which units may be removed (``None``: all; e.g. not the padding of a text);
* :meth:`~Perturber.perturb`: the ``S * B`` perturbed inputs (step-major) for removal masks ``[S, B, N]``, in the
  form the :class:`~evaluation.classifier.Classifier` of the run reads.

A new kind of input (token sequences: removed tokens become [PAD] with attention mask 0) is a new subclass
registered under its masking name with :func:`register_masking`; the core does not change.

Images (:class:`PixelPerturber`, PROTOCOLS.md sections 1 and 2): units are the ``H * W`` pixels of the [0, 1]
image ``batch["image"]``, scored by the protocols' pixel maps (:func:`evaluation.pixel_maps.pixel_maps`: bilinear
upsampling, min-max per image); a removed pixel is filled in all channels with

* ``chefer`` (Chefer 2021a, default): 0 in [0, 1] space **before** the model's normalisation (black);
* ``mean`` (Beyond Intuition's CLIP test): the model's mean colour (``classifier.mean``), i.e. 0 **after**
  normalisation.
"""
from __future__ import annotations

import abc
import functools
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

import torch
from torch import Tensor

from .pixel_maps import pixel_maps


class Perturber(abc.ABC):
    """Units of one kind of input, and how they are removed (module docstring)."""

    #: the masking convention's name (``PerturbationTest(masking=...)``)
    name: str = "?"

    @abc.abstractmethod
    def unit_scores(self, relevance: Tensor, batch: Mapping[str, Any], layout: Any = None) -> Tensor:
        """Scores ``[B, N]`` (higher = more relevant) of the units of ``batch`` from a method's raw ``relevance``
        (``layout``: the model's layout of the scores, e.g. ``.grid`` of a patch grid; ``None``: inferred)."""

    @abc.abstractmethod
    def tie_scores(self, sample_ids: Tensor, batch: Mapping[str, Any], layout: Any, seed: int) -> Tensor:
        """The random baseline's map (seed ``seed``, one map per sample id) as unit scores ``[B, N]``."""

    @abc.abstractmethod
    def num_units(self, batch: Mapping[str, Any]) -> Union[int, Tensor]:
        """The number the fractions are fractions of: one ``int`` for the batch or ``LongTensor[B]``."""

    def removable(self, batch: Mapping[str, Any]) -> Optional[Tensor]:
        """Bool ``[B, N]`` of the units that may be removed (``None``: every unit)."""
        return None

    @abc.abstractmethod
    def perturb(self, batch: Mapping[str, Any], removed: Tensor, classifier: Any) -> Any:
        """The ``S * B`` inputs (step-major: step 0's batch first) with the units of ``removed`` (bool
        ``[S, B, N]``) removed, in the form ``classifier`` reads (``classifier`` also gives the model facts a
        fill needs, e.g. its mean colour)."""


# ------------------------------------------------------------------------------------------ images
def fill_pixels(images: Tensor, removed: Tensor, fill: Tensor) -> Tensor:
    """``[S, B, C, H, W]``: step ``s`` replaces the pixels of ``removed[s]`` (``[S, B, H * W]``) by ``fill``
    (``[C]``, all channels)."""
    b, c, h, w = images.shape
    mask = removed.reshape(removed.shape[0], b, 1, h, w)
    fill = fill.to(images).reshape(1, 1, c, 1, 1)
    return torch.where(mask, fill, images[None])


class PixelPerturber(Perturber):
    """Pixels of the [0, 1] images ``batch["image"]`` ``[B, 3, H, W]`` (module docstring).

    Args:
        fill: ``chefer`` (0 in [0, 1] space before normalisation) or ``mean`` (the classifier's mean colour).
    """

    FILLS = ("chefer", "mean")

    def __init__(self, fill: str = "chefer") -> None:
        if fill not in self.FILLS:
            raise ValueError(f"unknown pixel fill {fill!r}; choose one of {self.FILLS}")
        self.fill = fill
        self.name = fill

    @staticmethod
    def _images(batch: Mapping[str, Any]) -> Tensor:
        if "image" not in batch:
            raise KeyError(f"pixel perturbation needs batch['image'] ([B, 3, H, W] in [0, 1]); "
                           f"got keys {sorted(batch)}")
        return batch["image"]

    @staticmethod
    def _grid(layout: Any) -> Optional[Tuple[int, int]]:
        return None if layout is None else tuple(layout.grid)

    def unit_scores(self, relevance: Tensor, batch: Mapping[str, Any], layout: Any = None) -> Tensor:
        images = self._images(batch)
        return pixel_maps(relevance, images.shape[-2:], self._grid(layout)).flatten(1)

    def tie_scores(self, sample_ids: Tensor, batch: Mapping[str, Any], layout: Any, seed: int) -> Tensor:
        from methods.random_baseline import random_token_scores

        if layout is None:
            raise ValueError("pixel perturbation: the random tie convention needs the model's patch grid (layout)")
        images = self._images(batch)
        h, w = self._grid(layout)
        scores = random_token_scores(sample_ids, h * w, seed).to(images.device)
        return pixel_maps(scores, images.shape[-2:], (h, w)).flatten(1)

    def num_units(self, batch: Mapping[str, Any]) -> int:
        images = self._images(batch)
        return int(images.shape[-2] * images.shape[-1])

    def fill_value(self, classifier: Any) -> Tensor:
        """Per-channel value of a removed pixel in [0, 1] space."""
        if self.fill == "chefer":
            return torch.zeros(3)
        return torch.as_tensor(classifier.mean, dtype=torch.float32)

    def perturb(self, batch: Mapping[str, Any], removed: Tensor, classifier: Any) -> Tensor:
        images = self._images(batch)
        fill = self.fill_value(classifier).to(images.device)
        return fill_pixels(images, removed, fill).flatten(0, 1)

    def __repr__(self) -> str:
        return f"PixelPerturber(fill={self.fill!r})"


# ------------------------------------------------------------------------------------------ registry
MASKINGS: Dict[str, Callable[[], Perturber]] = {}


def register_masking(name: str, factory: Callable[[], Perturber]) -> None:
    """Make ``PerturbationTest(masking=name)`` use the perturber ``factory()`` builds."""
    if name in MASKINGS:
        raise ValueError(f"masking convention {name!r} is already registered")
    MASKINGS[name] = factory


def build_perturber(masking: str) -> Perturber:
    """The perturber of a registered masking convention (``ValueError`` listing them otherwise)."""
    if masking not in MASKINGS:
        raise ValueError(f"unknown masking convention {masking!r}; choose one of {tuple(MASKINGS)}")
    return MASKINGS[masking]()


register_masking("chefer", functools.partial(PixelPerturber, "chefer"))
register_masking("mean", functools.partial(PixelPerturber, "mean"))
