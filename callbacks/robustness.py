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

Texts, decoders (the answer-token classifier) and CLIP's text tower: both perturb the **input embedding** (the
adapter's ``input_embedding()`` output, word embeddings only), per sample ``[N, D]``
(:mod:`evaluation.embedding_offset`): padding never, special tokens only with ``perturb_special_tokens`` (default
off, as the removal curves keep them). ``embedding_scale``: ``relative`` (default; ``noise_std`` and ``radius``
times the sample's ``mean_t ‖e_t‖ / √D``, so the image defaults' "a few percent of the input's range" carries over
to models whose embedding scales differ by orders of magnitude) or ``absolute`` (embedding units). Infidelity: the
token map broadcast over the width, a_I = Σ_t a_t Σ_d I_td; f(x) and the R f(x − I) run through the adapter's
forward from the embedding (:func:`methods.input_points.logits_at`), batched at the classifier's width
(``(infidelity_runs + 1)`` F per sample). Max-sensitivity: each perturbed copy re-explained with its draw as the
inputs' embedding offset (``explain(..., embedding_offset=...)``, :mod:`methods.adapters.embedding_offset`: it
travels with the rows, so every forward of the method sees its own, identical texts included), one ``explain`` call
per run; Frobenius norms of the token maps on the real tokens.

Lower is better for both. Results: ``robustness/<method>/<setting>/<infidelity|max_sensitivity>``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
from torch import Tensor

from evaluation.embedding_offset import SCALES as EMBEDDING_SCALES
from evaluation.embedding_offset import embedding_noise, embedding_scale
from evaluation.map_units import image_units
from evaluation.metric_cards import MODALITIES, MetricCard
from evaluation.robustness import infidelity, max_sensitivity, sample_noise
from methods.adapters import adapter_for
from methods.input_points import logits_at, point_values, resolve_point, select_rows

from .base import relevance_for
from .faithfulness_correlation import fixed_width_logits
from .sample_scores import SampleScoreTest

SCORES = ("logit", "probability")
COUNTS = ("forwards", "reexplanations")


