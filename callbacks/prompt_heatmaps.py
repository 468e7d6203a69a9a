"""Prompt heatmaps of a CLIP zero-shot evaluation: which words of the prompts drive the match with an image.

Only the global-rank-0 process collects (its first ``num_images`` test images). At the end of the test epoch
each image is matched with texts through the text tower
(:class:`models.clip.PromptScorer` over the collected images; every text explained against its own image,
``target`` = the image's position):

* the first ``num_prompts`` prompts of the explained class (``class_setting``: ``predicted``, the argmax of the
  clean zero-shot logits, or ``target``, the label) from the classifier's ``prompts`` (one list per class, as
  :func:`models.clip.load_zero_shot_classifier` and ``ZeroShotClassifier.from_prompts`` keep them);
* the image's own caption, ``batch[caption_key]`` (``List[str]``), when the batch has it (the synthetic caption
  data: shape, colour, position and distractor words).

Every method of the evaluation module (``methods``: a subset by name) runs on the text batch as the module runs
it on images (the same built method objects and options; token scores ``[T, N]`` read at each text's end
token, exactly 0 at padding); the token scores become word scores over the text's whitespace words
(:func:`evaluation.words.word_scores`, ``reduction`` ``max`` by default) and are drawn by
:func:`evaluation.words.text_heatmap_html` (escaped HTML, diverging colours, one row per method): one
section per image with its thumbnail, label and prediction, one block per text. A method that cannot run on the
text tower (e.g. a concept vector of the image latent) is named on the page and in a warning, not drawn.

Also ``class_word_top1``: per method, the share of the texts whose highest-scoring word is the explained
class's name (a multi-word name counts when its best word wins), shown at the top of the page.

Written to ``<run folder>/prompt_heatmaps.html`` and logged as ``prompt_heatmaps`` (``wandb.Html``) by a W&B
logger. The classifier must be a CLIP zero-shot classifier that carries its ``tokenizer``
(``models.clip.load_zero_shot_classifier``).
"""
from __future__ import annotations

import base64
import io
import math
from typing import Any, Dict, List, Optional, Sequence, Union

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor

from evaluation.method_specs import CLASS_SETTINGS
from evaluation.words import WordAttribution, check_reduction, page_html, text_heatmap_html, word_scores
from evaluation.words.heatmap import escape
from models.clip import PromptScorer, reads_attention_mask, text_padding

from .html_page import publish_html_page


def image_thumbnail(image: Tensor, size: int = 128) -> str:
    """A ``data:image/png;base64`` URL of a [0, 1] image ``[3, H, W]``, scaled to ``size`` pixels (nearest)."""
    from PIL import Image

    array = (image.detach().float().clamp(0, 1).cpu().permute(1, 2, 0).numpy() * 255).round().astype("uint8")
    picture = Image.fromarray(array).resize((size, size), Image.NEAREST)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def class_word_wins(row: WordAttribution, classname: str) -> bool:
    """Whether the highest score among the covered words of ``row`` belongs to words of ``classname`` only
    (punctuation around a word ignored, case-insensitive): a tie with another word at the top, an all-zero map
    included, is not a win."""
    names = {w.strip(".,;:!?\"'()").lower() for w in classname.split()}
    scores = [(s, w) for s, w, c in zip(row.scores.tolist(), row.words, row.covered.tolist())
              if c and math.isfinite(s)]
    if not scores:
        return False
    best = max(s for s, _ in scores)
    return all(w.strip(".,;:!?\"'()").lower() in names for s, w in scores if s == best)


