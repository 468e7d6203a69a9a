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

A new kind of input is a new subclass registered under its masking name with :func:`register_masking`; the core
does not change.

Images (:class:`PixelPerturber`, PROTOCOLS.md sections 1 and 2): units are the ``H * W`` pixels of the [0, 1]
image ``batch["image"]``, scored by the protocols' pixel maps (:func:`evaluation.pixel_maps.pixel_maps`), filled
in all channels as ``chefer`` (Chefer 2021a, default) or ``mean`` (Beyond Intuition's CLIP test) say. Texts
(:class:`TokenPerturber`, PROTOCOLS.md section 5): units are token positions scored by the method's token scores,
removed as ``pad`` (Beyond Intuition), ``mask`` or ``delete`` say.
"""
from __future__ import annotations

import abc
import functools
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

import torch
from torch import Tensor

from methods.adapters.tokens import special_positions
from methods.random_baseline import random_token_scores

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
        fill: ``chefer`` (0 in [0, 1] space **before** the model's normalisation: black) or ``mean`` (the
            classifier's mean colour, i.e. 0 **after** normalisation).
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


# ------------------------------------------------------------------------------------------ tokens
class TokenPerturber(Perturber):
    """Tokens of a text batch (``input_ids``, ``attention_mask``, ``special_tokens_mask``, ... ``[B, N]``;
    PROTOCOLS.md section 5 and ERASER's faithfulness).

    Units are the token positions; the scores are a method's token scores ``[B, N]`` as they are (``clamp``:
    negative scores set to 0 first, as Beyond Intuition's and Chefer's text scripts clamp the map).

    Args:
        removal: how a removed token goes:
            ``pad`` (Beyond Intuition, default): input id ``[PAD]`` and attention mask 0, in place;
            ``mask``: input id ``[MASK]`` (attention kept);
            ``delete``: the token is taken out and the rest moves left (the sequence gets shorter; Chefer 2021b's
            and ERASER's token deletion).
        fraction_of: what the fractions are fractions of: ``real`` (default): each sample's removable tokens
            (its real tokens, special tokens excluded unless ``remove_special_tokens``); ``padded``: the batch's
            padded length ``N`` (Beyond Intuition's 20 Newsgroups script, whose inputs are padded to 512: short
            texts lose every token early, and padding positions take part in the ranking with their score).
        remove_special_tokens: let [CLS]/[SEP] be removed (Beyond Intuition's scripts can remove them; never by
            default).
        clamp: set negative scores to 0 before ranking (default ``True``, as the references).

    Padding is never "removed" except under ``fraction_of="padded"`` (where removing a padding position changes
    nothing for ``pad`` and ``delete`` and replaces it by ``[MASK]``, visible to attention, for ``mask``: so
    ``mask`` with ``padded`` is refused).
    """

    REMOVALS = ("pad", "mask", "delete")
    FRACTIONS_OF = ("real", "padded")

    def __init__(self, removal: str = "pad", fraction_of: str = "real", remove_special_tokens: bool = False,
                 clamp: bool = True) -> None:
        if removal not in self.REMOVALS:
            raise ValueError(f"unknown token removal {removal!r}; choose one of {self.REMOVALS}")
        if fraction_of not in self.FRACTIONS_OF:
            raise ValueError(f"unknown fraction_of {fraction_of!r}; choose one of {self.FRACTIONS_OF}")
        if removal == "mask" and fraction_of == "padded":
            raise ValueError("removal='mask' with fraction_of='padded' would turn padding into visible [MASK] "
                             "tokens; use removal='pad' or fraction_of='real'")
        self.removal, self.fraction_of = removal, fraction_of
        self.remove_special_tokens, self.clamp = bool(remove_special_tokens), bool(clamp)
        self.name = removal

    @staticmethod
    def _tensor(batch: Mapping[str, Any], key: str) -> Tensor:
        value = batch.get(key)
        if not isinstance(value, Tensor):
            raise KeyError(f"token perturbation needs batch[{key!r}] [B, N]; got keys {sorted(batch)}")
        return value

    def _real(self, batch: Mapping[str, Any]) -> Tensor:
        ids = self._tensor(batch, "input_ids")
        mask = batch.get("attention_mask")
        return torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()

    def _special(self, batch: Mapping[str, Any]) -> Tensor:
        special = batch.get("special_tokens_mask")
        if special is None:
            return special_positions(self._real(batch).long())
        return special.bool()

    def unit_scores(self, relevance: Tensor, batch: Mapping[str, Any], layout: Any = None) -> Tensor:
        ids = self._tensor(batch, "input_ids")
        if relevance.shape != ids.shape:
            raise ValueError(f"token perturbation: relevance has shape {tuple(relevance.shape)} but the batch's "
                             f"input_ids have {tuple(ids.shape)}; expected token scores [B, N]")
        scores = relevance.detach().to(torch.float64)
        return scores.clamp(min=0) if self.clamp else scores

    def tie_scores(self, sample_ids: Tensor, batch: Mapping[str, Any], layout: Any, seed: int) -> Tensor:
        ids = self._tensor(batch, "input_ids")
        # a function of (seed, id) and the position alone: a sample's tie order does not depend on its padding
        return random_token_scores(sample_ids, ids.shape[1], seed).to(ids.device)

    def removable(self, batch: Mapping[str, Any]) -> Tensor:
        units = self._real(batch)
        if self.fraction_of == "padded":
            units = torch.ones_like(units)
        if not self.remove_special_tokens:
            units = units & ~(self._special(batch) & self._real(batch))
        return units

    def num_units(self, batch: Mapping[str, Any]) -> Union[int, Tensor]:
        if self.fraction_of == "padded":
            return int(self._tensor(batch, "input_ids").shape[1])
        return self.removable(batch).sum(dim=1)

    def perturb(self, batch: Mapping[str, Any], removed: Tensor, classifier: Any) -> Dict[str, Tensor]:
        ids = self._tensor(batch, "input_ids")
        steps = removed.shape[0]
        removed = removed & self.removable(batch)[None]      # never more than the removable units
        real = self._real(batch)
        out = {k: batch[k][None].expand(steps, *ids.shape) for k in ("input_ids", "token_type_ids")
               if isinstance(batch.get(k), Tensor)}
        mask = real[None].expand(steps, *ids.shape)
        if self.removal == "pad":
            out["input_ids"] = out["input_ids"].masked_fill(removed, classifier.pad_token_id)
            mask = mask & ~removed
        elif self.removal == "mask":
            if getattr(classifier, "mask_token_id", None) is None:
                raise ValueError("removal='mask' needs the tokenizer's [MASK] id, but the classifier has none (its "
                                 "tokenizer was not found next to the model); use removal='pad' or 'delete'")
            out["input_ids"] = out["input_ids"].masked_fill(removed, classifier.mask_token_id)
        else:  # delete: kept tokens move left, in order; the freed tail is padding
            keep = mask & ~removed
            order = torch.sort((~keep).to(torch.int8), dim=-1, stable=True).indices
            out = {k: v.gather(-1, order) for k, v in out.items()}
            mask = keep.gather(-1, order)
            out["input_ids"] = out["input_ids"].masked_fill(~mask, classifier.pad_token_id)
            if "token_type_ids" in out:
                out["token_type_ids"] = out["token_type_ids"].masked_fill(~mask, 0)
        out["attention_mask"] = mask.long()
        return {k: v.reshape(-1, ids.shape[1]) for k, v in out.items()}

    def __repr__(self) -> str:
        return (f"TokenPerturber(removal={self.removal!r}, fraction_of={self.fraction_of!r}, "
                f"remove_special_tokens={self.remove_special_tokens}, clamp={self.clamp})")


# ------------------------------------------------------------------------------------------ registry
MASKINGS: Dict[str, Callable[..., Perturber]] = {}


def register_masking(name: str, factory: Callable[..., Perturber]) -> None:
    """Make ``PerturbationTest(masking=name)`` use the perturber ``factory(**options)`` builds."""
    if name in MASKINGS:
        raise ValueError(f"masking convention {name!r} is already registered")
    MASKINGS[name] = factory


def build_perturber(masking: str, **options: Any) -> Perturber:
    """The perturber of a registered masking convention with its ``options`` (``ValueError`` listing the
    conventions otherwise; ``TypeError`` naming an option the convention does not take)."""
    if masking not in MASKINGS:
        raise ValueError(f"unknown masking convention {masking!r}; choose one of {tuple(MASKINGS)}")
    try:
        return MASKINGS[masking](**options)
    except TypeError as err:
        raise TypeError(f"masking convention {masking!r} does not take the options {sorted(options)}: {err}") from err


register_masking("chefer", functools.partial(PixelPerturber, "chefer"))
register_masking("mean", functools.partial(PixelPerturber, "mean"))
for _removal in TokenPerturber.REMOVALS:
    register_masking(_removal, functools.partial(TokenPerturber, _removal))
