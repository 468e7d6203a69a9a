"""Randomisation sanity checks: MPRT, sMPRT, eMPRT and the random-logit test (measures: :mod:`evaluation.sanity`,
randomiser: :mod:`evaluation.randomisation`).

* **MPRT** (Adebayo et al. 2018, NeurIPS, sec. 3.1): each batch is re-explained (``outputs["explain"]`` with a
  ``model``) on randomised deep copies of ``outputs["model"]``, per ``orders``: ``top_down`` (cascading from the
  head down to the embedding; the last step randomises every parameter), ``bottom_up``, ``independent`` (one
  group at a time); the groups are the embedding, each block and the head. The similarity of the original and the
  randomised map (``measures``: ``spearman`` of ``|a|``, ``ssim`` of the pixel maps ``|a| / max |a|``, ``topk``
  intersection of the ``top_k`` share of units; a constant ``|a|`` on the randomised model, e.g. a Grad-CAM map
  that the ReLU zeroes, has similarity 0 instead of undefined; a sample whose original map is constant is
  skipped) gives a curve per step: x = step number, steps in
  :meth:`RandomisationTest.conventions`. A cascade **passes** when the mean ``pass_measure`` of its last step is
  below ``mprt_threshold``; ``independent`` when the mean over its steps is;
* **sMPRT** (Hedström et al. 2023, "Sanity checks revisited", TMLR, sec. 4.1): ``noisy_samples`` > 0 also compares
  the maps averaged over that many Gaussian perturbations (std ``noise_std`` in [0, 1] pixels, drawn from ``(seed,
  sample index)``) of the image, on the original and on each randomised model (images only);
* **eMPRT** (ibid., eq. 7): ``(H(fully randomised) - H(original)) / H(original)``, H the 100-bin histogram entropy
  of ``|a| / max |a|``; passes above ``emprt_threshold``;
* **random logit** (Sixt et al. 2020, ICML, sec. 5.2): the map for another class, drawn per sample from ``(seed,
  sample index)`` among the classifier's classes other than the explained one (CLIP: another prompt; a decoder:
  another answer token); passes when the mean ``pass_measure`` is below ``random_logit_threshold``.

``input_only=True`` adds the test of the tests: a method ``input_only`` whose map depends on the input alone
(images: Sobel edge magnitude of the grey image; texts: the token ids as scores), explained the same way on every
model: it must fail MPRT. Results: ``sanity/<method>/<setting>/<metric>``; lower similarity is better, ``*_pass``
is 1 (pass) or 0 (fail). Cost per sample and method: ``sum over orders of steps`` E (times ``noisy_samples`` + 1
with sMPRT), 1 E for eMPRT, 1 E for the random logit. The randomised copies are built once per batch and step.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from evaluation.map_units import image_units
from evaluation.metric_cards import MetricCard
from evaluation.randomisation import ORDERS, randomisation_groups, randomisation_steps, randomised_copy
from evaluation.result_keys import ResultKey
from evaluation.sample_values import SampleValues, nan_mean
from evaluation.sanity import emprt, spearman_abs, ssim, topk_intersection

from .base import EvaluationCallback, Result, outputs_device, relevance_for

MEASURES = ("spearman", "ssim", "topk")
INPUT_ONLY = "input_only"


def input_only_map(batch: Dict[str, Any]) -> Tensor:
    """A map of the input alone: the Sobel gradient magnitude of an image's grey values ``[B, H, W]``, or a text's
    token ids as scores ``[B, N]``."""
    if isinstance(batch.get("input_ids"), Tensor):
        return batch["input_ids"].to(torch.float64)
    if not isinstance(batch.get("image"), Tensor):
        raise KeyError(f"sanity: input_only needs 'image' or 'input_ids' in the batch; got keys {sorted(batch)}")
    grey = batch["image"].detach().to(torch.float64).mean(dim=1, keepdim=True)
    kx = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], dtype=torch.float64)
    weight = torch.stack([kx, kx.T])[:, None].to(grey.device)
    gradient = F.conv2d(F.pad(grey, (1, 1, 1, 1), mode="replicate"), weight)
    return gradient.pow(2).sum(dim=1).sqrt()


def other_classes(targets: Tensor, sample_ids: Tensor, num_classes: int, seed: int) -> Tensor:
    """``[B]`` a class other than ``targets[i]``, uniform among the others, drawn from ``(seed, sample id)``."""
    if num_classes < 2:
        raise ValueError("sanity: the random-logit test needs at least two classes")
    out = []
    for target, sample in zip(targets.tolist(), sample_ids.tolist()):
        gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(sample) + 17)
        draw = int(torch.randint(num_classes - 1, (1,), generator=gen))
        out.append(draw + int(draw >= target))
    return torch.tensor(out, dtype=torch.long, device=targets.device)


def _verdict(passed: bool, value: Any) -> float:
    """1.0 / 0.0, NaN when the judged value is NaN."""
    return float("nan") if value != value else float(passed)


class RandomisationTest(EvaluationCallback):
    """MPRT, sMPRT, eMPRT and random-logit checks of every method (module docstring).

    Args:
        methods: method names (default: every method of the module's outputs).
        class_settings: explained classes (default ``predicted``).
        orders: MPRT orders, a subset of ``top_down``, ``bottom_up``, ``independent``.
        measures: similarity measures (default: ``spearman``, ``ssim``, ``topk`` on images; no ``ssim`` on texts).
        pass_measure: the measure the pass / fail verdicts read.
        top_k: the share of units of the top-k intersection.
        unit: ``patch`` (default) or ``pixel`` for the rank measures on images (SSIM: always pixels).
        ssim_window: SSIM's window side (odd).
        mprt_threshold, random_logit_threshold: a similarity below passes; emprt_threshold: an eMPRT above passes.
        noisy_samples, noise_std: sMPRT (0: off).
        emprt, random_logit: run those checks.
        input_only: add the input-only map (test of the tests).
        seed: the randomisation's, the noise's and the other classes' seed.
        gallery_samples: keep the maps of the samples with dataset index below it on every step of the cascade
            (``top_down``, else the first order) for the run's map gallery (:mod:`callbacks.map_gallery`).
    """

    PREFIX = "sanity"
    metric_cards = (
        MetricCard("mprt_<order>_<measure>", "similarity of the map and the map on the model randomised up to each "
                   "group (embedding, blocks, head), per step (curve)", "Adebayo et al. 2018 (NeurIPS), sec. 3.1",
                   "S E per order (S = groups)", False),
        MetricCard("mprt_<order>_pass", "1 when the mean similarity at full randomisation (independent: over the "
                   "steps) is below mprt_threshold", "Adebayo et al. 2018 (NeurIPS), sec. 3.1", "0", True),
        MetricCard("smprt_<order>_<measure>", "MPRT on maps averaged over N noisy inputs", "Hedström et al. 2023 "
                   "(TMLR), sec. 4.1", "S N E per order", False, ("image", "clip_image")),
        MetricCard("emprt", "(H(fully randomised map) - H(map)) / H(map), H the 100-bin histogram entropy",
                   "Hedström et al. 2023 (TMLR), eq. 7", "1 E", True),
        MetricCard("smprt_<order>_pass", "1 when the sMPRT similarity is below mprt_threshold (as MPRT's)",
                   "Hedström et al. 2023 (TMLR), sec. 4.1", "0", True, ("image", "clip_image")),
        MetricCard("emprt_pass", "1 when eMPRT is above emprt_threshold", "Hedström et al. 2023 (TMLR), eq. 7", "0",
                   True),
        MetricCard("random_logit_<measure>", "similarity of the map and the map of a random other class",
                   "Sixt et al. 2020 (ICML), sec. 5.2", "1 E", False),
        MetricCard("random_logit_pass", "1 when the random-logit similarity (pass_measure) is below "
                   "random_logit_threshold", "Sixt et al. 2020 (ICML), sec. 5.2", "0", True),
    )

    def __init__(self, methods: Optional[Sequence[str]] = None, class_settings: Sequence[str] = ("predicted",),
                 orders: Sequence[str] = ("top_down", "independent"), measures: Optional[Sequence[str]] = None,
                 pass_measure: str = "spearman", top_k: float = 0.2, unit: str = "patch", ssim_window: int = 7,
                 mprt_threshold: float = 0.5, random_logit_threshold: float = 0.5, emprt_threshold: float = 0.0,
                 noisy_samples: int = 0, noise_std: float = 0.1, emprt: bool = True, random_logit: bool = True,
                 input_only: bool = False, seed: int = 0, gallery_samples: int = 4) -> None:
        super().__init__()
        self._select(methods, class_settings)
        if not orders or any(o not in ORDERS for o in orders):
            raise ValueError(f"sanity: orders must be a non-empty subset of {ORDERS}, got {list(orders)}")
        if measures is not None and (not measures or any(m not in MEASURES for m in measures)):
            raise ValueError(f"sanity: measures must be a non-empty subset of {MEASURES}, got {list(measures)}")
        if pass_measure not in MEASURES or (measures is not None and pass_measure not in measures):
            raise ValueError(f"sanity: pass_measure {pass_measure!r} must be one of the measures")
        if unit not in ("patch", "pixel"):
            raise ValueError(f"sanity: unit must be 'patch' or 'pixel', got {unit!r}")
        if int(noisy_samples) < 0 or noise_std <= 0:
            raise ValueError(f"sanity: noisy_samples must be >= 0 and noise_std > 0, got {noisy_samples}, {noise_std}")
        self.orders, self.measures = tuple(orders), None if measures is None else tuple(measures)
        self.pass_measure, self.top_k, self.unit, self.ssim_window = pass_measure, float(top_k), unit, int(ssim_window)
        self.mprt_threshold, self.random_logit_threshold = float(mprt_threshold), float(random_logit_threshold)
        self.emprt_threshold, self.noisy_samples, self.noise_std = float(emprt_threshold), int(noisy_samples), \
            float(noise_std)
        self.emprt, self.random_logit, self.input_only, self.seed = bool(emprt), bool(random_logit), \
            bool(input_only), int(seed)
        if int(gallery_samples) < 0:
            raise ValueError(f"sanity: gallery_samples must be >= 0, got {gallery_samples}")
        self.gallery_samples = int(gallery_samples)
        self.reset()

    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        defaults = (("orders", ["top_down", "independent"]), ("pass_measure", "spearman"), ("unit", "patch"),
                    ("mprt_threshold", 0.5), ("noisy_samples", 0), ("seed", 0))
        return [f"sanity_{name}:{init_args.get(name, default)}" for name, default in defaults]

    def conventions(self) -> Dict[str, Any]:
        return {"orders": list(self.orders), "steps": dict(self._steps), "measures": self._measures(),
                "pass_measure": self.pass_measure, "magnitude": "abs", "unit": self.unit,
                "constant_maps": "randomised: similarity 0; original: sample skipped", "ssim": "pixel maps",
                "top_k": self.top_k, "thresholds": {"mprt": self.mprt_threshold, "emprt": self.emprt_threshold,
                                                    "random_logit": self.random_logit_threshold},
                "randomisation": "N(mean, max(std, 0.02)^2) per tensor, norms max(std, 0.5)", "seed": self.seed}

    # ------------------------------------------------------------------------------------------ layout
    def _measures(self) -> List[str]:
        return list(self.measures) if self.measures is not None else list(self._default_measures)

    def _columns(self) -> List[Tuple[str, int]]:
        """``[(metric name, width)]`` of one method's per-sample row."""
        columns = []
        for prefix in ["mprt"] + (["smprt"] if self.noisy_samples else []):
            for order in self.orders:
                columns += [(f"{prefix}_{order}_{m}", len(self._steps[order])) for m in self._measures()]
        if self.emprt:
            columns.append(("emprt", 1))
        if self.random_logit:
            columns += [(f"random_logit_{m}", 1) for m in self._measures()]
        return columns

    def _pairs(self) -> List[Tuple[str, str]]:
        return [(m, s) for m in self._built_methods for s in self.class_settings]

    def build(self, methods: Sequence[str], steps: Dict[str, List[str]], measures: Sequence[str],
              device=None) -> None:
        self._built_methods, self._steps, self._default_measures = list(methods), dict(steps), list(measures)
        width = sum(w for _, w in self._columns())
        self._metrics = {f"{m}/{s}": SampleValues(width) for m, s in self._pairs()}
        self._place_metrics(device)

    def reset(self) -> None:
        super().reset()
        self._steps: Dict[str, List[str]] = {}
        self._default_measures: List[str] = []
        self._gathered: Dict[str, Tuple[Tensor, Tensor]] = {}
        self._gallery: Dict[str, Dict[int, Tensor]] = {}

    # ------------------------------------------------------------------------------------------ gallery
    def _gallery_order(self) -> str:
        return "top_down" if "top_down" in self.orders else self.orders[0]

    def gallery_steps(self) -> List[str]:
        """The step names of the gallery's randomised maps (the cascade of :meth:`_gallery_order`)."""
        return list(self._steps.get(self._gallery_order(), []))

    def gallery_maps(self) -> Dict[str, Dict[int, Tensor]]:
        """``{"<method>/<setting>": {sample index: [steps, ...] maps}}`` of the kept samples (this process's)."""
        return {name: dict(rows) for name, rows in self._gallery.items()}

    def extra_progress_state(self) -> Dict[str, Any]:
        return {"gallery": {name: {str(i): m for i, m in rows.items()} for name, rows in self._gallery.items()}}

    def load_extra_progress_state(self, state: Dict[str, Any]) -> None:
        self._gallery = {name: {int(i): m for i, m in rows.items()} for name, rows in state.get("gallery", {}).items()}

    # ------------------------------------------------------------------------------------------ maps
    def _compare(self, a: Tensor, b: Tensor, batch: Dict[str, Any], layout: Any) -> Dict[str, Tensor]:
        """``{measure: [B]}`` similarities of two maps of a batch."""
        out = {}
        if isinstance(batch.get("image"), Tensor) and not isinstance(batch.get("input_ids"), Tensor):
            hw = batch["image"].shape[-2:]
            ua, ub, valid = image_units(a, hw, layout, self.unit), image_units(b, hw, layout, self.unit), None
            for measure in self._measures():
                if measure == "ssim":
                    pa = image_units(a, hw, layout, "pixel").view(-1, *hw)
                    pb = image_units(b, hw, layout, "pixel").view(-1, *hw)
                    out[measure] = ssim(pa, pb, self.ssim_window)
        else:
            ua, ub, valid = a.detach().to(torch.float64), b.detach().to(torch.float64), self._valid(batch)
        for measure in self._measures():
            if measure == "spearman":
                out[measure] = spearman_abs(ua, ub, valid)
            elif measure == "topk":
                out[measure] = topk_intersection(ua, ub, self.top_k, valid)
        flat_a, flat_b = self._constant(ua, valid), self._constant(ub, valid)
        nan = torch.tensor(float("nan"), dtype=torch.float64)
        return {m: torch.where(flat_a, nan, torch.where(flat_b, 0.0, v.to(torch.float64))) for m, v in out.items()}

    @staticmethod
    def _constant(units: Tensor, valid: Optional[Tensor]) -> Tensor:
        """``[B]`` whether a map's ``|a|`` is the same on every (valid) unit (an all-zero map included)."""
        magnitude = units.detach().abs().flatten(1).to(torch.float64).cpu()
        keep = torch.ones_like(magnitude, dtype=torch.bool) if valid is None else valid.flatten(1).bool().cpu()
        high = torch.where(keep, magnitude, torch.full_like(magnitude, -float("inf"))).amax(dim=1)
        low = torch.where(keep, magnitude, torch.full_like(magnitude, float("inf"))).amin(dim=1)
        return high == low

    def _valid(self, batch: Dict[str, Any]) -> Optional[Tensor]:
        """The units a text map is compared on (content tokens: ``word_ids >= 0``, else the attention mask)."""
        if isinstance(batch.get("input_ids"), Tensor):
            word_ids = batch.get("word_ids")
            return word_ids >= 0 if isinstance(word_ids, Tensor) else batch.get("attention_mask")
        return None

    def _explainer(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> Callable:
        """``explain(method, inputs, target, model)`` -> maps; the input-only map ignores everything but the batch."""
        explain = outputs["explain"]
        ids = batch["index"]

        def run(method: str, inputs: Any, target: Optional[Tensor], model: Any, noisy: Optional[Tensor] = None
                ) -> Tensor:
            if method == INPUT_ONLY:
                return input_only_map(batch if noisy is None else dict(batch, image=noisy))
            repeat = 1 if noisy is None else noisy.shape[0] // ids.shape[0]
            return explain(method, inputs, None if target is None else target.repeat(repeat), ids.repeat(repeat),
                           model=model)
        return run

    # ------------------------------------------------------------------------------------------ update
    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        if not isinstance(batch.get("index"), Tensor):
            raise KeyError(f"{self.PREFIX}: the batch has no 'index' (each sample's dataset index), which seeds its "
                           f"noise and other classes; got keys {sorted(batch)}")
        for needed in ("explain", "model", "classifier"):
            if needed not in outputs:
                raise KeyError(f"{self.PREFIX}: the outputs have no {needed!r} (the evaluation module's test_step "
                               f"gives 'explain', 'model' and 'classifier')")
        is_text = isinstance(batch.get("input_ids"), Tensor)
        if is_text and self.noisy_samples:
            raise ValueError("sanity: sMPRT (noisy_samples > 0) perturbs images; on texts the noise would live in "
                             "the embedding space, which the evaluation module's methods do not read")
        if is_text and self.measures is not None and "ssim" in self.measures:
            raise ValueError("sanity: ssim compares image maps; use spearman and topk on texts")
        model, classifier, layout = outputs["model"], outputs["classifier"], outputs.get("layout")
        if not self._metrics:
            methods = list(self.methods) if self.methods is not None else list(outputs["relevance"])
            if self.input_only and INPUT_ONLY not in methods:
                methods.append(INPUT_ONLY)
            steps = {order: [s for s, _ in randomisation_steps(model, order)] for order in self.orders}
            self.build(methods, steps, ["spearman", "topk"] if is_text else list(MEASURES), outputs_device(outputs))
        groups = dict((o, dict(randomisation_steps(model, o))) for o in self.orders)
        every_group = [g for g, _ in randomisation_groups(model)]
        inputs = classifier.model_inputs(batch)
        run = self._explainer(outputs, batch)
        specific = outputs.get("class_specific", {})
        noisy_images, noisy_inputs = self._noisy(batch, classifier)
        cache: Dict[Tuple, Tensor] = {}
        copies: Dict[Tuple[str, ...], Any] = {}

        def model_for(chosen: Tuple[str, ...]) -> Any:
            if chosen not in copies:
                copies.clear()      # one randomised copy alive at a time
                copies[chosen] = randomised_copy(model, list(chosen), self.seed)
            return copies[chosen]

        def maps(method: str, target: Optional[Tensor], chosen: Tuple[str, ...], smooth: bool) -> Tensor:
            chosen = tuple(sorted(chosen))                  # a set of groups: the same copy whatever the order
            key = (method, None if target is None else tuple(target.tolist()), chosen, smooth)
            if key not in cache:
                used = model if not chosen else model_for(chosen)
                if smooth:
                    many = run(method, noisy_inputs, target, used, noisy_images)
                    cache[key] = many.reshape(self.noisy_samples, -1, *many.shape[1:]).to(torch.float64).mean(0)
                else:
                    cache[key] = run(method, inputs, target, used)
            return cache[key]

        rows: Dict[str, Tensor] = {}
        for order in self.orders:                          # randomised copies outermost: one alive at a time
            for step in self._steps[order]:
                chosen = tuple(groups[order][step])
                for method, setting in self._pairs():
                    target = self._target(outputs, method, setting, specific)
                    for smooth in [False] + ([True] if self.noisy_samples else []):
                        maps(method, target, chosen, smooth)
        self._keep_gallery(batch, groups, maps, outputs, specific)
        for method, setting in self._pairs():
            target = self._target(outputs, method, setting, specific)
            original = (input_only_map(batch) if method == INPUT_ONLY
                        else relevance_for(outputs["relevance"], method, setting, self.PREFIX))
            columns: List[Tensor] = []
            for smooth in [False] + ([True] if self.noisy_samples else []):
                base = maps(method, target, (), True) if smooth else original
                for order in self.orders:
                    curves = {m: [] for m in self._measures()}
                    for step in self._steps[order]:
                        randomised = maps(method, target, tuple(groups[order][step]), smooth)
                        for m, values in self._compare(base, randomised, batch, layout).items():
                            curves[m].append(values)
                    columns += [torch.stack(curves[m], dim=1) for m in self._measures()]
            if self.emprt:
                full = maps(method, target, tuple(every_group), False)
                units = self._units(original, batch, layout), self._units(full, batch, layout)
                columns.append(emprt(units[0], units[1], valid=self._valid(batch))[:, None])
            if self.random_logit:
                if method == INPUT_ONLY or not bool(specific.get(method, True)):
                    other_map = original
                else:
                    other = other_classes(outputs["targets"][setting], batch["index"], int(outputs["logits"].shape[-1]),
                                          self.seed)
                    other_map = run(method, inputs, other, None)
                similar = self._compare(original, other_map, batch, layout)
                columns += [similar[m][:, None] for m in self._measures()]
            rows[f"{method}/{setting}"] = torch.cat([c.to(torch.float64).cpu() for c in columns], dim=1)
        for pair, values in rows.items():
            self._metrics[pair].update(batch["index"], values)

    def _keep_gallery(self, batch: Dict[str, Any], groups: Dict[str, Dict[str, List[str]]], maps: Callable,
                      outputs: Dict[str, Any], specific: Dict[str, bool]) -> None:
        """Keep the randomised maps of the batch's gallery samples (index below ``gallery_samples``)."""
        rows = (batch["index"] < self.gallery_samples).nonzero().flatten().tolist()
        if not rows:
            return
        order = self._gallery_order()
        for method, setting in self._pairs():
            if method == INPUT_ONLY:
                continue
            target = self._target(outputs, method, setting, specific)
            steps = torch.stack([maps(method, target, tuple(groups[order][step]), False).detach()
                                 for step in self._steps[order]], dim=1).to(torch.float32).cpu()
            for b in rows:
                self._gallery.setdefault(f"{method}/{setting}", {})[int(batch["index"][b])] = steps[b].clone()

    def _units(self, maps: Tensor, batch: Dict[str, Any], layout: Any) -> Tensor:
        if isinstance(batch.get("image"), Tensor) and not isinstance(batch.get("input_ids"), Tensor):
            return image_units(maps, batch["image"].shape[-2:], layout, self.unit)
        return maps.detach().to(torch.float64)

    def _target(self, outputs: Dict[str, Any], method: str, setting: str, specific: Dict[str, bool]
                ) -> Optional[Tensor]:
        if method == INPUT_ONLY or not bool(specific.get(method, True)):
            return None
        return outputs["targets"][setting]

    def _noisy(self, batch: Dict[str, Any], classifier: Any) -> Tuple[Optional[Tensor], Any]:
        """sMPRT's ``noisy_samples`` perturbed copies of the images ``[N * B, C, H, W]`` (run-major) and their
        model inputs; ``(None, None)`` when sMPRT is off."""
        if not self.noisy_samples:
            return None, None
        images = batch["image"]
        parts = []
        for sample in batch["index"].tolist():
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + int(sample) + 29)
            parts.append(torch.randn((self.noisy_samples, *images.shape[1:]), generator=gen, dtype=torch.float64))
        noise = torch.stack(parts, dim=1).to(images.device) * self.noise_std
        noisy = (images[None].to(torch.float64) + noise).to(images.dtype).flatten(0, 1)
        return noisy, classifier.normalize(noisy)

    # ------------------------------------------------------------------------------------------ results
    def _result(self, method: str, setting: str, name: str) -> str:
        return ResultKey(self.PREFIX, method, setting, name).format()

    def compute(self) -> Dict[str, Result]:
        results: Dict[str, Result] = {}
        self._gathered = {}
        for method, setting in self._pairs():
            index, values, _ = self._metrics[f"{method}/{setting}"].gathered()
            self._gathered[f"{method}/{setting}"] = (index, values)
            start = 0
            for name, width in self._columns():
                mean = nan_mean(values[:, start:start + width])
                results[self._result(method, setting, name)] = mean.tolist() if width > 1 else float(mean[0])
                start += width
            results.update(self._verdicts(method, setting, results))
        return results

    def _verdicts(self, method: str, setting: str, results: Dict[str, Result]) -> Dict[str, Result]:
        """``1.0`` pass, ``0.0`` fail, NaN where no sample could be judged (every original map constant)."""
        out: Dict[str, Result] = {}
        for prefix in ["mprt"] + (["smprt"] if self.noisy_samples else []):
            for order in self.orders:
                curve = results[self._result(method, setting, f"{prefix}_{order}_{self.pass_measure}")]
                curve = curve if isinstance(curve, list) else [curve]
                value = curve[-1] if order != "independent" else sum(curve) / len(curve)
                key = self._result(method, setting, f"{prefix}_{order}_pass")
                out[key] = _verdict(value < self.mprt_threshold, value)
        if self.emprt:
            value = results[self._result(method, setting, "emprt")]
            out[self._result(method, setting, "emprt_pass")] = _verdict(value > self.emprt_threshold, value)
        if self.random_logit:
            value = results[self._result(method, setting, f"random_logit_{self.pass_measure}")]
            out[self._result(method, setting, "random_logit_pass")] = _verdict(value < self.random_logit_threshold,
                                                                                value)
        return out

    def per_sample_scores(self) -> Dict[str, tuple]:
        out: Dict[str, tuple] = {}
        for pair, (index, values) in self._gathered.items():
            method, setting = pair.split("/", 1)
            start = 0
            for name, width in self._columns():
                out[self._result(method, setting, name)] = (index, values[:, start:start + width] if width > 1
                                                            else values[:, start])
                start += width
        return out

    def higher_is_better(self) -> Dict[str, Optional[bool]]:
        out: Dict[str, Optional[bool]] = {}
        for method, setting in self._pairs():
            for name, _ in self._columns():
                out[self._result(method, setting, name)] = name == "emprt"
            for key in self._verdicts_keys(method, setting):
                out[key] = True
        return out

    def _verdicts_keys(self, method: str, setting: str) -> List[str]:
        names = [f"{p}_{o}_pass" for p in ["mprt"] + (["smprt"] if self.noisy_samples else []) for o in self.orders]
        names += (["emprt_pass"] if self.emprt else []) + (["random_logit_pass"] if self.random_logit else [])
        return [self._result(method, setting, n) for n in names]

    def curve_x(self) -> Dict[str, List[float]]:
        out: Dict[str, List[float]] = {}
        for method, setting in self._pairs():
            for name, width in self._columns():
                if width > 1:
                    out[self._result(method, setting, name)] = [float(i + 1) for i in range(width)]
        return out
