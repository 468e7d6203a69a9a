"""The map gallery: every evaluation keeps the maps of a fixed handful of samples in its run folder.

The samples are those whose dataset index is below ``samples`` (the same samples in every run of a dataset);
for each the callback keeps the image (uint8) or the words, the label, the predicted class and every method's raw
map of ``class_setting`` (``outputs["relevance"]``, no extra explanation: a patch grid's scores, or a text's word
scores by the ``absmax`` reduction of :mod:`evaluation.words`), and from any other callback that offers them
(``gallery_maps()``, ``gallery_steps()``: :class:`callbacks.sanity.RandomisationTest`) the maps of the same samples
on the randomised models. At the end they are written to ``<run folder>/gallery.npz``
(:mod:`evaluation.gallery`; ``compare.py`` shows them). Every process keeps its own samples; the processes' rows
are gathered before rank 0 writes; a resumed run keeps the rows collected before it was stopped.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
import pytorch_lightning as pl
import torch
from torch import Tensor

from evaluation.gallery import GALLERY_FILE, kept, write_gallery
from evaluation.words import word_attribution_from_ids

from .reporter import ResultsReporter


def _gather(value: Any) -> List[Any]:
    """``value`` of every process (a list of one outside distributed runs)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [value]
    out: List[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, value)
    return out


