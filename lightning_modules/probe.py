"""LinearProbe: a timm ViT backbone (frozen, or trainable in fine-tuning mode) plus a linear head.

Conventions
-----------
* Inputs are images in [0, 1] (``batch["image"]``); the module normalises them inside with the backbone's
  ``pretrained_cfg`` mean/std (overridable with ``mean``/``std``), so datamodules never normalise.
* ``features``: what the head reads from the final-norm tokens of the backbone
    - ``"cls"``: the final [CLS] token (timm ``global_pool="token"``; CDAM's probe);
    - ``"mean_patch"``: the mean of the final-norm patch tokens (timm ``global_pool="avg", fc_norm=False``:
      LayerNorm *before* pooling, as DINO's linear evaluation; timm's default for ``avg`` would put the norm
      after pooling);
    - ``"cls+mean_patch"``: both concatenated (DINO's ViT-B linear-eval layout). A stock timm
      ``VisionTransformer`` has no read-out that concatenates two poolings, so this probe cannot be exported
      to one (:meth:`to_timm` raises).
* ``backbone_checkpoint``: a local weights file (state_dict, DINO / Lightning checkpoint, safetensors, or a
  classifier file of ``train.py``; heads are dropped) or a spec of a registered source of files
  (:func:`models.sources.local_file`; with ``import training``: ``"synthetic"``, the synthetic benchmark's ViT,
  ``"synthetic:<overrides.yaml>"``, trained with these ``train.py`` keys changed, ``"trained:<config.yaml>"``).
  The file is read as tensors
  and plain values; ``allow_pickle=True`` (``--model.allow_pickle true``) also unpickles objects (trusted files
  only, :mod:`models.checkpoint_io`).
* Frozen mode (``finetune=False``, default): backbone parameters have ``requires_grad=False`` and the
  backbone stays in eval mode during training (no dropout / drop-path), as in DINO's linear evaluation.
* Recipe defaults (CDAM): Adam, lr 3e-4, no weight decay, no schedule; RandomResizedCrop + horizontal flip
  (``augment="rrc+flip"``, batched on the input tensors, see :mod:`datamodules.augment`).
* Logged: ``train/loss``, ``train/acc`` (epoch means), ``val/loss``, ``val/acc``.
* :meth:`to_timm` returns a stock timm ``VisionTransformer`` whose ``head`` is the trained layer and whose
  ``pretrained_cfg`` carries the normalisation: its logits equal the probe's on normalised inputs.
"""
from __future__ import annotations

import copy
from typing import Any, Optional, Sequence, Tuple

import pytorch_lightning as pl
import torch
from torch import Tensor, nn

from datamodules.augment import AUGMENTATIONS, random_resized_crop_flip
from lightning_modules.classification_step import StageSteps, classification_loss
from lightning_modules.lr_schedule import stepped_schedule
from methods.config_values import PlainDict
from models.backbones import create_backbone

FEATURES = ("cls", "mean_patch", "cls+mean_patch")
_POOL = {"cls": dict(global_pool="token"), "mean_patch": dict(global_pool="avg", fc_norm=False),
         "cls+mean_patch": dict(global_pool="token")}


def unpack_batch(batch: Any) -> Tuple[Tensor, Tensor]:
    """``(images, labels)`` from a dict batch (``image``/``label``) or an ``(images, labels)`` pair."""
    if isinstance(batch, dict):
        if "image" not in batch or "label" not in batch:
            raise KeyError(f"batch dict needs 'image' and 'label' keys, got {sorted(batch)}")
        return batch["image"], batch["label"]
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    raise TypeError(f"unsupported batch type {type(batch).__name__}")


