"""CLIP as classifiers: every attribution method explains a stock ``transformers.CLIPModel`` (or a
``transformers.SiglipModel``) through these.

A ``CLIPModel`` scores image-text pairs (``logit_scale.exp() * cosine`` of the projected embeddings); a
``SiglipModel`` scores them with sigmoid logits ``logit_scale.exp() * cosine + logit_bias`` of its pooled
embeddings (the vision tower's attention-pooling head, the text tower's ``head`` on the last position; no separate
projections). Wrapped, one tower becomes a classifier whose classes are fixed embeddings of the other modality,
and ``target=`` names a class, a prompt or an image:

* :class:`ZeroShotClassifier`: ``pixel_values`` ``[B, 3, S, S]`` -> logits ``[B, C]`` against ``C`` class
  embeddings (built from prompts with :meth:`ZeroShotClassifier.from_prompts`, OpenAI's recipe). The methods
  explain the **vision tower**: ``build_method(name)(clf, pixel_values, target=labels)`` -> ``[B, P]`` patch
  scores.
* :class:`PromptScorer`: a tokenised text batch ``[T, N]`` -> logits ``[T, I]`` against ``I`` images fixed at
  construction. The methods explain the **text tower**: ``build_method(name)(scorer, text_batch,
  target=image_index)`` -> ``[T, N]`` token scores read at each text's EOS row, exactly 0 at padding.

Chefer et al. 2021b's pair explanation (one image, several texts, each text its own pair ``logits_per_image[i, i]``)
is ``ZeroShotClassifier(clip, text_embeddings)`` on the image repeated once per text with ``target=arange(T)``
(image side) and ``PromptScorer(clip, image)`` with ``target=0`` (text side).

Both wrappers follow the protocol of :mod:`methods.families.hf_clip` (``clip``, ``clip_tower``,
``logits_from_embeddings``; :mod:`methods.families.hf_siglip` for a ``SiglipModel``); their fixed embeddings are
buffers (L2-normalised), ``logit_scale`` (and SigLIP's ``logit_bias``) are read from the model at every call.

SigLIP's texts (:func:`text_embeddings`, :meth:`ZeroShotClassifier.from_prompts`): the text tower pools the
**last position** whatever it holds (``SiglipTextModel``: ``last_hidden_state[:, -1]``), so a text's embedding
depends on its padded length; SigLIP was trained on texts padded to ``max_length`` (64 for the released models)
with the pad token and no attention mask (every position attends to every other, padding included), which is
what ``text_embeddings`` feeds it: ``tokenizer(texts, padding="max_length", max_length=<the text tower's
max_position_embeddings>, truncation=True)``, the ``input_ids`` only. (transformers' zero-shot pipeline pads the
same way but passes the tokenizer's ``attention_mask`` when it returns one, as ``SiglipTokenizer`` of
transformers 5 does; the model then masks the padded keys, which it was not trained with.)

Both wrappers take an open_clip ``CLIP`` too (``open_clip.model.CLIP``; :mod:`models.openclip`: ``encode_image`` /
``encode_text``, open_clip's tokenizers, ``+ logit_bias`` where the model has one; adapters
:mod:`methods.families.open_clip`); ``open_clip:<name>`` specs load one (:func:`load_open_clip_classifier`).

Loading by spec (:func:`load_zero_shot_classifier`; the ``clip:`` source of :func:`models.sources.load_model`):
``"clip:<source>"`` is the zero-shot classifier of a CLIP in Hugging Face ``save_pretrained`` layout, read from
local files only (never downloaded). ``<source>``: a folder (``config.json`` + weights, the tokenizer files and,
optionally, ``preprocessor_config.json`` and this package's prompt file ``prompts.json``), a hub name already in
the local Hugging Face cache (``openai/clip-vit-base-patch32``; an ``hf:`` prefix is allowed), or a
``trained:<config.yaml>`` spec (:mod:`training.cached_training`: the small CLIP of the synthetic benchmark,
``trained:configs/train/synthetic_clip.yaml``, trained on first use and cached). The classifier's prompts, its
``pretrained_cfg`` (so that an evaluation normalises and sizes images as CLIP does) and ``tokenizer`` (for the
text side: :class:`PromptScorer`): :func:`load_zero_shot_classifier`.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from models import openclip
from models.clip_prompts import Template, custom_prompt_set, zero_shot_prompt_set
from models.sources import find_source, looks_like_path, register_hf_architecture, register_source, resolve_hf_source

CLIP_PREFIX = "clip:"
#: the model_kwargs of a ``clip:`` spec
CLIP_KWARGS = ("prompts", "classnames", "templates", "prompt_batch_size")
#: OpenAI's CLIP normalisation (``CLIPImageProcessor``'s image_mean / image_std; the data's:
#: ``datamodules.clip_zero_shot.CLIP_MEAN`` / ``CLIP_STD``)
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
#: PIL resampling codes of a Hugging Face image processor -> timm interpolation names
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


#: SigLIP's image normalisation (``SiglipImageProcessor``'s image_mean / image_std)
SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)


def is_siglip(clip: nn.Module) -> bool:
    """Whether ``clip`` is a ``transformers.SiglipModel`` (sigmoid logits, pooled embeddings, no projections)."""
    import transformers

    return isinstance(clip, transformers.SiglipModel)


def _check_clip(clip) -> nn.Module:
    if openclip.is_open_clip(clip):
        return clip
    import transformers

    if not isinstance(clip, (transformers.CLIPModel, transformers.SiglipModel)):
        raise TypeError(f"clip must be a transformers.CLIPModel or SiglipModel or an open_clip.model.CLIP, got "
                        f"{type(clip).__name__}")
    if is_siglip(clip):
        image_dim = int(clip.config.vision_config.hidden_size)
        text_dim = int(clip.config.text_config.projection_size)
        if image_dim != text_dim:
            raise ValueError(f"this SiglipModel's image embeddings have {image_dim} entries (vision hidden_size) but "
                             f"its text embeddings {text_dim} (text projection_size): they cannot be compared")
    return clip


def embedding_dim(clip: nn.Module) -> int:
    """The width of the joint embedding space: CLIP's ``projection_dim``; SigLIP's vision ``hidden_size`` (the
    attention-pooling head's output; the text ``head`` projects to the same ``projection_size``); open_clip's
    :func:`models.openclip.embedding_dim`."""
    if openclip.is_open_clip(clip):
        return openclip.embedding_dim(clip)
    if is_siglip(clip):
        return int(clip.config.vision_config.hidden_size)
    return int(clip.config.projection_dim)


def image_features(clip: nn.Module, pixel_values: Tensor) -> Tensor:
    """Unnormalised image embeddings ``[B, D]`` (``get_image_features``): CLIP's ``visual_projection`` of the
    pooled [CLS]; SigLIP's ``pooler_output`` (the attention-pooling head's output); open_clip's ``encode_image``."""
    if openclip.is_open_clip(clip):
        return openclip.image_features(clip, pixel_values)
    pooled = clip.vision_model(pixel_values=pixel_values).pooler_output
    return pooled if is_siglip(clip) else clip.visual_projection(pooled)


