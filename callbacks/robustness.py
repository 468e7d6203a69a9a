"""Robustness test: infidelity and max-sensitivity (Yeh et al. 2019; measures: :mod:`evaluation.robustness`).

Both perturb an image's [0, 1] pixels (every channel), per sample from ``(seed, sample index)``:

* **infidelity**: ``infidelity_runs`` Gaussian perturbations I (std ``noise_std``); the map at pixel resolution
  (token maps upsampled bilinearly, raw, :func:`evaluation.map_units.image_units`) broadcast to the channels,
  a_I = Σ I · a; Δ = f(x) − f(x − I) with f the explained class's ``score`` (``logit``, Captum's forward, or
  ``probability``); ``normalize`` (default, Captum's β-scaling) makes maps of any scale comparable. Forwards: the
  perturbed images depend on the sample only, so they run once per batch for every method and class setting
  (``infidelity_runs`` F per sample, at a fixed width as the faithfulness-correlation test);
* **max-sensitivity**: ``sensitivity_runs`` uniform perturbations δ in [−``radius``, ``radius``] (Captum's
  ``sensitivity_max`` defaults: 0.02, 10); each perturbed copy is **re-explained** by the evaluation module
  (``outputs["explain"]``, :meth:`lightning_modules.evaluation.AttributionEvaluationModule.explain`) for the same
  class; Frobenius norms of the method's own map (tokens or pixels). A class-agnostic method is re-explained once
  for every class setting. Re-explanations: ``sensitivity_runs`` E per sample and method (per class setting for a
  class-specific one), counted in ``robustness/reexplanations``; forwards in ``robustness/forwards``.

Lower is better for both. Texts, decoders and CLIP's text tower are **refused**: their perturbation lives in the
embedding space, and the evaluation module's text classifiers and methods read token ids, not embeddings.
Results: ``robustness/<method>/<setting>/<infidelity|max_sensitivity>``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
from torch import Tensor

from evaluation.map_units import image_units
from evaluation.metric_cards import MetricCard
from evaluation.robustness import infidelity, max_sensitivity, sample_noise

from .base import relevance_for
from .faithfulness_correlation import fixed_width_logits
from .sample_scores import SampleScoreTest

SCORES = ("logit", "probability")
COUNTS = ("forwards", "reexplanations")
TEXT_REFUSAL = ("robustness: infidelity and max-sensitivity perturb the input continuously; on texts (encoders, "
                "decoders, CLIP's text tower) that is the embedding space, and the evaluation module's text "
                "classifiers and methods read token ids, not embeddings: not defined here")


class RobustnessTest(SampleScoreTest):
    """Infidelity and max-sensitivity of every method's map on images (module docstring).

    Args:
        methods: method names (default: every method of the module's outputs).
        class_settings: explained classes (default ``predicted``).
        infidelity_runs: Gaussian perturbations per sample (Captum's default 10).
        noise_std: their standard deviation in [0, 1] pixel units.
        normalize: infidelity with Captum's optimal β-scaling of the map.
        score: ``logit`` (Captum's forward) or ``probability`` of the explained class.
        sensitivity_runs: uniform perturbations (re-explanations) per sample (Captum's default 10).
        radius: their half-width in [0, 1] pixel units (Captum's default 0.02).
        seed: the perturbations' seed (with each sample's dataset index).
    """

    counters = COUNTS
    PREFIX = "robustness"
    metric_cards = (
        MetricCard("infidelity", "mean over Gaussian pixel perturbations I of "
                   "(beta * sum(I * a) - (f(x) - f(x - I)))^2, beta the optimal scale (Captum normalize)",
                   "Yeh et al. 2019 (NeurIPS), eq. 2; Captum infidelity",
                   "R F (R = infidelity_runs)", False, ("image", "clip_image")),
        MetricCard("max_sensitivity", "max over uniform pixel perturbations of |map(x + d) - map(x)|_F / |map(x)|_F",
                   "Yeh et al. 2019 (NeurIPS), eq. 5; Captum sensitivity_max", "R E (R = sensitivity_runs)", False,
                   ("image", "clip_image")),
    )

    def __init__(self, methods: Optional[Sequence[str]] = None, class_settings: Sequence[str] = ("predicted",),
                 infidelity_runs: int = 10, noise_std: float = 0.05, normalize: bool = True, score: str = "logit",
                 sensitivity_runs: int = 10, radius: float = 0.02, seed: int = 0) -> None:
        if int(infidelity_runs) < 1 or int(sensitivity_runs) < 1:
            raise ValueError(f"robustness: infidelity_runs and sensitivity_runs must be >= 1, got {infidelity_runs}, "
                             f"{sensitivity_runs}")
        if noise_std <= 0 or radius <= 0:
            raise ValueError(f"robustness: noise_std and radius must be > 0, got {noise_std}, {radius}")
        if score not in SCORES:
            raise ValueError(f"robustness: score must be one of {SCORES}, got {score!r}")
        self.infidelity_runs, self.noise_std, self.normalize = int(infidelity_runs), float(noise_std), bool(normalize)
        self.score, self.sensitivity_runs = score, int(sensitivity_runs)
        self.radius, self.seed = float(radius), int(seed)
        super().__init__(methods, class_settings)

    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        return [f"robustness_{name}:{init_args.get(name, default)}" for name, default in (
            ("infidelity_runs", 10), ("noise_std", 0.05), ("normalize", True), ("score", "logit"),
            ("sensitivity_runs", 10), ("radius", 0.02), ("seed", 0))]

    def conventions(self) -> Dict[str, Any]:
        return {"space": "[0, 1] pixels, every channel", "infidelity_runs": self.infidelity_runs,
                "noise": f"N(0, {self.noise_std}^2)", "normalize": self.normalize, "score": self.score,
                "sensitivity_runs": self.sensitivity_runs, "radius": self.radius, "norm": "Frobenius",
                "seed": self.seed}

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        if isinstance(batch.get("input_ids"), Tensor) or not isinstance(batch.get("image"), Tensor):
            raise ValueError(TEXT_REFUSAL)
        if not isinstance(batch.get("index"), Tensor):
            raise KeyError(f"{self.PREFIX}: the batch has no 'index' (each sample's dataset index), which seeds its "
                           f"perturbations; got keys {sorted(batch)}")
        explain = outputs.get("explain")
        if not callable(explain):
            raise KeyError("robustness: the outputs have no 'explain' (the evaluation module's re-explanation entry "
                           "point, AttributionEvaluationModule.explain)")
        self._build_at_first_batch(outputs)
        classifier, layout, images = outputs["classifier"], outputs.get("layout"), batch["image"]
        ids = batch["index"].tolist()
        b, shape = images.shape[0], tuple(images.shape[1:])
        # infidelity: the perturbed forwards, once for every method and setting
        noise = sample_noise(ids, shape, self.infidelity_runs, self.seed, "infidelity", self.noise_std)
        perturbed = (images[None].to(torch.float64) - noise.to(images.device)).to(images.dtype)
        logits = fixed_width_logits(classifier, perturbed.flatten(0, 1), int(classifier.batch_size))
        logits = logits.reshape(self.infidelity_runs, b, -1).to(torch.float64).cpu()
        self._metrics["forwards"].update(self.infidelity_runs * b)
        clean = outputs["logits"].detach().to(torch.float64).cpu()
        if self.score == "probability":
            clean, logits = torch.softmax(clean, dim=-1), torch.softmax(logits, dim=-1)
        channel_noise = noise.sum(dim=2).flatten(2)          # Σ_c I[c, p]: the map is the same on every channel
        # max-sensitivity: the uniformly perturbed copies, normalised once
        delta = sample_noise(ids, shape, self.sensitivity_runs, self.seed, "sensitivity", self.radius)
        shaken = (images[None].to(torch.float64) + delta.to(images.device)).to(images.dtype).flatten(0, 1)
        shaken_inputs = classifier.normalize(shaken)
        reexplained: Dict[tuple, Tensor] = {}
        specific = outputs.get("class_specific", {})
        for method, setting in self._pairs():
            rel = relevance_for(outputs["relevance"], method, setting, self.PREFIX)
            target = outputs["targets"][setting].long().cpu()
            before = clean.gather(1, target[:, None])[:, 0]
            after = logits.gather(2, target[None, :, None].expand(self.infidelity_runs, -1, 1))[..., 0]
            pixel_map = image_units(rel, images.shape[-2:], layout, "pixel").cpu()
            infid = infidelity((channel_noise * pixel_map[None]).sum(dim=-1), before[None] - after, self.normalize)
            is_specific = bool(specific.get(method, True))
            key = (method, setting if is_specific else None)
            if key not in reexplained:
                targets = target.repeat(self.sensitivity_runs).to(images.device) if is_specific else None
                sample_ids = batch["index"].repeat(self.sensitivity_runs)
                maps = explain(method, shaken_inputs, targets, sample_ids)
                self._metrics["reexplanations"].update(self.sensitivity_runs * b)
                reexplained[key] = maps.detach().to(torch.float64).cpu().reshape(self.sensitivity_runs, b,
                                                                                  *maps.shape[1:])
            sens = max_sensitivity(reexplained[key], rel.detach().cpu())
            self._metrics[f"{method}/{setting}"].update(batch["index"], self._as_rows(infid, sens))