class MapGallery(pl.Callback):
    """Keep the maps of the samples with dataset index below ``samples`` (module docstring).

    Args:
        samples: how many samples (dataset indices ``0 ... samples - 1``; 0: none, no file).
        class_setting: the explained class shown (``predicted`` or ``target``).
    """

    def __init__(self, samples: int = 4, class_setting: str = "predicted") -> None:
        super().__init__()
        if int(samples) < 0:
            raise ValueError(f"MapGallery: samples must be >= 0, got {samples}")
        self.samples, self.class_setting = int(samples), str(class_setting)
        self._rows: Dict[int, Dict[str, Any]] = {}
        self._units: Dict[int, Dict[str, Any]] = {}

    def on_test_start(self, trainer, pl_module) -> None:
        self._rows, self._units = {}, {}

    # a resumed run (evaluate.py --resume) keeps the rows collected before it was stopped
    def extra_progress_state(self) -> Dict[str, Any]:
        return {"rows": {str(k): dict(v) for k, v in self._rows.items()},
                "units": {str(k): dict(v) for k, v in self._units.items()}}

    def load_extra_progress_state(self, state: Dict[str, Any]) -> None:
        self._rows = {int(k): dict(v) for k, v in state["rows"].items()}
        self._units = {int(k): dict(v) for k, v in state["units"].items()}

    # ------------------------------------------------------------------------------------------ collecting
    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not outputs or not isinstance(batch.get("index"), Tensor):
            return
        ids = batch["index"].tolist()
        keep = kept(ids, self.samples)
        if not keep.any():
            return
        predicted = outputs["logits"].argmax(dim=-1)
        # an image batch may carry token ids too (CLIP zero-shot: the class prompts); its maps are the image's
        is_text = isinstance(batch.get("input_ids"), Tensor) and not isinstance(batch.get("image"), Tensor)
        for b in np.flatnonzero(keep).tolist():
            sample = int(ids[b])
            units = self._sample_units(batch, b, outputs, is_text)
            row: Dict[str, Any] = {"labels": int(batch["label"][b]) if "label" in batch else -1,
                                   "predicted": int(predicted[b])}
            if is_text:
                row["words"] = list(units["words"])
            else:
                image = batch["image"][b].detach().float().clamp(0, 1).permute(1, 2, 0)
                row["image"] = (image * 255).round().to(torch.uint8).cpu()
            for method, per_setting in outputs["relevance"].items():
                relevance = per_setting.get(self.class_setting)
                if relevance is not None:
                    row[f"map/{method}/{self.class_setting}"] = self.to_units(relevance[b], units)
            self._rows[sample], self._units[sample] = row, units

    @staticmethod
    def _sample_units(batch: Dict[str, Any], b: int, outputs: Dict[str, Any], is_text: bool) -> Dict[str, Any]:
        """What turns a map of sample ``b`` into its gallery units: a text's word ids and words, an image's grid."""
        if is_text:
            if isinstance(batch.get("word_ids"), Tensor) and "words" in batch:
                offset = int(batch["word_offset"][b]) if isinstance(batch.get("word_offset"), Tensor) else 0
                return {"word_ids": batch["word_ids"][b].detach().cpu(), "words": list(batch["words"][b]),
                        "offset": offset}
            mask = batch.get("attention_mask")
            n = int(mask[b].sum()) if isinstance(mask, Tensor) else int(batch["input_ids"].shape[1])
            positions = (mask[b].bool() if isinstance(mask, Tensor) else
                         torch.ones(batch["input_ids"].shape[1], dtype=torch.bool)).nonzero().flatten()
            word_ids = torch.full((batch["input_ids"].shape[1],), -1, dtype=torch.long)
            word_ids[positions] = torch.arange(n)
            return {"word_ids": word_ids, "words": [str(int(t)) for t in batch["input_ids"][b][positions]],
                    "offset": 0}
        layout = outputs.get("layout")
        grid = getattr(layout, "grid", None)
        return {"grid": [int(g) for g in grid] if grid is not None else []}

    @staticmethod
    def to_units(scores: Tensor, units: Dict[str, Any]) -> Tensor:
        """One sample's raw map as gallery units (float32 on the CPU): a text's word scores, an image's patches."""
        if "words" in units:
            words = word_attribution_from_ids(scores.detach(), units["word_ids"], units["words"], units["offset"],
                                              reduction="absmax")
            return words.scores.to(torch.float32)
        return scores.detach().flatten().to(torch.float32).cpu()

    # ------------------------------------------------------------------------------------------ writing
    def arrays(self, trainer: pl.Trainer) -> Optional[Dict[str, np.ndarray]]:
        """The gallery of every process (module docstring); ``None`` when no sample was kept."""
        rows: Dict[int, Dict[str, Any]] = {}
        units: Dict[int, Dict[str, Any]] = {}
        for part_rows, part_units in _gather((self._rows, self._units)):
            rows.update(part_rows)
            units.update(part_units)
        randomised: Dict[str, Dict[int, Tensor]] = {}
        steps: List[str] = []
        for callback in trainer.callbacks:
            offered = getattr(callback, "gallery_maps", None)
            if callable(offered) and callback is not self:
                for part in _gather(offered()):
                    for name, per_sample in part.items():
                        randomised.setdefault(name, {}).update(per_sample)
                steps = list(callback.gallery_steps())
        if not rows:
            return None
        ids = sorted(rows)
        out: Dict[str, np.ndarray] = {"ids": np.asarray(ids, dtype=np.int64),
                                      "labels": np.asarray([rows[i]["labels"] for i in ids], dtype=np.int64),
                                      "predicted": np.asarray([rows[i]["predicted"] for i in ids], dtype=np.int64)}
        if "image" in rows[ids[0]]:
            out["image"] = np.stack([rows[i]["image"].numpy() for i in ids])
            out["grid"] = np.asarray(units[ids[0]]["grid"], dtype=np.int64)
        else:
            width = max(len(rows[i]["words"]) for i in ids)
            out["words"] = np.asarray([rows[i]["words"] + [""] * (width - len(rows[i]["words"])) for i in ids],
                                      dtype=str)
            out["covered"] = np.asarray([[j < len(rows[i]["words"]) for j in range(width)] for i in ids])
        names = sorted({k for i in ids for k in rows[i] if k.startswith("map/")})
        for name in names:
            out[name] = self._stack([rows[i].get(name) for i in ids], ())
        for name, per_sample in sorted(randomised.items()):
            if f"map/{name}" not in out:
                continue     # a map the gallery does not show (the input-only map lives on another unit)
            maps = [None if i not in per_sample else
                    torch.stack([self.to_units(step, units[i]) for step in per_sample[i]]) for i in ids]
            out[f"randomised/{name}"] = self._stack(maps, (len(steps),))
            out["steps"] = np.asarray(steps, dtype=str)
        return out

    @staticmethod
    def _stack(rows: List[Optional[Tensor]], lead: tuple) -> np.ndarray:
        """Rows padded with NaN to the longest (texts differ in words) and where a row is missing."""
        width = max((int(r.shape[-1]) for r in rows if r is not None), default=0)
        out = np.full((len(rows), *lead, width), np.nan, dtype=np.float32)
        for k, row in enumerate(rows):
            if row is not None:
                out[k, ..., : row.shape[-1]] = row.numpy()
        return out

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        arrays = self.arrays(trainer)
        folder = ResultsReporter.of(trainer).output_dir
        if trainer.is_global_zero and arrays is not None and folder is not None:
            write_gallery(arrays, folder / GALLERY_FILE)
