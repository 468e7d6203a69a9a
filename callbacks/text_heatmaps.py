"""Text heatmaps of the first few test documents per method: HTML in the run folder and in the logger.

Only the global-rank-0 process collects (its first ``num_examples`` samples). Each sample's token scores of the
``class_setting`` (default ``target``) become word scores over the sample's words (``batch["words"]``, the text
datamodules' whitespace / ERASER words; a word's tokens are the positions whose ``word_ids`` point at it) with
the ``reduction`` of :mod:`evaluation.words` (``max``, as Chefer et al.'s Movie Reviews code;
:func:`evaluation.words.word_attribution_from_ids`). A word without a token in the input (the truncated tail) is
shown as not scored. The page is :func:`evaluation.words.text_heatmap_html` (every word HTML-escaped, one row
per method, diverging colours, each row on its own scale), written to ``<run folder>/text_heatmaps.html`` and
logged as ``text_heatmaps`` (``wandb.Html``) by a W&B logger. A prompted datamodule (its ``prompt`` template,
:mod:`datamodules.prompts`) gets the template named above the examples: the words shown are the text's; the
template's tokens are read by the model, never scored, ranked or removed.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import pytorch_lightning as pl

from evaluation.words import WordAttribution, check_reduction, page_html, text_heatmap_html, word_attribution_from_ids
from evaluation.words.heatmap import escape

from .html_page import publish_html_page


class TextHeatmaps(pl.Callback):
    """``num_examples`` text heatmaps, one row per method (module docstring).

    Args:
        num_examples: documents shown (the first ones rank 0 evaluates).
        class_setting: which explained class to show (``target`` or ``predicted``).
        reduction: token scores -> word score (``max``, ``sum``, ``mean``, ``absmax``).
        max_words: words shown per document (the head; ``None``: all).
        class_names: names of the classes for the header (default: the datamodule's ``classes``).
    """

    FILE = "text_heatmaps.html"

    def __init__(self, num_examples: int = 4, class_setting: str = "target", reduction: str = "max",
                 max_words: Optional[int] = 400, class_names: Optional[List[str]] = None) -> None:
        super().__init__()
        if num_examples < 0:
            raise ValueError(f"num_examples must be >= 0, got {num_examples}")
        check_reduction(reduction)
        if max_words is not None and max_words < 1:
            raise ValueError(f"max_words must be >= 1 or None, got {max_words}")
        self.num_examples, self.class_setting, self.reduction = int(num_examples), class_setting, reduction
        self.max_words, self.class_names = max_words, class_names
        self._rows: Dict[str, List[WordAttribution]] = {}
        self._titles: List[str] = []
        self._labels: List[int] = []
        self._predictions: List[int] = []
        self.html: Optional[str] = None

    def on_test_start(self, trainer, pl_module) -> None:
        self._rows, self._titles, self._labels, self._predictions, self.html = {}, [], [], [], None

    # a resumed run (evaluate.py --resume) keeps the examples collected before it was stopped
    def extra_progress_state(self) -> Dict[str, object]:
        rows = {m: [dict(vars(r)) for r in rs] for m, rs in self._rows.items()}
        return {"rows": rows, "titles": list(self._titles), "labels": list(self._labels),
                "predictions": list(self._predictions)}

    def load_extra_progress_state(self, state: Dict[str, object]) -> None:
        self._rows = {m: [WordAttribution(**r) for r in rs] for m, rs in state["rows"].items()}
        self._titles, self._labels = list(state["titles"]), list(state["labels"])
        self._predictions = list(state["predictions"])

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        need = self.num_examples - len(self._titles)
        if not trainer.is_global_zero or need <= 0 or not outputs:
            return
        for key in ("words", "word_ids", "word_offset"):
            if key not in batch:
                raise KeyError(f"text heatmaps need batch[{key!r}] (the text datamodules give it); got keys "
                               f"{sorted(batch)}")
        count = min(need, len(batch["words"]))
        preds = outputs["logits"].argmax(dim=-1)
        for i in range(count):
            words = list(batch["words"][i])
            if self.max_words is not None:
                words = words[: self.max_words]
            offset = int(batch["word_offset"][i])
            ids = batch["word_ids"][i].clone()
            ids[ids - offset >= len(words)] = -1  # tokens of words beyond the shown head
            for method, per_setting in outputs["relevance"].items():
                rel = per_setting.get(self.class_setting)
                if rel is None:
                    continue
                self._rows.setdefault(method, []).append(
                    word_attribution_from_ids(rel[i], ids, words, offset, self.reduction))
            ident = batch.get("annotation_id", batch.get("docid"))
            self._titles.append(str(ident[i]) if ident is not None else f"sample {int(batch['index'][i])}")
            self._labels.append(int(batch["label"][i]))
            self._predictions.append(int(preds[i]))

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero or not self._titles:
            return
        names = self.class_names or list(getattr(trainer.datamodule, "classes", None) or []) or None
        self.html = prompt_note(getattr(trainer.datamodule, "prompt", None)) + text_heatmap_html(
            self._rows, titles=self._titles, labels=self._labels, predictions=self._predictions, class_names=names)
        title = f"Token attributions ({self.class_setting} class, word = {self.reduction} over its tokens)"
        publish_html_page(trainer, self.FILE, "text_heatmaps", page_html(self.html, title))


def prompt_note(prompt) -> str:
    """An HTML paragraph naming the prompt template (a ``datamodules.prompts.PromptTemplate`` or its string) and
    its convention; ``""`` without one."""
    template = getattr(prompt, "template", prompt)
    if not isinstance(template, str):
        return ""
    shown = template.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
    return ('<p class="ta-prompt" style="font-family:Arial,Liberation Sans,DejaVu Sans,sans-serif;font-size:13px">'
            f'Prompt template: <code>{escape(shown)}</code>. The words shown fill <code>{{text}}</code>; the '
            "template's tokens are read by the model but never scored, ranked or removed.</p>")
