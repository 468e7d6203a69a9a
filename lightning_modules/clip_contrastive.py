"""CLIPContrastiveModule: a small ``transformers.CLIPModel`` trained from scratch on image-caption pairs.

Conventions
-----------
* Model: a stock ``transformers.CLIPModel`` built from a ``CLIPConfig`` with random weights. ``vision`` and
  ``text`` are ``CLIPVisionConfig`` / ``CLIPTextConfig`` keyword arguments over small defaults
  (:data:`VISION_DEFAULTS`: 64 x 64 images, 8 px patches, width 64, 4 blocks, 4 heads; :data:`TEXT_DEFAULTS`:
  width 64, 4 blocks, 4 heads, 24 positions); ``vocab_size`` rows of token embeddings; the special-token ids are
  the caption tokenizer's (:mod:`datamodules.synthetic_captions`: ``<pad>`` 0, ``<|startoftext|>`` 2,
  ``<|endoftext|>`` 3; the text tower reads each text at its first end token); ``projection_dim``; the
  temperature starts at CLIP's ``logit_scale = ln(1 / 0.07)`` and is clamped to at most ``ln(100)`` after every
  optimizer step, as Radford et al. 2021.
* Batches: ``{"image": [B, 3, H, W] in [0, 1] (NOT normalised), "input_ids", "attention_mask": [B, N],
  "label": [B]}`` (:class:`datamodules.synthetic_captions.SyntheticCaptionsDataModule`); images are normalised
  with ``mean`` / ``std`` (default CLIP's, :data:`datamodules.clip_zero_shot.CLIP_MEAN` / ``CLIP_STD``), which
  the export writes as the image processor's.
* Loss: CLIP's symmetric InfoNCE over the batch, ``(CE(logits_per_image, arange) + CE(logits_per_text,
  arange)) / 2`` with ``logits = logit_scale.exp() * cosine``; the other captions of the batch are the negatives
  (two images of one class may share a caption word for word: they count as negatives, as in CLIP).
* Logged: ``train/loss``, ``train/acc`` (image -> caption retrieval top-1 within the batch), ``val/loss``,
  ``val/acc``, ``test/...``; and ``val/zero_shot_acc`` / ``test/zero_shot_acc``, the top-1 accuracy of the
  zero-shot classifier built from the datamodule's ``prompt_set`` with its ``tokenizer``
  (:meth:`models.clip.ZeroShotClassifier.from_prompts`, OpenAI's recipe) against ``label``, when the datamodule
  has both.
* Recipe: AdamW (``lr``, ``betas``, ``weight_decay`` on weight matrices only: none on biases, LayerNorms,
  embeddings and the temperature), learning rate warmed up linearly over ``warmup_ratio`` of the optimizer steps
  then cosine-decayed to 0, stepped every optimizer step.
* Checks before training (``setup``): :meth:`CLIPContrastiveModule.check_datamodule`.
* Export (:meth:`export`): one folder in ``save_pretrained`` layout that ``CLIPModel.from_pretrained``,
  ``AutoTokenizer.from_pretrained``, ``CLIPImageProcessor.from_pretrained`` and
  :func:`models.clip.load_zero_shot_classifier` (``clip:<folder>``) read: the model (safetensors, float32), the
  tokenizer, the image processor (resize + centre crop to ``image_size``, bicubic, ``mean`` / ``std``), the
  prompt set (``prompts.json``, :func:`models.clip_prompts.save_prompt_set`) and ``training.json`` (metrics, checkpoint,
  hyperparameters).
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor

from datamodules.clip_zero_shot import CLIP_MEAN, CLIP_STD
from lightning_modules.classification_step import EXPORT_METADATA, FolderExport, StageSteps
from lightning_modules.lr_schedule import stepped_schedule
from methods.config_values import PlainDict
from models.checkpoint_io import cpu_float32_state_dict, fresh_export_folder
from models.clip import ZeroShotClassifier
from models.clip_prompts import save_prompt_set

VISION_DEFAULTS: Dict[str, Any] = dict(image_size=64, patch_size=8, hidden_size=64, intermediate_size=256,
                                       num_hidden_layers=4, num_attention_heads=4)
TEXT_DEFAULTS: Dict[str, Any] = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=4,
                                     num_attention_heads=4, max_position_embeddings=24)
#: CLIP's initial temperature ``ln(1 / 0.07)`` and its upper clamp ``ln(100)``
LOGIT_SCALE_INIT = math.log(1 / 0.07)
LOGIT_SCALE_MAX = math.log(100.0)


class CLIPContrastiveModule(FolderExport, StageSteps, pl.LightningModule):
    """Contrastive training of a small CLIP from scratch (module docstring for the conventions)."""

    #: train.py's default export: ``<trainer.default_root_dir>/clip`` (a folder)
    export_name = "clip"

    def __init__(self, vision: Optional[PlainDict] = None, text: Optional[PlainDict] = None,
                 vocab_size: int = 64, pad_token_id: int = 0, bos_token_id: int = 2, eos_token_id: int = 3,
                 projection_dim: int = 64, lr: float = 1e-3, weight_decay: float = 0.05,
                 betas: Tuple[float, float] = (0.9, 0.98), warmup_ratio: float = 0.1,
                 mean: Sequence[float] = CLIP_MEAN, std: Sequence[float] = CLIP_STD) -> None:
        super().__init__()
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean and std must have 3 entries (std > 0), got mean={list(mean)} std={list(std)}")
        if not 0.0 <= warmup_ratio < 1.0:
            raise ValueError(f"warmup_ratio must lie in [0, 1), got {warmup_ratio}")
        if eos_token_id == 2:
            raise ValueError("eos_token_id 2 makes CLIPTextModel pool at the largest id (its legacy configs): give "
                             "the end token another id")
        self.save_hyperparameters()
        vision_config = {**VISION_DEFAULTS, **dict(vision or {})}
        text_config = {**TEXT_DEFAULTS, **dict(text or {}), "vocab_size": vocab_size, "pad_token_id": pad_token_id,
                       "bos_token_id": bos_token_id, "eos_token_id": eos_token_id}
        self.clip = self.build_model(vision_config, text_config, projection_dim)
        self.register_buffer("_mean", torch.tensor([float(v) for v in mean]).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("_std", torch.tensor([float(v) for v in std]).view(1, 3, 1, 1), persistent=False)
        self._zero_shot = None  # class embeddings of the current validation / test epoch

    def build_model(self, vision_config: Dict[str, Any], text_config: Dict[str, Any], projection_dim: int):
        """The model trained here: a ``CLIPModel`` with CLIP's initial temperature."""
        from transformers import CLIPConfig, CLIPModel

        try:
            config = CLIPConfig(text_config=text_config, vision_config=vision_config, projection_dim=projection_dim,
                                logit_scale_init_value=LOGIT_SCALE_INIT)
            return CLIPModel(config)
        except (TypeError, ValueError) as err:
            raise ValueError(f"cannot build a CLIPModel from vision={vision_config} text={text_config}: {err}") from err

    @property
    def image_size(self) -> int:
        return int(self.clip.config.vision_config.image_size)

    @property
    def max_length(self) -> int:
        return int(self.clip.config.text_config.max_position_embeddings)

    # ------------------------------------------------------------------------------------------ forward
    def normalize(self, images: Tensor) -> Tensor:
        """[0, 1] images -> the model's input (``(x - mean) / std``)."""
        return (images - self._mean.to(images)) / self._std.to(images)

    def embeddings(self, images: Tensor, input_ids: Tensor, attention_mask: Optional[Tensor] = None):
        """L2-normalised image and text embeddings ``([B, D], [T, D])``."""
        image = self.clip.visual_projection(self.clip.vision_model(pixel_values=self.normalize(images)).pooler_output)
        text = self.clip.text_projection(
            self.clip.text_model(input_ids=input_ids, attention_mask=attention_mask).pooler_output)
        return F.normalize(image, dim=-1), F.normalize(text, dim=-1)

    def forward(self, images: Tensor, input_ids: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        """``logits_per_image`` ``[B, T]`` = ``logit_scale.exp() * cosine`` of [0, 1] images and token ids."""
        image, text = self.embeddings(images, input_ids, attention_mask)
        return self.pair_logits(image, text)

    def pair_logits(self, image: Tensor, text: Tensor) -> Tensor:
        """``[B, T]`` logits of normalised image and text embeddings: ``logit_scale.exp() * cosine``."""
        return self.clip.logit_scale.exp() * image @ text.t()

    # ------------------------------------------------------------------------------------------ checks
    def check_datamodule(self, datamodule: Any) -> None:
        """The datamodule serves this model: its tokenizer fits the embeddings and has the model's special-token
        ids and at most its positions, its images are the model's size."""
        name = type(datamodule).__name__
        tokenizer = getattr(datamodule, "tokenizer", None)
        if tokenizer is None or not hasattr(tokenizer, "save_pretrained"):
            raise ValueError(f"datamodule {name} has no Hugging Face tokenizer ('tokenizer' attribute): "
                             "CLIPContrastiveModule trains on captions and exports the tokenizer with the model")
        if len(tokenizer) > self.hparams.vocab_size:
            raise ValueError(f"the tokenizer of datamodule {name} has {len(tokenizer)} tokens but the model's "
                             f"embeddings hold vocab_size={self.hparams.vocab_size}; raise --model.init_args."
                             "vocab_size")
        for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
            have = getattr(tokenizer, key, None)
            if have != self.hparams[key]:
                raise ValueError(f"the tokenizer of datamodule {name} has {key}={have}, the model {key}="
                                 f"{self.hparams[key]}: model and tokenizer do not match")
        length = getattr(datamodule, "max_length", None) or getattr(tokenizer, "model_max_length", None)
        if length is not None and int(length) > self.max_length:
            raise ValueError(f"datamodule {name} gives texts of up to {length} tokens but the text tower has "
                             f"max_position_embeddings={self.max_length}")
        size = getattr(datamodule, "image_size", None)
        if size is not None and int(size) != self.image_size:
            raise ValueError(f"datamodule {name} gives {size} px images but the vision tower takes image_size="
                             f"{self.image_size}")

    # ------------------------------------------------------------------------------------------ steps
    def _step(self, batch: Dict[str, Any], stage: str) -> Tensor:
        missing = [k for k in ("image", "input_ids") if not isinstance(batch, dict) or k not in batch]
        if missing:
            got = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
            raise KeyError(f"CLIPContrastiveModule needs dict batches with 'image' and 'input_ids' (a caption "
                           f"datamodule's), missing {missing}, got {got}")
        images = batch["image"]
        image, text = self.embeddings(images, batch["input_ids"], batch.get("attention_mask"))
        logits = self.pair_logits(image.float(), text.float())
        targets = torch.arange(logits.shape[0], device=logits.device)
        loss = self.loss(logits)
        acc = (logits.argmax(dim=-1) == targets).float().mean()
        size, sync = images.shape[0], stage != "train"
        self.log(f"{stage}/loss", loss, on_step=stage == "train", on_epoch=True, prog_bar=True, sync_dist=sync,
                 batch_size=size)
        self.log(f"{stage}/acc", acc, on_step=False, on_epoch=True, prog_bar=stage != "train", sync_dist=sync,
                 batch_size=size)
        if stage != "train" and self._zero_shot is not None and "label" in batch:
            zero_shot = (image.float() @ self._zero_shot.t()).argmax(dim=-1)
            self.log(f"{stage}/zero_shot_acc", (zero_shot == batch["label"]).float().mean(), on_step=False,
                     on_epoch=True, prog_bar=True, sync_dist=True, batch_size=size)
        return loss

    def loss(self, logits: Tensor) -> Tensor:
        """CLIP's symmetric InfoNCE of ``logits`` ``[B, B]`` (``logit_scale.exp() * cosine``; pair ``i`` matches
        caption ``i``)."""
        targets = torch.arange(logits.shape[0], device=logits.device)
        return (F.cross_entropy(logits, targets) + F.cross_entropy(logits.t(), targets)) / 2

    def _class_embeddings(self) -> Optional[Tensor]:
        """The normalised class embeddings of the datamodule's prompt set (``None`` without one)."""
        datamodule = getattr(self.trainer, "datamodule", None)
        prompt_set = getattr(datamodule, "prompt_set", None)
        tokenizer = getattr(datamodule, "tokenizer", None)
        if prompt_set is None or tokenizer is None:
            return None
        return ZeroShotClassifier.from_prompt_lists(self.clip, tokenizer, prompt_set.classnames,
                                                    prompt_set.prompts).class_embeddings.detach()

    def on_validation_epoch_start(self) -> None:
        self._zero_shot = self._class_embeddings()

    def on_test_epoch_start(self) -> None:
        self._zero_shot = self._class_embeddings()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        with torch.no_grad():  # CLIP's clamp of the temperature (Radford et al. 2021)
            self.clip.logit_scale.clamp_(0.0, LOGIT_SCALE_MAX)

    def configure_optimizers(self):
        decay, no_decay = [], []
        for name, param in self.clip.named_parameters():
            if not param.requires_grad:
                continue
            plain = param.ndim < 2 or "embedding" in name or name == "logit_scale"
            (no_decay if plain else decay).append(param)
        groups = [{"params": decay, "weight_decay": self.hparams.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=self.hparams.lr, betas=tuple(self.hparams.betas))
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        return stepped_schedule(opt, int(round(self.hparams.warmup_ratio * total)), total, "cosine")

    # ------------------------------------------------------------------------------------------ export
    def image_processor(self):
        """CLIP's: resize the shorter side to ``image_size``, centre crop, bicubic, ``mean`` / ``std``."""
        from transformers import CLIPImageProcessor

        size = self.image_size
        return CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size},
                                  image_mean=list(self.hparams.mean), image_std=list(self.hparams.std), resample=3)

    def export(self, folder: Union[str, os.PathLike], datamodule: Any,
               metadata: Optional[Dict[str, Any]] = None) -> Path:
        """Write the export (module docstring) with ``metadata`` to ``folder``; returns it
        (:class:`~lightning_modules.classification_step.FolderExport`)."""
        self.check_datamodule(datamodule)
        prompt_set = getattr(datamodule, "prompt_set", None)
        if prompt_set is None:
            raise ValueError(f"datamodule {type(datamodule).__name__} has no prompt_set: the export saves the "
                             "zero-shot prompts beside the model")
        folder = fresh_export_folder(folder, EXPORT_METADATA, type(self).__name__)
        self.clip.save_pretrained(str(folder), state_dict=cpu_float32_state_dict(self.clip))
        datamodule.tokenizer.save_pretrained(str(folder))
        self.image_processor().save_pretrained(str(folder))
        save_prompt_set(folder, prompt_set.classnames, prompt_set.prompts,
                        templates=getattr(datamodule, "templates", None))
        return self.write_export_info(folder, datamodule, metadata, classes=list(prompt_set.classnames))
