"""CLIP as classifiers: every attribution method explains a stock ``transformers.CLIPModel`` through these.

A ``CLIPModel`` scores image-text pairs (``logit_scale.exp() * cosine`` of the projected embeddings). Wrapped, one
tower becomes a classifier whose classes are fixed embeddings of the other modality, and ``target=`` names a
class, a prompt or an image:

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

Both wrappers follow the protocol of :mod:`methods.adapters.hf_clip` (``clip``, ``clip_tower``,
``logits_from_embeddings``); their fixed embeddings are buffers (L2-normalised), ``logit_scale`` is read from the
``CLIPModel`` at every call.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor, nn
from torch.nn import functional as F

Template = Union[str, Callable[[str], str]]


def _check_clip(clip) -> nn.Module:
    import transformers

    if not isinstance(clip, transformers.CLIPModel):
        raise TypeError(f"clip must be a transformers.CLIPModel, got {type(clip).__name__}")
    return clip


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


def _scaled_cosine(clip: nn.Module, embeddings: Tensor, others: Tensor) -> Tensor:
    """``logit_scale.exp() * cos(embeddings, others)``: ``[B, D] x [C, D] -> [B, C]``, CLIP's own logits
    (``others`` already normalised)."""
    normed = embeddings / embeddings.norm(p=2, dim=-1, keepdim=True)
    return clip.logit_scale.exp().to(normed) * (normed @ others.to(normed).t())


def fill_template(template: Template, classname: str) -> str:
    """One prompt: ``template(classname)`` for a callable (``open_clip``'s templates), else the class name put at
    ``{c}`` or ``{}`` of the string."""
    if callable(template):
        return template(classname)
    if "{c}" in template:
        return template.replace("{c}", classname)
    if "{}" not in template:
        raise ValueError(f"template {template!r} has no '{{}}' (or '{{c}}') where the class name goes")
    return template.format(classname)


def text_embeddings(clip: nn.Module, tokenizer: Callable, texts: Sequence[str], batch_size: int = 256) -> Tensor:
    """The projected, unnormalised text embeddings ``[T, D]`` of ``texts`` (no gradient, eval mode):
    ``tokenizer(texts, padding=True, truncation=True, return_tensors="pt")`` then ``get_text_features``."""
    clip = _check_clip(clip)
    device = clip.logit_scale.device
    out = []
    with _EvalNoGrad(clip):
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(list(texts[start:start + batch_size]), padding=True, truncation=True,
                              return_tensors="pt")
            features = clip.get_text_features(input_ids=batch["input_ids"].to(device),
                                              attention_mask=batch["attention_mask"].to(device)
                                              if batch.get("attention_mask") is not None else None)
            out.append(getattr(features, "pooler_output", features))
    return torch.cat(out)


class ZeroShotClassifier(nn.Module):
    """CLIP's vision tower as a classifier over fixed class embeddings.

    ``forward(pixel_values)`` -> ``logit_scale.exp() * cos(image_embedding, class_embedding_c)`` ``[B, C]``
    (CLIP's ``logits_per_image`` against the classes). ``class_embeddings`` ``[C, D]`` (``D`` = the model's
    ``projection_dim``) are stored L2-normalised (buffer ``class_embeddings``); ``classnames`` (optional) is kept
    for reports. The attribution methods explain the vision tower through it (adapter
    ``methods.adapters.hf_clip.HFCLIPVisionAdapter``).
    """

    clip_tower = "vision"

    def __init__(self, clip: nn.Module, class_embeddings: Tensor, classnames: Optional[Sequence[str]] = None):
        super().__init__()
        self.clip = _check_clip(clip)
        embeddings = torch.as_tensor(class_embeddings).detach()
        dim = int(clip.config.projection_dim)
        if embeddings.dim() != 2 or embeddings.shape[1] != dim or embeddings.shape[0] == 0:
            raise ValueError(f"class_embeddings must be [C, {dim}] (C >= 1 classes, the model's projection_dim), got "
                             f"{tuple(embeddings.shape)}")
        if not embeddings.dtype.is_floating_point:
            raise ValueError(f"class_embeddings must be floating point, got dtype {embeddings.dtype}")
        if classnames is not None and len(classnames) != embeddings.shape[0]:
            raise ValueError(f"{len(classnames)} classnames for {embeddings.shape[0]} class embeddings")
        self.register_buffer("class_embeddings", F.normalize(embeddings, dim=-1))
        self.classnames = list(classnames) if classnames is not None else None

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
        return_tensors="pt")`` -> ``{"input_ids", "attention_mask"}``.
        """
        if isinstance(classnames, Mapping):
            if templates is not None:
                raise ValueError("from_prompts: give templates or a dict of per-class prompts, not both")
            names = list(classnames)
            prompts = [[p] if isinstance(p, str) else list(p) for p in classnames.values()]
        else:
            if isinstance(classnames, str):
                raise ValueError("classnames must be a list of class names (or a dict of prompts), got a string")
            if templates is None:
                raise ValueError("from_prompts needs templates (one or a list) unless classnames is a dict of prompts")
            names = list(classnames)
            if isinstance(templates, str) or callable(templates):
                templates = [templates]
            templates = list(templates)
            if not templates:
                raise ValueError("templates is empty")
            prompts = [[fill_template(t, name) for t in templates] for name in names]
        if not names:
            raise ValueError("classnames is empty")
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
        """Projected, unnormalised image embeddings ``[B, D]`` (``get_image_features``)."""
        tower = self.clip.vision_model
        pooled = tower(pixel_values=pixel_values).pooler_output
        return self.clip.visual_projection(pooled)

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
    """CLIP's text tower as a classifier over fixed images: a text batch ``[T, N]`` -> logits ``[T, I]``
    (CLIP's ``logits_per_text`` against the images), so ``target=image_index`` explains each text against one
    image (per text: a ``LongTensor[T]``).

    ``pixel_values`` ``[I, 3, S, S]`` (normalised) are embedded once at construction (no gradient, eval mode) and
    stored L2-normalised (buffer ``image_embeddings``); or pass ``image_embeddings`` ``[I, D]`` directly. The
    attribution methods explain the text tower through it (adapter ``methods.adapters.hf_clip.HFCLIPTextAdapter``).
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
                pooled = clip.vision_model(pixel_values=pixel_values).pooler_output
                image_embeddings = clip.visual_projection(pooled)
        embeddings = torch.as_tensor(image_embeddings).detach()
        dim = int(clip.config.projection_dim)
        if embeddings.dim() != 2 or embeddings.shape[1] != dim or embeddings.shape[0] == 0:
            raise ValueError(f"image_embeddings must be [I, {dim}] (the model's projection_dim), got "
                             f"{tuple(embeddings.shape)}")
        self.register_buffer("image_embeddings", F.normalize(embeddings, dim=-1))

    @property
    def num_images(self) -> int:
        return int(self.image_embeddings.shape[0])

    def text_embeddings(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        """Projected, unnormalised text embeddings ``[T, D]`` (``get_text_features``: the EOS token)."""
        pooled = self.clip.text_model(input_ids=input_ids, attention_mask=attention_mask).pooler_output
        return self.clip.text_projection(pooled)

    def logits_from_embeddings(self, embeddings: Tensor) -> Tensor:
        """``[T, D]`` projected text embeddings -> logits ``[T, I]``."""
        return _scaled_cosine(self.clip, embeddings, self.image_embeddings)

    def forward(self, input_ids, attention_mask: Optional[Tensor] = None, **unused) -> Tensor:
        """``input_ids`` ``[T, N]`` (or a tokenizer's mapping) -> logits ``[T, I]``; other tokenizer outputs
        (``special_tokens_mask``, ...) are ignored."""
        if isinstance(input_ids, Mapping):
            attention_mask = input_ids.get("attention_mask", attention_mask)
            input_ids = input_ids["input_ids"]
        return self.logits_from_embeddings(self.text_embeddings(input_ids, attention_mask))

    def extra_repr(self) -> str:
        return f"images={self.num_images}"
