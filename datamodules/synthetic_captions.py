"""Synthetic shapes with generated captions: the image-text pairs a small CLIP is trained on contrastively.

The images, labels and masks are those of the synthetic shapes benchmark (:mod:`datamodules.synthetic_shapes`,
imported, unchanged: sample ``i`` of a split is the same image there and here). Each image gets one caption that
describes what its class object shows, read from the rendered sample itself:

* **shape**: the class name (``SHAPES[label]``), always present;
* **colour**: the hue of the mean colour of the object's pixels (``batch["mask"]``), named by :data:`COLOUR_HUES`
  (red, orange, yellow, green, cyan, blue, purple, pink);
* **position**: the third of the image (rows top / middle / bottom, columns left / center / right) holding the
  centroid of the object's mask, phrased "in the top left", "at the top", "on the right", "in the center";
* **distractor words**: an opener without visual content ("a photo of", "there is", ...) and a phrase about the
  background and the clutter ("on a textured background", "among thin lines", ...), words that name nothing the
  class depends on.

Caption grammar (:func:`caption_from_attributes`): ``[opener] a|an [colour] <shape> [position] [background][.]``,
the colour kept with probability ``colour_prob``, the position with ``position_prob``, the background phrase
with ``background_prob``, the opener with probability 0.6; a quarter of the positions come first instead ("in the
top left, a red circle", then without opener). The longest caption is 16 tokens (18 with start and end). The
choices are drawn from ``numpy.random.Generator(SeedSequence([caption_seed, split_id, index]))``: a caption is a
pure function of the sample (order, workers and processes do not matter), one fixed caption per image.

Tokenizer (:func:`build_caption_tokenizer`): a word-level ``tokenizers`` tokenizer over the closed vocabulary of
the grammar and of the zero-shot templates (lowercased; split at whitespace and punctuation), wrapped as a
``transformers.PreTrainedTokenizerFast`` with CLIP's special tokens and conventions: ids ``0`` ``<pad>``, ``1``
``<unk>``, ``2`` ``<|startoftext|>`` (bos), ``3`` ``<|endoftext|>`` (eos; not 2, which ``CLIPTextModel`` reads as
a legacy config and pools at the largest id), then the words in sorted order; every text is
``<|startoftext|> words <|endoftext|>``, padded on the right with ``<pad>``, truncated to ``max_length``
positions (the text tower's ``max_position_embeddings``). The vocabulary is fixed by the grammar, so the
tokenizer is the same on every machine (:data:`SPECIAL_TOKENS`, :func:`caption_vocabulary`).

Prompt set (zero-shot classifier): the class names ``SHAPES[:num_classes]`` and ``templates`` (default
:data:`DEFAULT_TEMPLATES`, phrased like the captions without colour or position); ``prompt_set`` is a
:class:`models.clip_prompts.PromptSet`. The CLIP export writes it beside the model.

Batches: the synthetic benchmark's ``{"image": [B, 3, H, W] in [0, 1] (NOT normalised), "label", "mask",
"index"}`` plus ``"caption"`` (``List[str]``) and the tokenised captions ``"input_ids"``, ``"attention_mask"``
(``LongTensor[B, N]``, padded to the longest caption of the batch).
"""
from __future__ import annotations

import colorsys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import Dataset

from models.clip_prompts import build_prompt_set

from .split_loaders import SplitDataLoaders
from .synthetic_shapes import SHAPES, SPLITS, SyntheticShapesDataModule, SyntheticShapesDataset

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<|startoftext|>", "<|endoftext|>"
#: special tokens in id order (ids 0, 1, 2, 3)
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS)

#: colour names by hue (upper bounds in [0, 1); red wraps around)
COLOUR_HUES: Tuple[Tuple[float, str], ...] = (
    (0.042, "red"), (0.125, "orange"), (0.2, "yellow"), (0.45, "green"), (0.54, "cyan"), (0.71, "blue"),
    (0.83, "purple"), (0.917, "pink"), (1.0, "red"))
COLOURS = ("red", "orange", "yellow", "green", "cyan", "blue", "purple", "pink")
ROWS = ("top", "middle", "bottom")
COLUMNS = ("left", "center", "right")
OPENERS = ("a photo of", "an image of", "a picture of", "there is", "this shows", "a rendering of")
BACKGROUNDS = ("on a textured background", "among thin lines", "with some speckles", "next to a few lines",
               "on a noisy background", "among lines and speckles")
#: zero-shot templates of the synthetic CLIP (a class name at ``{}``)
DEFAULT_TEMPLATES = ("a photo of a {}.", "an image of a {}.", "a picture of a {}.", "there is a {}.",
                     "a {} on a textured background.")