class LinearProbe(StageSteps, pl.LightningModule):
    def __init__(
        self,
        backbone: str = "vit_small_patch8_224.dino",
        num_classes: int = 1000,
        features: str = "cls",
        pretrained: bool = True,
        backbone_checkpoint: Optional[str] = None,
        backbone_kwargs: Optional[PlainDict] = None,
        finetune: bool = False,
        lr: float = 3e-4,
        weight_decay: float = 0.0,
        warmup_epochs: int = 0,
        cosine: bool = False,
        label_smoothing: float = 0.0,
        augment: str = "rrc+flip",
        crop_scale: Tuple[float, float] = (0.08, 1.0),
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
        allow_pickle: bool = False,
    ) -> None:
        super().__init__()
        if features not in FEATURES:
            raise ValueError(f"features must be one of {FEATURES}, got {features!r}")
        if augment not in AUGMENTATIONS:
            raise ValueError(f"augment must be one of {AUGMENTATIONS}, got {augment!r}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.save_hyperparameters()
        kwargs = dict(_POOL[features])
        kwargs.update(backbone_kwargs or {})
        self.backbone = create_backbone(backbone, pretrained=pretrained, backbone_checkpoint=backbone_checkpoint,
                                        allow_pickle=allow_pickle, **kwargs)
        if not hasattr(self.backbone, "forward_features") or not hasattr(self.backbone, "num_prefix_tokens"):
            raise TypeError(f"timm model {backbone!r} is not a ViT-like model with tokens")
        dim = self.backbone.num_features * (2 if features == "cls+mean_patch" else 1)
        self.head = nn.Linear(dim, num_classes)
        cfg = dict(getattr(self.backbone, "pretrained_cfg", None) or {})
        mean = tuple(mean) if mean is not None else tuple(cfg.get("mean", (0.485, 0.456, 0.406)))
        std = tuple(std) if std is not None else tuple(cfg.get("std", (0.229, 0.224, 0.225)))
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean/std must be 3 values (std > 0), got {mean}, {std}")
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)
        self.backbone.requires_grad_(bool(finetune))

    # ------------------------------------------------------------------------------------------ forward
    def normalise(self, images: Tensor) -> Tensor:
        return (images - self.mean.to(images.dtype)) / self.std.to(images.dtype)

    def features(self, normalised: Tensor) -> Tensor:
        """Pre-logits features of normalised images, ``[B, D]`` (``[B, 2D]`` for ``cls+mean_patch``)."""
        tokens = self.backbone.forward_features(normalised)
        if self.hparams.features == "cls+mean_patch":
            n = self.backbone.num_prefix_tokens
            return torch.cat([tokens[:, 0], tokens[:, n:].mean(dim=1)], dim=-1)
        return self.backbone.forward_head(tokens, pre_logits=True)

    def forward(self, images: Tensor) -> Tensor:
        """Logits of images in [0, 1]."""
        return self.head(self.features(self.normalise(images)))

    def train(self, mode: bool = True):
        super().train(mode)
        if not self.hparams.finetune:
            self.backbone.eval()
        return self

    # ------------------------------------------------------------------------------------------ steps
    def _augment(self, images: Tensor) -> Tensor:
        if self.hparams.augment == "none":
            return images
        return random_resized_crop_flip(
            images, crop=self.hparams.augment == "rrc+flip", flip=True, scale=tuple(self.hparams.crop_scale)
        )

    def _step(self, batch: Any, stage: str) -> Tensor:
        images, labels = unpack_batch(batch)
        if stage == "train":
            images = self._augment(images)
        return classification_loss(self, self(images), labels, stage, self.hparams.label_smoothing)

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        opt = torch.optim.Adam(params, lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        warm, cosine = self.hparams.warmup_epochs, self.hparams.cosine
        if not warm and not cosine:
            return opt
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        steps_per_epoch = max(total // max(int(self.trainer.max_epochs or 1), 1), 1)
        return stepped_schedule(opt, warm * steps_per_epoch, total, "cosine" if cosine else "constant")

    # ------------------------------------------------------------------------------------------ export
    def to_timm(self) -> nn.Module:
        """A stock timm ``VisionTransformer`` (eval mode, on CPU, float32) computing the probe's logits from
        *normalised* images, with ``pretrained_cfg`` mean/std set to the probe's normalisation."""
        from timm.models.vision_transformer import VisionTransformer

        if self.hparams.features == "cls+mean_patch":
            raise ValueError(
                "a 'cls+mean_patch' probe cannot be exported to a stock timm VisionTransformer: timm's read-outs "
                "pool one way ('token', 'avg', ...) and none concatenates [CLS] with the mean patch token. Use "
                "features='cls' or 'mean_patch' for a probe the attribution methods can explain, or keep the "
                "Lightning checkpoint of this probe."
            )
        if not isinstance(self.backbone, VisionTransformer):
            raise TypeError(f"export needs a timm VisionTransformer backbone, got {type(self.backbone).__name__}")
        model = copy.deepcopy(self.backbone).cpu().float()
        model.reset_classifier(self.hparams.num_classes)
        model.head.load_state_dict({k: v.detach().cpu().float() for k, v in self.head.state_dict().items()})
        cfg = dict(getattr(model, "pretrained_cfg", None) or {})
        cfg.update(mean=tuple(self.mean.flatten().tolist()), std=tuple(self.std.flatten().tolist()),
                   num_classes=self.hparams.num_classes)
        size = model.patch_embed.img_size
        cfg["input_size"] = (3, int(size[0]), int(size[1]))
        model.pretrained_cfg = cfg
        model.requires_grad_(True)
        return model.eval()