class RobustnessTest(SampleScoreTest):
    """Infidelity and max-sensitivity of every method's map on images and texts (module docstring).

    Args:
        methods: method names (default: every method of the module's outputs).
        class_settings: explained classes (default ``predicted``).
        infidelity_runs: Gaussian perturbations per sample (Captum's default 10).
        noise_std: their standard deviation in [0, 1] pixel units (texts: see ``embedding_scale``).
        normalize: infidelity with Captum's optimal β-scaling of the map.
        score: ``logit`` (Captum's forward) or ``probability`` of the explained class.
        sensitivity_runs: uniform perturbations (re-explanations) per sample (Captum's default 10).
        radius: their half-width in [0, 1] pixel units (Captum's default 0.02; texts: see ``embedding_scale``).
        seed: the perturbations' seed (with each sample's dataset index).
        embedding_scale: texts: ``relative`` (``noise_std`` / ``radius`` times each sample's mean embedding norm
            / √D) or ``absolute`` (embedding units).
        perturb_special_tokens: texts: perturb the special tokens' embeddings too (padding never).
    """

    counters = COUNTS
    PREFIX = "robustness"
    metric_cards = (
        MetricCard("infidelity", "mean over Gaussian perturbations I of the pixels (texts: the input embeddings, "
                   "std relative to the embedding scale by default) of (beta * sum(I * a) - (f(x) - f(x - I)))^2, "
                   "beta the optimal scale (Captum normalize)",
                   "Yeh et al. 2019 (NeurIPS), eq. 2; Captum infidelity",
                   "R F images, (R + 1) F texts (R = infidelity_runs)", False, MODALITIES),
        MetricCard("max_sensitivity", "max over uniform perturbations of the pixels (texts: the input embeddings) of "
                   "|map(x + d) - map(x)|_F / |map(x)|_F", "Yeh et al. 2019 (NeurIPS), eq. 5; Captum sensitivity_max",
                   "R E (R = sensitivity_runs)", False, MODALITIES),
    )

    def __init__(self, methods: Optional[Sequence[str]] = None, class_settings: Sequence[str] = ("predicted",),
                 infidelity_runs: int = 10, noise_std: float = 0.05, normalize: bool = True, score: str = "logit",
                 sensitivity_runs: int = 10, radius: float = 0.02, seed: int = 0,
                 embedding_scale: str = "relative", perturb_special_tokens: bool = False) -> None:
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
        if embedding_scale not in EMBEDDING_SCALES:
            raise ValueError(f"robustness: embedding_scale must be one of {EMBEDDING_SCALES}, got {embedding_scale!r}")
        self.embedding_scale, self.perturb_special_tokens = embedding_scale, bool(perturb_special_tokens)
        super().__init__(methods, class_settings)

    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        return [f"robustness_{name}:{init_args.get(name, default)}" for name, default in (
            ("infidelity_runs", 10), ("noise_std", 0.05), ("normalize", True), ("score", "logit"),
            ("sensitivity_runs", 10), ("radius", 0.02), ("seed", 0), ("embedding_scale", "relative"),
            ("perturb_special_tokens", False))]

    def conventions(self) -> Dict[str, Any]:
        return {"space": "images: [0, 1] pixels, every channel", "infidelity_runs": self.infidelity_runs,
                "noise": f"N(0, {self.noise_std}^2)", "normalize": self.normalize, "score": self.score,
                "sensitivity_runs": self.sensitivity_runs, "radius": self.radius, "norm": "Frobenius",
                "seed": self.seed, "text_space": "texts: the word embeddings, padding never perturbed",
                "embedding_scale": self.embedding_scale, "perturb_special_tokens": self.perturb_special_tokens}

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        if not isinstance(batch.get("input_ids"), Tensor) and not isinstance(batch.get("image"), Tensor):
            raise ValueError(f"robustness: the batch has neither 'image' nor 'input_ids'; got keys {sorted(batch)}")
        if not isinstance(batch.get("index"), Tensor):
            raise KeyError(f"{self.PREFIX}: the batch has no 'index' (each sample's dataset index), which seeds its "
                           f"perturbations; got keys {sorted(batch)}")
        explain = outputs.get("explain")
        if not callable(explain):
            raise KeyError("robustness: the outputs have no 'explain' (the evaluation module's re-explanation entry "
                           "point, AttributionEvaluationModule.explain)")
        self._build_at_first_batch(outputs)
        if isinstance(batch.get("input_ids"), Tensor):
            self._update_text(outputs, batch, explain)
            return
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

    # ------------------------------------------------------------------------------------------ texts
    def _perturbable(self, batch: Dict[str, Any], real: Tensor) -> Tensor:
        """Bool ``[B, N]``: the real tokens, less the special tokens unless ``perturb_special_tokens``."""
        special = batch.get("special_tokens_mask")
        if self.perturb_special_tokens or not isinstance(special, Tensor):
            return real
        return real & ~special.to(real.device).bool()

    def _update_text(self, outputs: Dict[str, Any], batch: Dict[str, Any], explain: Any) -> None:
        """Texts, decoders, CLIP's text tower: both perturbations at the input embedding (module docstring)."""
        classifier, model = outputs["classifier"], outputs.get("model")
        if model is None:
            raise KeyError("robustness: the outputs have no 'model' (the classifier's model, whose input "
                           "embedding the text perturbations shift)")
        adapter = adapter_for(model)
        raw = classifier.model_inputs(batch)
        inputs = adapter.inputs.prepare(raw)
        clean_embeddings = point_values(adapter, inputs, resolve_point(adapter, "embedding", self.PREFIX))
        real = adapter.inputs.layout(inputs).real_positions(inputs["input_ids"]).bool().cpu()
        perturbable = self._perturbable(batch, real).cpu()
        ids, b = batch["index"].tolist(), len(batch["index"])
        width = clean_embeddings.shape[-1]
        scales = embedding_scale(clean_embeddings, perturbable.to(clean_embeddings.device)) \
            if self.embedding_scale == "relative" else torch.ones(b, dtype=torch.float64)
        noise = embedding_noise(ids, perturbable, width, self.infidelity_runs, self.seed, "infidelity",
                                self.noise_std, scales)
        perturbed = clean_embeddings[None].to(torch.float64).cpu() - noise                 # [R, B, N, D]
        values = torch.cat([clean_embeddings[None].to(torch.float64).cpu(), perturbed]).flatten(0, 1)
        logits = embedding_logits(adapter, classifier, inputs, values.to(clean_embeddings.dtype),
                                  int(classifier.batch_size), int(outputs["logits"].shape[-1]))
        logits = logits.reshape(self.infidelity_runs + 1, b, -1).to(torch.float64).cpu()
        self._metrics["forwards"].update((self.infidelity_runs + 1) * b)
        if self.score == "probability":
            logits = torch.softmax(logits, dim=-1)
        token_noise = noise.sum(dim=-1)                                                    # Σ_d I[t, d]
        delta = embedding_noise(ids, perturbable, width, self.sensitivity_runs, self.seed, "sensitivity",
                                self.radius, scales).to(clean_embeddings.dtype)
        reexplained: Dict[tuple, Tensor] = {}
        specific = outputs.get("class_specific", {})
        for method, setting in self._pairs():
            rel = relevance_for(outputs["relevance"], method, setting, self.PREFIX).detach().cpu()
            if tuple(rel.shape) != tuple(real.shape):
                raise ValueError(f"robustness: {method}'s map has shape {tuple(rel.shape)}, not one score per token "
                                 f"{tuple(real.shape)}")
            target = outputs["targets"][setting].long().cpu()
            scores = logits.gather(2, target[None, :, None].expand(self.infidelity_runs + 1, -1, 1))[..., 0]
            infid = infidelity((token_noise * rel.to(torch.float64)[None]).sum(dim=-1), scores[:1] - scores[1:],
                               self.normalize)
            is_specific = bool(specific.get(method, True))
            key = (method, setting if is_specific else None)
            if key not in reexplained:
                targets = target.to(batch["index"].device) if is_specific else None
                maps = [explain(method, raw, targets, batch["index"], embedding_offset=delta[r].to(clean_embeddings))
                        for r in range(self.sensitivity_runs)]
                self._metrics["reexplanations"].update(self.sensitivity_runs * b)
                reexplained[key] = torch.stack([m.detach().to(torch.float64).cpu() for m in maps]) * real[None]
            sens = max_sensitivity(reexplained[key], rel.to(torch.float64) * real)
            self._metrics[f"{method}/{setting}"].update(batch["index"], self._as_rows(infid, sens))


def embedding_logits(adapter: Any, classifier: Any, inputs: Any, values: Tensor, width: int,
                     num_classes: int) -> Tensor:
    """The classes' logits ``[K M, C]`` of the ``M`` token ``inputs`` with their input embeddings replaced by
    ``values`` ``[K M, N, D]`` (copy-major), ``width`` rows per forward (the last chunk padded with copies of its
    last row, dropped): the adapter's forward from the embedding (:func:`methods.input_points.logits_at`), read at
    the classes' columns (an answer-token LM: its answer tokens)."""
    total, size = values.shape[0], inputs.batch_size
    classes = classifier.method_targets(torch.arange(num_classes))
    parts = []
    with torch.no_grad():
        for start in range(0, total, width):
            stop = min(start + width, total)
            index = torch.arange(start, start + width).clamp(max=stop - 1)
            rows = select_rows(inputs, index % size)
            out = logits_at(adapter, rows, "embedding", values[index].to(inputs["input_ids"].device))
            parts.append(out[: stop - start][:, classes.to(out.device)])
    return torch.cat(parts)