# ------------------------------------------------------------------------------------------ attributes
def colour_name(rgb: Sequence[float]) -> str:
    """The name of the hue of an RGB colour in [0, 1] (:data:`COLOUR_HUES`)."""
    hue = colorsys.rgb_to_hsv(*[float(c) for c in rgb])[0]
    return next(name for bound, name in COLOUR_HUES if hue < bound)


def position_phrase(row: str, column: str) -> str:
    """"in the top left", "at the top", "on the right", "in the center" for a (row, column) third."""
    if row not in ROWS or column not in COLUMNS:
        raise ValueError(f"row must be one of {ROWS} and column one of {COLUMNS}, got {row!r}, {column!r}")
    if row == "middle":
        return "in the center" if column == "center" else f"on the {column}"
    if column == "center":
        return f"at the {row}"
    return f"in the {row} {column}"


def describe(image: Tensor, mask: Tensor, label: int, classes: Sequence[str] = SHAPES) -> Dict[str, str]:
    """``{"shape", "colour", "row", "column"}`` of a sample's class object: its class name, the colour name of
    the mean colour of its mask's pixels, the thirds of the image holding the mask's centroid."""
    m = mask.bool()
    if not bool(m.any()):
        raise ValueError("describe: the mask is empty (no object pixels)")
    mean = image[:, m].float().mean(dim=1).tolist()
    ys, xs = m.nonzero(as_tuple=True)
    h, w = m.shape
    row = ROWS[min(int(3 * (ys.float().mean().item() + 0.5) / h), 2)]
    column = COLUMNS[min(int(3 * (xs.float().mean().item() + 0.5) / w), 2)]
    return {"shape": classes[int(label)], "colour": colour_name(mean), "row": row, "column": column}


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def caption_from_attributes(attributes: Mapping[str, str], rng: np.random.Generator, colour_prob: float = 0.7,
                            position_prob: float = 0.6, background_prob: float = 0.5) -> str:
    """One caption of the grammar in the module docstring, the optional parts drawn from ``rng``."""
    shape = attributes["shape"]
    colour = attributes["colour"] if rng.random() < colour_prob else None
    position = position_phrase(attributes["row"], attributes["column"]) if rng.random() < position_prob else None
    background = BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))] if rng.random() < background_prob else None
    opener = OPENERS[int(rng.integers(len(OPENERS)))] if rng.random() < 0.6 else None
    noun = f"{colour} {shape}" if colour else shape
    phrase = f"{_article(noun)} {noun}"
    if position and rng.random() < 0.25:
        words = [position + ",", phrase]   # no opener before a leading position
    else:
        words = ([opener] if opener else []) + [phrase] + ([position] if position else [])
    if background:
        words.append(background)
    return " ".join(words) + ("." if rng.random() < 0.5 else "")


# ------------------------------------------------------------------------------------------ tokenizer
def caption_vocabulary(templates: Sequence[str] = DEFAULT_TEMPLATES) -> List[str]:
    """The words (sorted) of every caption the grammar can produce and of ``templates`` filled with every shape
    name, as the tokenizer's pre-tokenizer splits them (lowercased)."""
    from tokenizers.pre_tokenizers import Whitespace

    phrases = [*SHAPES, *COLOURS, "a", "an", ",", ".", *OPENERS, *BACKGROUNDS,
               *[position_phrase(r, c) for r in ROWS for c in COLUMNS]]
    phrases += [t.format(shape) if "{}" in t else t for t in templates for shape in SHAPES]
    split = Whitespace()
    words = {piece for phrase in phrases for piece, _ in split.pre_tokenize_str(phrase.lower())}
    return sorted(words - set(SPECIAL_TOKENS))