def text_features(clip: nn.Module, input_ids: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
    """Unnormalised text embeddings ``[T, D]`` (``get_text_features``): CLIP's ``text_projection`` of the EOS
    token; SigLIP's ``pooler_output`` (its ``head`` on the last position); open_clip's ``encode_text``, which takes
    no attention mask (its tokenizer pads with 0 to the context length; the causal mask keeps the padding from the
    EOS): one is refused."""
    if openclip.is_open_clip(clip):
        if attention_mask is not None:
            raise ValueError("open_clip's CLIP text tower takes no attention_mask: pass the input_ids alone")
        return openclip.text_features(clip, input_ids)
    pooled = clip.text_model(input_ids=input_ids, attention_mask=attention_mask).pooler_output
    return pooled if is_siglip(clip) else clip.text_projection(pooled)


class _EvalNoGrad:
    """``torch.no_grad()`` with the module in eval mode, its train/eval flags restored on exit."""

    def __init__(self, module: nn.Module):
        self.module = module

    def __enter__(self):
        self.flags = {name: m.training for name, m in self.module.named_modules()}
        self.no_grad = torch.no_grad()
        self.no_grad.__enter__()
        self.module.eval()

    def __exit__(self, *exc):
        for name, m in self.module.named_modules():
            m.training = self.flags[name]
        self.no_grad.__exit__(*exc)


def _fixed_embeddings(clip: nn.Module, embeddings: Any, what: str) -> Tensor:
    """``embeddings`` ``[C, projection_dim]`` (C >= 1, floating point), L2-normalised; else a ``ValueError``."""
    embeddings = torch.as_tensor(embeddings).detach()
    dim = embedding_dim(clip)
    if embeddings.dim() != 2 or embeddings.shape[1] != dim or embeddings.shape[0] == 0:
        raise ValueError(f"{what} must be [{what[0].upper()}, {dim}] ({what[0].upper()} >= 1, the model's "
                         f"embedding width), got {tuple(embeddings.shape)}")
    if not embeddings.dtype.is_floating_point:
        raise ValueError(f"{what} must be floating point, got dtype {embeddings.dtype}")
    return F.normalize(embeddings, dim=-1)


def _scaled_cosine(clip: nn.Module, embeddings: Tensor, others: Tensor) -> Tensor:
    """``logit_scale.exp() * cos(embeddings, others)``: ``[B, D] x [C, D] -> [B, C]``, CLIP's own logits
    (``others`` already normalised); SigLIP's and an open_clip model's ``+ logit_bias`` where they have one."""
    normed = embeddings / embeddings.norm(p=2, dim=-1, keepdim=True)
    logits = clip.logit_scale.exp().to(normed) * (normed @ others.to(normed).t())
    if is_siglip(clip):
        return logits + clip.logit_bias.to(normed)
    bias = openclip.logit_bias(clip) if openclip.is_open_clip(clip) else None
    return logits if bias is None else logits + bias.to(logits)


def text_padding(clip: nn.Module) -> dict:
    """The padding keyword arguments of a tokenizer call for ``clip``'s texts: CLIP's ``padding=True`` (the
    longest text); SigLIP's ``padding="max_length"`` to the text tower's ``max_position_embeddings`` (it reads the
    last position, and reads it without an attention mask: :func:`reads_attention_mask`)."""
    if is_siglip(clip):
        return {"padding": "max_length", "max_length": int(clip.config.text_config.max_position_embeddings)}
    return {"padding": True}


def reads_attention_mask(clip: nn.Module) -> bool:
    """Whether ``clip``'s texts are read with the tokenizer's ``attention_mask`` (CLIP) or without (SigLIP)."""
    return not is_siglip(clip)


def tokenize_texts(clip: nn.Module, tokenizer: Callable, texts: Sequence[str]) -> dict:
    """``texts`` as the model reads them: CLIP's ``tokenizer(texts, padding=True, truncation=True)``
    (``input_ids`` and ``attention_mask``); SigLIP's padded to the text tower's ``max_position_embeddings``
    (``padding="max_length"``), ``input_ids`` only (the module docstring)."""
    if is_siglip(clip):
        padding = text_padding(clip)
        length = padding["max_length"]
        batch = tokenizer(list(texts), truncation=True, return_tensors="pt", **padding)
        if batch["input_ids"].shape[-1] != length:
            raise ValueError(f"the tokenizer gave texts of {batch['input_ids'].shape[-1]} tokens for "
                             f"padding='max_length', max_length={length}: SigLIP reads the last of {length}")
        return {"input_ids": batch["input_ids"]}
    batch = tokenizer(list(texts), padding=True, truncation=True, return_tensors="pt")
    return {"input_ids": batch["input_ids"], "attention_mask": batch.get("attention_mask")}


def text_embeddings(clip: nn.Module, tokenizer: Callable, texts: Sequence[str], batch_size: int = 256) -> Tensor:
    """The unnormalised text embeddings ``[T, D]`` of ``texts`` (no gradient, eval mode): :func:`tokenize_texts`
    then :func:`text_features`; an open_clip model: ``tokenizer(texts)`` (open_clip's tokenizers,
    :func:`models.openclip.token_ids`) then ``encode_text``."""
    clip = _check_clip(clip)
    device = clip.logit_scale.device
    out = []
    with _EvalNoGrad(clip):
        for start in range(0, len(texts), batch_size):
            if openclip.is_open_clip(clip):
                ids = openclip.token_ids(clip, tokenizer, texts[start:start + batch_size])
                out.append(openclip.text_features(clip, ids.to(device)))
                continue
            batch = tokenize_texts(clip, tokenizer, texts[start:start + batch_size])
            mask = batch.get("attention_mask")
            out.append(text_features(clip, batch["input_ids"].to(device),
                                     None if mask is None else mask.to(device)))
    return torch.cat(out)


class ZeroShotClassifier(nn.Module):
    """CLIP's (or SigLIP's) vision tower as a classifier over fixed class embeddings.

    ``forward(pixel_values)`` -> ``logit_scale.exp() * cos(image_embedding, class_embedding_c)`` ``[B, C]``
    (CLIP's ``logits_per_image`` against the classes; SigLIP's add ``logit_bias``: its sigmoid logits).
    ``class_embeddings`` ``[C, D]`` (``D`` = the model's ``projection_dim``; SigLIP's vision ``hidden_size``) are
    stored L2-normalised (buffer ``class_embeddings``); ``classnames`` (optional) is kept
    for reports. The attribution methods explain the vision tower through it (adapter
    ``methods.families.hf_clip.HFCLIPVisionAdapter``).

    ``pretrained_cfg``: the data config timm's ``resolve_data_config(model=...)`` reads
    (:func:`clip_pretrained_cfg`; OpenAI's mean/std unless a loader sets the model's own, as
    :func:`load_zero_shot_classifier` does from the image processor).
    """

    clip_tower = "vision"

    def __init__(self, clip: nn.Module, class_embeddings: Tensor, classnames: Optional[Sequence[str]] = None):
        super().__init__()
        self.clip = _check_clip(clip)
        embeddings = _fixed_embeddings(clip, class_embeddings, "class_embeddings")
        if classnames is not None and len(classnames) != embeddings.shape[0]:
            raise ValueError(f"{len(classnames)} classnames for {embeddings.shape[0]} class embeddings")
        self.register_buffer("class_embeddings", embeddings)
        self.classnames = list(classnames) if classnames is not None else None
        self.pretrained_cfg = (openclip.open_clip_pretrained_cfg(clip, embeddings.shape[0])
                               if openclip.is_open_clip(clip) else clip_pretrained_cfg(clip,
                                                                                       num_classes=embeddings.shape[0]))

    @property
    def num_classes(self) -> int:
        return int(self.class_embeddings.shape[0])

    @classmethod
    def from_prompts(cls, clip: nn.Module, tokenizer: Callable,
                     classnames: Union[Sequence[str], Mapping[str, Sequence[str]]],
                     templates: Union[None, Template, Sequence[Template]] = None,
                     batch_size: int = 256) -> "ZeroShotClassifier":
        """The zero-shot classifier of OpenAI's prompt-engineering recipe (Radford et al. 2021, the ImageNet
        notebook; LAION's CLIP_benchmark): every prompt of a class is embedded and L2-normalised, the class
        embedding is their mean, normalised again.

        * ``classnames`` a list, ``templates`` a list of templates (``"a photo of a {}."``, ``"{c}"`` or a callable
          ``classname -> prompt``, as ``open_clip``'s zero-shot metadata ships them): one prompt per (class,
          template);
        * ``templates`` one template: one prompt per class (BI's CLIP test: ``"a photo of a {}"``);
        * ``classnames`` a dict ``{classname: [prompt, ...]}`` (``templates`` None): the given prompts per class.

        ``tokenizer``: called as a Hugging Face tokenizer, ``tokenizer(texts, padding=True, truncation=True,
        return_tensors="pt")`` -> ``{"input_ids", "attention_mask"}`` (SigLIP: ``padding="max_length"``,
        ``input_ids`` only: :func:`tokenize_texts`).
        """
        if isinstance(classnames, str):
            raise ValueError("classnames must be a list of class names (or a dict of prompts), got a string")
        prompt_set = custom_prompt_set(classnames, templates)
        return cls.from_prompt_lists(clip, tokenizer, prompt_set.classnames, prompt_set.prompts, batch_size)

    @classmethod
    def from_prompt_lists(cls, clip: nn.Module, tokenizer: Callable, classnames: Sequence[str],
                          prompts: Sequence[Sequence[str]], batch_size: int = 256) -> "ZeroShotClassifier":
        """:meth:`from_prompts` with the prompts of class ``c`` given as the list ``prompts[c]``, the classes in
        the order of ``classnames`` (which may repeat a name: OpenAI's ImageNet names hold "missile" and
        "sunglasses" twice, torchvision's tuples "('crane',)", so a dict keyed by name would lose classes)."""
        names = list(classnames)
        prompts = [[p] if isinstance(p, str) else list(p) for p in prompts]
        if not names:
            raise ValueError("classnames is empty")
        if len(prompts) != len(names):
            raise ValueError(f"{len(names)} class names but prompts for {len(prompts)} classes")
        empty = [name for name, p in zip(names, prompts) if not p]
        if empty:
            raise ValueError(f"no prompts for classes {empty}")
        flat = [p for per_class in prompts for p in per_class]
        embedded = F.normalize(text_embeddings(clip, tokenizer, flat, batch_size), dim=-1)
        rows, start = [], 0
        for per_class in prompts:
            rows.append(embedded[start:start + len(per_class)].mean(dim=0))
            start += len(per_class)
        classifier = cls(clip, torch.stack(rows), classnames=names)
        classifier.prompts = prompts
        return classifier

    def image_embeddings(self, pixel_values: Tensor) -> Tensor:
        """Projected, unnormalised image embeddings ``[B, D]`` (``get_image_features``: :func:`image_features`)."""
        return image_features(self.clip, pixel_values)

    def logits_from_embeddings(self, embeddings: Tensor) -> Tensor:
        """``[B, D]`` projected image embeddings -> logits ``[B, C]``."""
        return _scaled_cosine(self.clip, embeddings, self.class_embeddings)

    def forward(self, pixel_values) -> Tensor:
        if isinstance(pixel_values, Mapping):
            pixel_values = pixel_values["pixel_values"]
        return self.logits_from_embeddings(self.image_embeddings(pixel_values))

    def extra_repr(self) -> str:
        return f"classes={self.num_classes}"


class PromptScorer(nn.Module):
    """CLIP's (or SigLIP's) text tower as a classifier over fixed images: a text batch ``[T, N]`` -> logits
    ``[T, I]`` (CLIP's ``logits_per_text`` against the images; SigLIP's with ``logit_bias``), so
    ``target=image_index`` explains each text against one image (per text: a ``LongTensor[T]``).

    ``pixel_values`` ``[I, 3, S, S]`` (normalised) are embedded once at construction (no gradient, eval mode) and
    stored L2-normalised (buffer ``image_embeddings``); or pass ``image_embeddings`` ``[I, D]`` directly. The
    attribution methods explain the text tower through it (adapter ``methods.families.hf_clip.HFCLIPTextAdapter``).
    """

    clip_tower = "text"

    def __init__(self, clip: nn.Module, pixel_values: Optional[Tensor] = None,
                 image_embeddings: Optional[Tensor] = None):
        super().__init__()
        self.clip = _check_clip(clip)
        if (pixel_values is None) == (image_embeddings is None):
            raise ValueError("PromptScorer needs pixel_values [I, 3, S, S] or image_embeddings [I, D] (one of them)")
        if pixel_values is not None:
            if isinstance(pixel_values, Mapping):
                pixel_values = pixel_values["pixel_values"]
            if not isinstance(pixel_values, Tensor) or pixel_values.dim() != 4:
                shape = tuple(pixel_values.shape) if isinstance(pixel_values, Tensor) else type(pixel_values).__name__
                raise ValueError(f"pixel_values must be a normalised image batch [I, 3, S, S], got {shape}")
            with _EvalNoGrad(clip):
                image_embeddings = image_features(clip, pixel_values)
        self.register_buffer("image_embeddings", _fixed_embeddings(clip, image_embeddings, "image_embeddings"))

    @property
    def num_images(self) -> int:
        return int(self.image_embeddings.shape[0])

    def text_embeddings(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        """Projected, unnormalised text embeddings ``[T, D]`` (``get_text_features``: the EOS token; SigLIP's
        last position: :func:`text_features`)."""
        return text_features(self.clip, input_ids, attention_mask)

    def logits_from_embeddings(self, embeddings: Tensor) -> Tensor:
        """``[T, D]`` projected text embeddings -> logits ``[T, I]``."""
        return _scaled_cosine(self.clip, embeddings, self.image_embeddings)

    def get_input_embeddings(self) -> nn.Module:
        """The text tower's word-embedding layer (before positions are added): what a zeroed-embedding removal
        hooks (``evaluation.embedding_removal``)."""
        if openclip.is_open_clip(self.clip):
            return self.clip.token_embedding
        return self.clip.text_model.embeddings.token_embedding

    def forward(self, input_ids, attention_mask: Optional[Tensor] = None, **unused) -> Tensor:
        """``input_ids`` ``[T, N]`` (or a tokenizer's mapping) -> logits ``[T, I]``; other tokenizer outputs
        (``special_tokens_mask``, ...) are ignored."""
        if isinstance(input_ids, Mapping):
            attention_mask = input_ids.get("attention_mask", attention_mask)
            input_ids = input_ids["input_ids"]
        return self.logits_from_embeddings(self.text_embeddings(input_ids, attention_mask))

    def extra_repr(self) -> str:
        return f"images={self.num_images}"


# ------------------------------------------------------------------------------------------ data config
def clip_pretrained_cfg(clip: nn.Module, mean: Optional[Sequence[float]] = None,
                        std: Optional[Sequence[float]] = None, interpolation: str = "bicubic",
                        crop_pct: float = 1.0, num_classes: Optional[int] = None,
                        crop_mode: Optional[str] = None) -> dict:
    """The keys of a timm ``pretrained_cfg`` that ``timm.data.resolve_data_config`` reads, for CLIP's vision
    tower: ``input_size`` ``(3, S, S)`` with ``S`` the vision config's ``image_size``, ``interpolation``
    (CLIP's: bicubic), ``crop_pct`` and ``crop_mode`` (default ``"center"``: CLIP resizes the shorter side to
    ``S`` and centre-crops ``S``, ``crop_pct = 1``; SigLIP's ``"squash"``: it resizes the whole image to ``S x
    S``), ``mean`` / ``std`` (default OpenAI's; SigLIP's 0.5 / 0.5)."""
    size = int(clip.config.vision_config.image_size)
    siglip = is_siglip(clip)
    mean = (SIGLIP_MEAN if siglip else OPENAI_CLIP_MEAN) if mean is None else mean
    std = (SIGLIP_STD if siglip else OPENAI_CLIP_STD) if std is None else std
    mean, std = tuple(float(v) for v in mean), tuple(float(v) for v in std)
    if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise ValueError(f"mean and std must have 3 entries (std > 0), got mean={mean} std={std}")
    cfg = {"input_size": (3, size, size), "interpolation": interpolation, "crop_pct": float(crop_pct),
           "crop_mode": crop_mode or ("squash" if siglip else "center"), "mean": mean, "std": std}
    if num_classes is not None:
        cfg["num_classes"] = int(num_classes)
    return cfg


def image_processor_config(source: str) -> Optional[dict]:
    """The ``preprocessor_config.json`` of a CLIP folder, or of a hub name in the local Hugging Face cache
    (``None`` when there is none)."""
    path: Optional[str] = None
    if os.path.isdir(source):
        candidate = os.path.join(source, "preprocessor_config.json")
        path = candidate if os.path.isfile(candidate) else None
    else:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(source, "preprocessor_config.json")
        path = found if isinstance(found, str) else None
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as err:   # bad bytes or bad JSON
        raise ValueError(f"image processor config {str(path)!r} is not UTF-8 JSON: {err}") from err


def pretrained_cfg_from_processor(clip: nn.Module, processor: Optional[Mapping], num_classes: int) -> dict:
    """:func:`clip_pretrained_cfg` with the image processor's ``image_mean`` / ``image_std``, ``resample`` and
    crop (``crop_pct`` = crop size / resize size; a resize to ``{"height", "width"}`` without a centre crop, as
    ``SiglipImageProcessor``'s: ``crop_mode="squash"``); the model family's values where it says nothing."""
    processor = dict(processor or {})
    mean = processor.get("image_mean") or None
    std = processor.get("image_std") or None
    interpolation = _RESAMPLE.get(processor.get("resample", 3), "bicubic")
    crop_pct, crop_mode = 1.0, None
    size, crop = processor.get("size"), processor.get("crop_size")
    resize = size.get("shortest_edge") if isinstance(size, Mapping) else size
    crop = crop.get("height") if isinstance(crop, Mapping) else crop
    if processor.get("do_center_crop", True) and resize and crop:
        crop_pct = float(crop) / float(resize)
    if isinstance(size, Mapping) and "height" in size and not processor.get("do_center_crop", False):
        crop_mode = "squash"
    return clip_pretrained_cfg(clip, mean, std, interpolation, crop_pct, num_classes, crop_mode)


# ------------------------------------------------------------------------------------------ clip: specs
def is_clip_spec(spec: Any) -> bool:
    """Whether ``spec`` is a ``clip:<source>`` model spec."""
    return isinstance(spec, str) and spec.startswith(CLIP_PREFIX)


def clip_source(spec: str) -> str:
    """What ``from_pretrained`` reads for ``clip:<source>``: the local export of a registered source of files
    (:func:`models.sources.find_source`; ``trained:<config.yaml>``: its cached folder, trained on first use),
    else :func:`models.sources.resolve_hf_source` of the source (``hf:`` dropped, ``~`` expanded). A source
    that can only be a path (:func:`models.sources.looks_like_path`) must be a folder."""
    if not is_clip_spec(spec) or not spec[len(CLIP_PREFIX):]:
        raise ValueError(f"{spec!r} is not 'clip:<folder, cached hub name or trained:<config.yaml>>'")
    body = spec[len(CLIP_PREFIX):]
    registered = find_source(body)
    if registered is not None and registered.local is not None:
        return str(registered.local(body))
    source = resolve_hf_source(body)
    if looks_like_path(body[len("hf:"):] if body.startswith("hf:") else body) and not os.path.isdir(source):
        raise FileNotFoundError(f"CLIP folder {source!r} (from {spec!r}) does not exist (expected a save_pretrained "
                                "folder: config.json, weights and tokenizer files)")
    return source


def load_clip(source: str, pretrained: bool = True):
    """``(CLIPModel or SiglipModel, tokenizer)`` of a folder or a hub name in the local Hugging Face cache, local
    files only (the class follows the config: ``CLIPConfig`` or ``SiglipConfig``); ``pretrained=False``: the same
    architecture with random weights. The model is in eval mode."""
    from transformers import AutoConfig, AutoTokenizer, CLIPConfig, CLIPModel, SiglipConfig, SiglipModel

    try:
        config = AutoConfig.from_pretrained(source, local_files_only=True, trust_remote_code=False)
        model_class = {CLIPConfig: CLIPModel, SiglipConfig: SiglipModel}.get(type(config))
        if model_class is None:
            raise ValueError(f"its config is a {type(config).__name__}, not a CLIPConfig or SiglipConfig")
        clip = model_class.from_pretrained(source, local_files_only=True) if pretrained else model_class(config)
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot load a transformers CLIPModel or SiglipModel from {source!r} with local files "
                         "only (a save_pretrained folder with config.json and weights, or a hub name already in the "
                         f"local Hugging Face cache; nothing is downloaded): {err}") from err
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot load the tokenizer of the CLIP {source!r} from local files (tokenizer.json or "
                         f"vocab.json + merges.txt beside the model): {err}") from err
    return clip.eval(), tokenizer


def load_zero_shot_classifier(spec: str, pretrained: bool = True,
                              model_kwargs: Optional[Mapping[str, Any]] = None) -> ZeroShotClassifier:
    """The :class:`ZeroShotClassifier` of ``clip:<source>`` (module docstring), in eval mode.

    ``model_kwargs``: ``prompts`` (``saved``, the default when the folder has ``prompts.json``; ``openai``,
    ``simple``, ``bi_legacy``, ``custom``), ``classnames``, ``templates``
    (:func:`models.clip_prompts.zero_shot_prompt_set`), ``prompt_batch_size`` (prompts per text forward, default
    256). ``pretrained=False``: random weights of the same architecture (tests). The classifier also carries
    ``tokenizer``, ``source`` (the folder or name read), ``prompt_set`` and ``prompts`` (the prompts of each
    class), and ``pretrained_cfg`` with the image processor's mean/std and crop (:func:`pretrained_cfg_from_processor`:
    the keys timm's ``resolve_data_config`` reads).
    """
    kwargs = dict(model_kwargs or {})
    unknown = sorted(set(kwargs) - set(CLIP_KWARGS))
    if unknown:
        raise ValueError(f"unknown model_kwargs {unknown} for {spec!r}; a clip: spec takes {list(CLIP_KWARGS)}")
    source = clip_source(spec)
    prompt_set = zero_shot_prompt_set(source, kwargs.get("prompts"), kwargs.get("classnames"),
                                      kwargs.get("templates"))
    clip, tokenizer = load_clip(source, pretrained)
    batch_size = int(kwargs.get("prompt_batch_size") or 256)
    classifier = ZeroShotClassifier.from_prompt_lists(clip, tokenizer, prompt_set.classnames, prompt_set.prompts,
                                                      batch_size)
    classifier.pretrained_cfg = pretrained_cfg_from_processor(clip, image_processor_config(source),
                                                              classifier.num_classes)
    classifier.tokenizer = tokenizer
    classifier.source = source
    classifier.prompt_set = prompt_set
    return classifier.eval()


register_source(CLIP_PREFIX, lambda spec, pretrained, model_kwargs, allow_pickle, trust_remote_code:
                load_zero_shot_classifier(spec, pretrained, model_kwargs), tokenizer=clip_source)


# ------------------------------------------------------------------------------------------ open_clip: specs
def load_open_clip_classifier(spec: str, pretrained: bool = True,
                              model_kwargs: Optional[Mapping[str, Any]] = None) -> ZeroShotClassifier:
    """The :class:`ZeroShotClassifier` of ``open_clip:<name>`` (:mod:`models.openclip`: a built-in or registered
    open_clip model name with its weights from the local file ``model_kwargs["checkpoint"]``, or
    ``local-dir:<folder>``), in eval mode, nothing downloaded. ``model_kwargs``: ``checkpoint`` and the prompt
    options of :func:`load_zero_shot_classifier` (``prompts``: ``saved`` reads a ``local-dir:`` folder's
    ``prompts.json``; ``openai``, ``simple``, ``bi_legacy``, ``custom`` with ``classnames`` / ``templates``).
    The classifier carries ``tokenizer`` (open_clip's), ``source`` (the name), ``prompt_set``, ``prompts`` and the
    model's own ``pretrained_cfg`` (:func:`models.openclip.open_clip_pretrained_cfg`)."""
    kwargs = dict(model_kwargs or {})
    openclip.check_checkpoint_kwargs(kwargs, CLIP_KWARGS + openclip.OPEN_CLIP_KWARGS, spec)
    name = openclip.open_clip_name(spec)
    folder = name[len(openclip.LOCAL_DIR):] if name.startswith(openclip.LOCAL_DIR) else name
    prompt_set = zero_shot_prompt_set(folder, kwargs.get("prompts"), kwargs.get("classnames"),
                                      kwargs.get("templates"))
    clip, tokenizer = openclip.load_open_clip(name, kwargs.get("checkpoint"), pretrained)
    batch_size = int(kwargs.get("prompt_batch_size") or 256)
    classifier = ZeroShotClassifier.from_prompt_lists(clip, tokenizer, prompt_set.classnames, prompt_set.prompts,
                                                      batch_size)
    classifier.tokenizer = tokenizer
    classifier.source = name
    classifier.prompt_set = prompt_set
    return classifier.eval()


register_source(openclip.OPEN_CLIP_PREFIX, lambda spec, pretrained, model_kwargs, allow_pickle, trust_remote_code:
                load_open_clip_classifier(spec, pretrained, model_kwargs))


#: an ``hf:`` folder of a CLIP or SigLIP (``architectures`` in its config.json) loads as its zero-shot classifier
register_hf_architecture(("CLIPModel", "SiglipModel"), lambda folder, pretrained, model_kwargs:
                         load_zero_shot_classifier(CLIP_PREFIX + folder, pretrained, model_kwargs))
