"""SaCo test (Wu et al. 2024, CVPR; measure: :mod:`evaluation.saco`): per sample and map, the ``groups`` (K)
salience groups of its units are removed one at a time (K forwards), and the agreement between the groups' salience
order and the probability drops they cause is scored in [−1, 1]; higher is better; mean over samples.

Units: images ``patch`` (default; a pixel-level map summed per patch, :func:`evaluation.map_units.image_units`)
or ``pixel``; texts ``token`` (the removable tokens of the token perturber: special tokens never). Removal as the
perturbation test's ``masking`` (images ``chefer`` black / ``mean``; texts ``pad`` / ``mask`` / ``delete``). The
perturbed inputs depend on the map: K forwards per sample and distinct map (a class-agnostic method's map once for
every class setting), counted in ``saco/forwards``, at a fixed width (as the faithfulness-correlation test).
Results: ``saco/<method>/<setting>/coefficient``; the explained class's probability (softmax, float64).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
from torch import Tensor

from evaluation.map_units import image_units
from evaluation.metric_cards import MetricCard
from evaluation.perturbers import PixelPerturber, TokenPerturber, build_perturber
from evaluation.saco import saco, saco_groups

from .base import OncePerMap, relevance_for
from .faithfulness_correlation import fixed_width_logits
from .sample_scores import SampleScoreTest

FORWARDS = "forwards"


class SaCoTest(SampleScoreTest):
    """SaCo of every method's map (module docstring).

    Args:
        methods: method names (default: every method of the module's outputs).
        class_settings: explained classes (default ``predicted``).
        groups: the number K of salience groups (the paper's 10).
        unit: ``patch`` or ``pixel`` (images), ``token`` (texts); ``None``: ``patch`` / ``token``.
        masking: how removed units go; ``None``: ``chefer`` for images, ``pad`` for texts.
        oracle: add the ground-truth map as method ``oracle`` (:func:`callbacks.sample_scores.oracle_map`).
    """

    counters = (FORWARDS,)
    PREFIX = "saco"
    metric_cards = (
        MetricCard("coefficient", "agreement in [-1, 1] between the salience order of K unit groups and the "
                   "probability drop each causes when removed alone, weighted by salience differences",
                   "Wu et al. 2024 (CVPR), Alg. 1 (pseudo-code only upstream)", "K F (K = groups, per map)", True),
    )

    def __init__(self, methods: Optional[Sequence[str]] = None, class_settings: Sequence[str] = ("predicted",),
                 groups: int = 10, unit: Optional[str] = None, masking: Optional[str] = None,
                 oracle: bool = False) -> None:
        if int(groups) < 2:
            raise ValueError(f"SaCo: groups must be >= 2, got {groups}")
        if unit not in (None, "pixel", "patch", "token"):
            raise ValueError(f"SaCo: unit must be pixel, patch, token or None, got {unit!r}")
        self.groups, self.unit, self.masking = int(groups), unit, masking
        super().__init__(methods, class_settings, oracle)

    @classmethod
    def wandb_tags(cls, init_args: Mapping[str, Any]) -> List[str]:
        return [f"saco_{name}:{init_args.get(name, default)}" for name, default in (
            ("groups", 10), ("unit", "auto"), ("masking", "auto"))]

    def conventions(self) -> Dict[str, Any]:
        return {"groups": self.groups, "unit": self.unit or "patch / token", "masking": self.masking or "chefer / pad",
                "score": "probability", "ties": "unit index"}

    def update(self, outputs: Dict[str, Any], batch: Dict[str, Any]) -> None:
        outputs = self._indexed_outputs(outputs, batch)
        image = not isinstance(batch.get("input_ids"), Tensor)
        if image and not isinstance(batch.get("image"), Tensor):
            raise KeyError(f"SaCo: the batch has neither 'image' nor 'input_ids'; got keys {sorted(batch)}")
        unit = self.unit or ("patch" if image else "token")
        if (unit == "token") == image:
            raise ValueError(f"SaCo: unit {unit!r} is not defined on {'images' if image else 'texts'}")
        options = {} if image else {"clamp": False}
        perturber = build_perturber(self.masking or ("chefer" if image else "pad"), **options)
        if not isinstance(perturber, PixelPerturber if image else TokenPerturber):
            raise ValueError(f"SaCo: masking {self.masking!r} does not remove {'pixels' if image else 'tokens'}")
        classifier, layout = outputs["classifier"], outputs.get("layout")
        if image:
            h_img, w_img = batch["image"].shape[-2:]
            grid = (h_img, w_img) if unit == "pixel" else tuple(layout.grid)
            removable = torch.ones(batch["image"].shape[0], grid[0] * grid[1], dtype=torch.bool)
        else:
            removable = perturber.removable(batch).cpu()
        b = removable.shape[0]
        clean = torch.softmax(outputs["logits"].detach().to(torch.float64), dim=-1).cpu()
        once = OncePerMap()
        for method, setting in self._pairs():
            rel = relevance_for(outputs["relevance"], method, setting, self.PREFIX)
            if image:
                scores = image_units(rel, (h_img, w_img), layout, unit).cpu()
            else:
                scores = rel.detach().to(torch.float64).cpu()
            group = saco_groups(scores, removable, self.groups)
            members = torch.stack([group == k for k in range(self.groups)])          # [K, B, N]

            def probabilities(members=members):
                removed = members
                if image and unit == "patch":
                    kh, kw = h_img // grid[0], w_img // grid[1]
                    removed = (members.reshape(self.groups, b, grid[0], 1, grid[1], 1)
                               .expand(self.groups, b, grid[0], kh, grid[1], kw).reshape(self.groups, b, -1))
                device = batch["image"].device if image else batch["input_ids"].device
                inputs = perturber.perturb(batch, removed.to(device), classifier)
                logits = fixed_width_logits(classifier, inputs, int(classifier.batch_size))
                self._metrics[FORWARDS].update(self.groups * b)
                return torch.softmax(logits.to(torch.float64), dim=-1).cpu().reshape(self.groups, b, -1)

            after = once.get(rel, probabilities)
            target = outputs["targets"][setting].long().cpu()
            drops = clean.gather(1, target[:, None])[:, 0][None] - after.gather(
                2, target[None, :, None].expand(self.groups, -1, 1))[..., 0]
            sums = (members.to(torch.float64) * scores[None]).sum(dim=-1)
            self._metrics[f"{method}/{setting}"].update(batch["index"], saco(sums, drops)[:, None])