def build_caption_tokenizer(max_length: int = 24, templates: Sequence[str] = DEFAULT_TEMPLATES):
    """The word-level caption tokenizer (module docstring) as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if max_length < 3:
        raise ValueError(f"max_length must be >= 3 (start, one word, end), got {max_length}")
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *caption_vocabulary(templates)])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", special_tokens=[(BOS, vocab[BOS]), (EOS, vocab[EOS])])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   unk_token=UNK, model_max_length=max_length, padding_side="right")


# ------------------------------------------------------------------------------------------ data
class SyntheticCaptionsDataset(Dataset):
    """A :class:`SyntheticShapesDataset` whose items also carry ``"caption"`` (module docstring)."""

    def __init__(self, shapes: SyntheticShapesDataset, caption_seed: int = 0, colour_prob: float = 0.7,
                 position_prob: float = 0.6, background_prob: float = 0.5) -> None:
        if shapes.two_objects:
            raise ValueError("captions describe one class object: use a one-object split (two_objects=False)")
        for name, p in (("colour_prob", colour_prob), ("position_prob", position_prob),
                        ("background_prob", background_prob)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {p}")
        self.shapes = shapes
        self.caption_seed = int(caption_seed)
        self.probs = dict(colour_prob=colour_prob, position_prob=position_prob, background_prob=background_prob)

    def __len__(self) -> int:
        return len(self.shapes)

    def caption(self, item: Mapping[str, Tensor]) -> str:
        index = int(item["index"])
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
            [self.caption_seed, SPLITS[self.shapes.split], index])))
        attributes = describe(item["image"], item["mask"], int(item["label"]), self.shapes.classes)
        return caption_from_attributes(attributes, rng, **self.probs)

    def __getitem__(self, index: int) -> Dict[str, Any]:
        item = self.shapes[index]
        item["caption"] = self.caption(item)
        return item


class CaptionCollate:
    """Stacks the tensors of the items and tokenises their captions (padded to the batch's longest)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, items: List[Dict[str, Any]]) -> Dict[str, Any]:
        batch: Dict[str, Any] = {key: torch.stack([item[key] for item in items]) for key in items[0]
                                 if isinstance(items[0][key], Tensor)}
        batch["caption"] = [item["caption"] for item in items]
        tokens = self.tokenizer(batch["caption"], padding=True, truncation=True, return_tensors="pt")
        batch["input_ids"] = tokens["input_ids"]
        batch["attention_mask"] = tokens["attention_mask"]
        return batch


class SyntheticCaptionsDataModule(SplitDataLoaders, pl.LightningDataModule):
    """Train/val/test splits of the synthetic shapes benchmark with captions, the caption tokenizer and the
    zero-shot prompt set (module docstring).

    Geometry arguments (``image_size``, ``num_classes``, sizes, ``seed``, ``object_scale``, ``num_distractors``,
    ``noise_std``, ``cache_train``) are :class:`datamodules.synthetic_shapes.SyntheticShapesDataModule`'s;
    ``caption_seed`` and the ``*_prob`` arguments choose the captions; ``templates`` the zero-shot prompts;
    ``max_length`` the positions of a tokenised text (with its start and end tokens).

    Attributes: ``classes`` (the shape names), ``tokenizer``, ``templates``, ``prompt_set``, ``max_length``.
    """

    def __init__(self, image_size: int = 64, num_classes: int = 4, train_size: int = 4096, val_size: int = 512,
                 test_size: int = 512, seed: int = 0, batch_size: int = 128, num_workers: int = 0,
                 object_scale: Tuple[float, float] = (0.16, 0.24), num_distractors: Tuple[int, int] = (2, 5),
                 noise_std: float = 0.04, cache_train: bool = False, caption_seed: int = 0,
                 colour_prob: float = 0.7, position_prob: float = 0.6, background_prob: float = 0.5,
                 templates: Optional[Sequence[str]] = None, max_length: int = 24) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.shapes = SyntheticShapesDataModule(
            image_size=image_size, num_classes=num_classes, train_size=train_size, val_size=val_size,
            test_size=test_size, seed=seed, batch_size=batch_size, num_workers=num_workers,
            object_scale=tuple(object_scale), num_distractors=tuple(num_distractors), noise_std=noise_std,
            cache_train=cache_train)
        self.image_size, self.num_classes = image_size, num_classes
        self.classes = self.shapes.classes
        self.batch_size, self.num_workers = batch_size, num_workers
        self.templates = list(templates) if templates is not None else list(DEFAULT_TEMPLATES)
        if not self.templates or any("{}" not in t for t in self.templates):
            raise ValueError(f"templates must be a non-empty list of strings with '{{}}' where the class name "
                             f"goes, got {self.templates}")
        self.max_length = int(max_length)
        self.tokenizer = build_caption_tokenizer(self.max_length, self.templates)
        self._caption_options = dict(caption_seed=caption_seed, colour_prob=colour_prob, position_prob=position_prob,
                                     background_prob=background_prob)
        self.datasets: Dict[str, SyntheticCaptionsDataset] = {}

    @property
    def prompt_set(self):
        """The zero-shot prompt set: ``classes`` x ``templates`` (:class:`models.clip_prompts.PromptSet`)."""
        return build_prompt_set("custom", classnames=list(self.classes), templates=self.templates)

    def dataset(self, split: str) -> SyntheticCaptionsDataset:
        if split not in self.datasets:
            self.datasets[split] = SyntheticCaptionsDataset(self.shapes.dataset(split), **self._caption_options)
        return self.datasets[split]

    def collate_fn(self) -> CaptionCollate:
        return CaptionCollate(self.tokenizer)