class PromptHeatmaps(pl.Callback):
    """Word heatmaps of the prompts (and captions) matched with the first test images (module docstring).

    Args:
        num_images: images shown (the first ones rank 0 evaluates).
        class_setting: whose prompts are explained: ``predicted`` or ``target``.
        num_prompts: prompts of that class per image (the first ones of the classifier's list).
        caption_key: the batch key of each image's caption (``None``: no captions); absent keys are skipped.
        methods: method names of the evaluation module to draw (default: all of them).
        reduction: token scores -> word score (``max``, ``sum``, ``mean``, ``absmax``).
        scale: colour scale of :func:`evaluation.words.text_heatmap_html` (``row``, ``example`` or a
            number).
    """

    FILE = "prompt_heatmaps.html"

    def __init__(self, num_images: int = 4, class_setting: str = "predicted", num_prompts: int = 2,
                 caption_key: Optional[str] = "caption", methods: Optional[Sequence[str]] = None,
                 reduction: str = "max", scale: Union[str, int, float] = "row") -> None:
        super().__init__()
        if num_images < 0 or num_prompts < 0:
            raise ValueError(f"num_images and num_prompts must be >= 0, got {num_images}, {num_prompts}")
        if class_setting not in ("predicted", "target"):
            raise ValueError(f"class_setting must be 'predicted' or 'target', got {class_setting!r} (of "
                             f"{CLASS_SETTINGS}, only these name one class per image)")
        check_reduction(reduction)
        self.num_images, self.class_setting, self.num_prompts = int(num_images), class_setting, int(num_prompts)
        self.caption_key, self.reduction, self.scale = caption_key, reduction, scale
        self.methods = list(methods) if methods is not None else None
        self._reset()

    def _reset(self) -> None:
        self._images: List[Tensor] = []
        self._info: List[Dict[str, Any]] = []
        self._classifier = None
        self.html: Optional[str] = None
        self.rows: Dict[str, List[WordAttribution]] = {}
        self.texts: List[Dict[str, Any]] = []
        self.class_word_top1: Dict[str, float] = {}
        self.failed: Dict[str, str] = {}

    def on_test_start(self, trainer, pl_module) -> None:
        self._reset()

    # ------------------------------------------------------------------------------------------ collect
    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        need = self.num_images - len(self._images)
        if not trainer.is_global_zero or need <= 0 or not outputs:
            return
        if "image" not in batch:
            raise KeyError(f"prompt heatmaps need batch['image'] ([B, 3, H, W] in [0, 1]); got keys {sorted(batch)}")
        self._classifier = outputs["classifier"]
        predicted = outputs["logits"].argmax(dim=-1)
        explained = outputs.get("targets", {}).get(self.class_setting)
        if explained is None:
            explained = predicted if self.class_setting == "predicted" else batch["label"]
        captions = batch.get(self.caption_key) if self.caption_key else None
        for i in range(min(need, len(batch["image"]))):
            self._images.append(batch["image"][i].detach().cpu())
            self._info.append({"index": int(batch["index"][i]) if "index" in batch else len(self._images) - 1,
                               "label": int(batch["label"][i]), "predicted": int(predicted[i]),
                               "explained": int(explained[i]),
                               "caption": str(captions[i]) if captions is not None else None})

    # ------------------------------------------------------------------------------------------ explain
    def _texts(self, model) -> List[Dict[str, Any]]:
        prompts = getattr(model, "prompts", None)
        names = getattr(model, "classnames", None) or []
        texts = []
        for position, info in enumerate(self._info):
            c = info["explained"]
            name = names[c] if c < len(names) else str(c)
            own = list(prompts[c])[: self.num_prompts] if prompts is not None else []
            texts += [{"image": position, "text": t, "kind": "prompt", "classname": name} for t in own]
            if info["caption"]:
                texts.append({"image": position, "text": info["caption"], "kind": "caption", "classname": name})
        return texts

    def explain(self, pl_module) -> None:
        """Explain the collected images' texts with the module's methods (fills ``rows``, ``texts``,
        ``class_word_top1``, ``failed``)."""
        model = pl_module.model
        tokenizer = getattr(model, "tokenizer", None)
        if getattr(model, "clip", None) is None or tokenizer is None:
            raise TypeError(f"prompt heatmaps need a CLIP zero-shot classifier that carries its tokenizer "
                            f"(models.clip.load_zero_shot_classifier), got {type(model).__name__}")
        self.texts = self._texts(model)
        if not self.texts:
            return
        device = model.class_embeddings.device
        images = torch.stack(self._images).to(device)
        scorer = PromptScorer(model.clip, self._classifier.normalize(images))
        strings = [t["text"] for t in self.texts]
        batch = tokenizer(strings, truncation=True, return_tensors="pt", return_special_tokens_mask=True,
                          **text_padding(model.clip))     # SigLIP's: max_length, read without the mask
        keys = ("input_ids", "attention_mask", "special_tokens_mask") if reads_attention_mask(model.clip) else \
            ("input_ids", "special_tokens_mask")
        inputs = {k: batch[k].to(device) for k in keys}
        targets = torch.tensor([t["image"] for t in self.texts], device=device)
        with torch.no_grad():
            logits = scorer(inputs)
        for t, row in zip(self.texts, logits[torch.arange(len(self.texts)), targets].tolist()):
            t["logit"] = row
        names = self.methods if self.methods is not None else list(pl_module.methods)
        unknown = [n for n in names if n not in pl_module.methods]
        if unknown:
            raise KeyError(f"prompt heatmaps: methods {unknown} are not evaluated (module methods: "
                           f"{sorted(pl_module.methods)})")
        sample_ids = torch.arange(len(self.texts), device=device)
        for name in names:
            try:
                with torch.enable_grad():
                    scores = pl_module.methods[name](scorer, inputs, target=targets, sample_ids=sample_ids)
            except (TypeError, ValueError, RuntimeError, KeyError) as err:
                self.failed[name] = f"{type(err).__name__}: {err}"
                rank_zero_warn(f"prompt heatmaps: method {name!r} did not run on the text tower: {err}")
                continue
            result = word_scores(scores.detach().cpu(), batch, strings, reduction=self.reduction)
            self.rows[name] = list(result.samples)
            wins = [class_word_wins(r, t["classname"]) for r, t in zip(result.samples, self.texts)]
            self.class_word_top1[name] = sum(wins) / len(wins)

    # ------------------------------------------------------------------------------------------ render
    def render(self, class_names: Optional[Sequence[str]] = None) -> str:
        """The HTML fragment: the summary, then one section per image."""
        names = list(class_names or [])

        def name(c: int) -> str:
            return names[c] if 0 <= c < len(names) else str(c)

        parts = ['<div style="font-family:Arial,Liberation Sans,DejaVu Sans,sans-serif;font-size:14px">']
        if self.class_word_top1:
            cells = "".join(f"<tr><td>{escape(m)}</td><td>{100 * v:.0f}%</td></tr>"
                            for m, v in self.class_word_top1.items())
            parts.append("<p>Share of the texts whose highest-scoring word is the explained class's name:</p>"
                         f'<table border="1" cellpadding="4" style="border-collapse:collapse">'
                         f"<tr><th>method</th><th>class word first</th></tr>{cells}</table>")
        for method, error in self.failed.items():
            parts.append(f"<p><b>{escape(method)}</b> not drawn: {escape(error)}</p>")
        parts.append("</div>")
        for position, info in enumerate(self._info):
            which = [i for i, t in enumerate(self.texts) if t["image"] == position]
            if not which or not self.rows:
                continue
            header = (f"image {info['index']}: label <b>{escape(name(info['label']))}</b>, prediction "
                      f"<b>{escape(name(info['predicted']))}</b>, prompts of the {escape(self.class_setting)} class "
                      f"<b>{escape(name(info['explained']))}</b>")
            parts.append(f'<div style="display:flex;gap:16px;align-items:flex-start;margin:12px 0">'
                         f'<img src="{image_thumbnail(self._images[position])}" width="128" height="128" '
                         f'style="image-rendering:pixelated;border:1px solid #ccc" alt="image {info["index"]}">'
                         f'<div style="flex:1"><div style="font-family:Arial,sans-serif;font-size:13px;'
                         f'margin-bottom:4px">{header}</div>')
            rows = {m: [r[i] for i in which] for m, r in self.rows.items()}
            titles = [f"{self.texts[i]['kind']} (logit {self.texts[i]['logit']:.2f})" for i in which]
            parts.append(text_heatmap_html(rows, titles=titles, scale=self.scale, legend=position == 0))
            parts.append("</div></div>")
        return "".join(parts)

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero or not self._images:
            return
        self.explain(pl_module)
        if not self.texts:
            return
        names = getattr(pl_module.model, "classnames", None) or getattr(trainer.datamodule, "classes", None)
        self.html = self.render(names)
        title = (f"Prompt words that drive the match ({self.class_setting} class; word = {self.reduction} over its "
                 "tokens)")
        publish_html_page(trainer, self.FILE, "prompt_heatmaps", page_html(self.html, title))
