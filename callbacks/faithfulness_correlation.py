"""Faithfulness-correlation test (Bhatt et al. 2020, eq. 2; measure: :mod:`evaluation.faithfulness_correlation`).

Per sample, ``runs`` (R) random subsets of ``subset_fraction`` of its units are removed, one perturbed input per
subset; the score of the explained class (``score``: ``probability``, softmax in float64, Bhatt's and Quantus'
default; or ``logit``) drops from the clean forward's (the module's logits) by Δ_r; the result is the Pearson
correlation, over r, between Δ_r and the sum of the map over subset r; higher is better; mean over samples (NaN
samples, e.g. a constant map, skipped).

Conventions (options; W&B tags): units ``pixel`` or ``patch`` (images: a patch subset removes all its pixels; the
map on those units as :func:`evaluation.map_units.image_units`) or ``token`` (texts: the removable tokens of the
token perturber, special tokens never); removal as the perturbation test's ``masking`` (``chefer``: black in
[0, 1], ``mean``; ``pad``, ``mask``, ``delete``); subsets drawn per sample from ``(seed, sample index)`` and shared
by every method and class setting of the sample (paired). Forwards: the perturbed inputs depend on the sample and
its subsets only, so they run **once per batch for every method and class setting**: R forwards per sample
(``faithfulness_correlation/forwards`` = R x samples, counted), in chunks of the classifier's batch size, the last
chunk padded to that size (copies of its last input) so every image forward has the same shape on any number of
processes (a float32 matrix product rounds a row differently for other row counts: ``_call_width`` of the
evaluation module; a text chunk is still cut to its longest sequence by the text classifier).
Results: ``faithfulness_correlation/<method>/<setting>/pearson``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
from torch import Tensor

from evaluation.faithfulness_correlation import draw_subsets, pearson_rows
from evaluation.map_units import image_units
from evaluation.metric_cards import MetricCard
from evaluation.perturbers import PixelPerturber, TokenPerturber, build_perturber

from .base import relevance_for
from .sample_scores import SampleScoreTest

SCORES = ("probability", "logit")
FORWARDS = "forwards"


def fixed_width_logits(classifier: Any, inputs: Any, width: int) -> Tensor:
    """Logits ``[M, C]`` of ``inputs``, ``width`` inputs per forward, the last chunk padded to ``width`` with
    copies of its last input (dropped): every forward has the same shape."""
    total = classifier.num_samples(inputs)
    parts = []
    for start in range(0, total, width):
        stop = min(start + width, total)
        index = torch.arange(start, start + width).clamp(max=stop - 1)
        parts.append(classifier.logits(classifier.take(inputs, index), batch_size=width)[: stop - start])
    return torch.cat(parts)


class FaithfulnessCorrelationTest(SampleScoreTest):
    """Faithfulness correlation of every method's map (module docstring).

    Args:
        methods: method names (default: every method of the module's outputs).
        class_settings: explained classes (default ``predicted``).
        runs: the number R of random subsets per sample (Quantus' default 100).
        subset_fraction: the share of a sample's units in each subset.
        unit: ``pixel`` or ``patch`` (images), ``token`` (texts); ``None``: ``patch`` for images, ``token`` for texts.
        masking: how removed units go (images ``chefer`` / ``mean``; texts ``pad`` / ``mask`` / ``delete``);
            ``None``: ``chefer`` for images, ``pad`` for texts.
        score: ``probability`` (softmax) or ``logit`` of the explained class.
        seed: the subsets' seed (with each sample's dataset index).
        oracle: add the ground-truth map as method ``oracle`` (:func:`callbacks.sample_scores.oracle_map`).
    """

    counters = (FORWARDS,)
    PREFIX = "faithfulness_correlation"
    metric_cards = (
        MetricCard("pearson", "Pearson over R random unit subsets between the map's sum on the subset and the "
                   "explained class's probability drop when the subset is removed",
                   "Bhatt et al. 2020 (IJCAI), eq. 2; Quantus FaithfulnessCorrelation", "R F (R = runs)", True),
    )

    def __init__(self, methods: Optional[Sequence[str]] = None, class_settings: Sequence[str] = ("predicted",),
                 runs: int = 100, subset_fraction: float = 0.1, unit: Optional[str] = None,
                 masking: Optional[str] = None, score: str = "probability", seed: int = 0, oracle: bool = False
                 ) -> None:
        if int(runs) < 2:
            raise ValueError(f"faithfulness correlation: runs must be >= 2 (a correlation), got {runs}")
        if not 0 < float(subset_fraction) < 1:
            raise ValueError(f"faithfulness correlation: subset_fraction must lie in (0, 1), got {subset_fraction}")
        if unit not in (None, "pixel", "patch", "token"):
            raise ValueError(f"faithfulness correlation: unit must be pixel, patch, token or None, got {unit!r}")
        if score not in SCORES:
            raise ValueError(f"faithfulness correlation: score must be one of {SCORES}, got {score!r}")
        self.runs, self.subset_fraction, self.unit = int(runs), float(subset_fraction), unit
        self.masking, self.score, self.seed = masking, score, int(seed)
        super().__init__(methods, class_settings, oracle)

    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        return [f"faithcorr_{name}:{init_args.get(name, default)}" for name, default in (
            ("runs", 100), ("subset_fraction", 0.1), ("unit", "auto"), ("masking", "auto"), ("score", "probability"),
            ("seed", 0))]

    def conventions(self) -> Dict[str, Any]:
        return {"runs": self.runs, "subset_fraction": self.subset_fraction, "unit": self.unit or "patch / token",
                "masking": self.masking or "chefer / pad", "score": self.score, "seed": self.seed,
                "subsets": "numpy PCG64 from SeedSequence([seed, index]), shared by every method and setting"}

    # ------------------------------------------------------------------------------------------ update
    def _setup(self, batch: Dict[str, Any]):
        """``(perturber, unit, image: bool)`` for this batch's modality; a unit undefined on it refused by name."""
        if isinstance(batch.get("input_ids"), Tensor):
            unit = self.unit or "token"
            if unit != "token":
                raise ValueError(f"faithfulness correlation: unit {unit!r} is not defined on texts; use 'token'")
            perturber = build_perturber(self.masking or "pad", clamp=False)
            if not isinstance(perturber, TokenPerturber):
                raise ValueError(f"faithfulness correlation: masking {self.masking!r} does not remove tokens")
            return perturber, unit, False
        if isinstance(batch.get("image"), Tensor):
            unit = self.unit or "patch"
            if unit == "token":
                raise ValueError("faithfulness correlation: unit 'token' is not defined on images; use 'patch' or "
                                 "'pixel'")
            perturber = build_perturber(self.masking or "chefer")
            if not isinstance(perturber, PixelPerturber):
                raise ValueError(f"faithfulness correlation: masking {self.masking!r} does not remove pixels")
            return perturber, unit, True
        raise KeyError(f"faithfulness correlation: the batch has neither 'image' nor 'input_ids'; got {sorted(batch)}")

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        outputs = self._indexed_outputs(outputs, batch, "seeds its subsets")
        perturber, unit, image = self._setup(batch)
        classifier, layout = outputs["classifier"], outputs.get("layout")
        if image:
            h_img, w_img = batch["image"].shape[-2:]
            grid = (h_img, w_img) if unit == "pixel" else tuple(layout.grid)
            if h_img % grid[0] or w_img % grid[1]:
                raise ValueError(f"faithfulness correlation: a {h_img}x{w_img} image does not divide into the "
                                 f"{grid[0]}x{grid[1]} patch grid")
            removable = torch.ones(batch["image"].shape[0], grid[0] * grid[1], dtype=torch.bool)
        else:
            removable = perturber.removable(batch).cpu()
        subsets = draw_subsets(batch["index"].tolist(), removable, self.runs, self.subset_fraction, self.seed)
        removed = subsets
        if image and unit == "patch":
            r, b = subsets.shape[:2]
            kh, kw = h_img // grid[0], w_img // grid[1]
            removed = (subsets.reshape(r, b, grid[0], 1, grid[1], 1).expand(r, b, grid[0], kh, grid[1], kw)
                       .reshape(r, b, h_img * w_img))
        device = batch["image"].device if image else batch["input_ids"].device
        inputs = perturber.perturb(batch, removed.to(device), classifier)
        logits = fixed_width_logits(classifier, inputs, int(classifier.batch_size))
        logits = logits.reshape(self.runs, -1, logits.shape[-1]).to(torch.float64)
        self._metrics[FORWARDS].update(self.runs * removable.shape[0])
        clean = outputs["logits"].detach().to(torch.float64)
        if self.score == "probability":
            clean, logits = torch.softmax(clean, dim=-1), torch.softmax(logits, dim=-1)
        drops: Dict[str, Tensor] = {}
        for setting in self.class_settings:
            target = outputs["targets"][setting].long().to(clean.device)
            before = clean.gather(1, target[:, None])[:, 0]
            after = logits.gather(2, target[None, :, None].expand(self.runs, -1, 1).to(logits.device))[..., 0]
            drops[setting] = before[None].cpu() - after.cpu()
        weights = subsets.to(torch.float64)
        for method, setting in self._pairs():
            rel = relevance_for(outputs["relevance"], method, setting, self.PREFIX)
            if image:
                scores = image_units(rel, (h_img, w_img), layout, unit).cpu()
            else:
                scores = rel.detach().to(torch.float64).cpu()
                if scores.shape != removable.shape:
                    raise ValueError(f"faithfulness correlation: token scores {tuple(scores.shape)} do not match "
                                     f"the batch's tokens {tuple(removable.shape)}")
            sums = (weights * scores[None]).sum(dim=-1)
            self._metrics[f"{method}/{setting}"].update(batch["index"], pearson_rows(sums, drops[setting])[:, None])
