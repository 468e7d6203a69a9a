"""SigLIPContrastiveModule: a small ``transformers.SiglipModel`` trained from scratch on image-caption pairs with
SigLIP's sigmoid loss (Zhai et al. 2023, "Sigmoid Loss for Language Image Pre-Training").

Everything :mod:`lightning_modules.clip_contrastive` says holds (batches, checks, zero-shot validation, recipe,
export layout), except:

* Model: a stock ``SiglipModel`` from a ``SiglipConfig`` with random weights: the vision tower reads its patches
  through the attention-pooling head (``vision_use_head``), the text tower pools the **last position** through its
  ``head`` (``projection_size`` = the vision width, so both embeddings share one space; ``projection_dim`` is
  unused); ``logit_scale`` starts at ``ln(10)`` and ``logit_bias`` at ``-10`` (the paper's initialisation), neither
  clamped.
* Texts: padded to the text tower's ``max_position_embeddings`` with the pad token and read **without** an
  attention mask, as SigLIP is trained (the caption batches' own padding is extended; their mask is dropped), so
  that the last position is a pad token for every caption; the zero-shot classifier pads its prompts the same way
  (:func:`models.clip.tokenize_texts`).
* Loss: the sigmoid loss over every image-caption pair of the batch, ``-mean_i sum_j log sigmoid(z_ij * (t *
  cos_ij + b))`` with ``z_ij = 1`` on the diagonal and ``-1`` elsewhere (transformers' ``SiglipModel`` loss with
  its image and text roles); two captions of one class that are word for word equal still count as negatives.
* Export: a ``SiglipImageProcessor`` (resize to ``image_size x image_size``, bicubic, the module's ``mean`` /
  ``std``) beside the model, tokenizer and prompt set; ``clip:<folder>`` and ``hf:<folder>`` load it as a zero-shot
  classifier.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_modules.clip_contrastive import CLIPContrastiveModule

#: SigLIP's initial temperature ``ln(10)`` and bias ``-10`` (Zhai et al. 2023, section 3.2)
SIGLIP_LOGIT_SCALE_INIT = math.log(10.0)
SIGLIP_LOGIT_BIAS_INIT = -10.0


class SigLIPContrastiveModule(CLIPContrastiveModule):
    """Sigmoid-loss training of a small SigLIP from scratch (module docstring for the conventions)."""

    export_name = "siglip"

    def __init__(self, *args: Any, logit_scale_init: float = SIGLIP_LOGIT_SCALE_INIT,
                 logit_bias_init: float = SIGLIP_LOGIT_BIAS_INIT, **kwargs: Any) -> None:
        self._logit_init = (float(logit_scale_init), float(logit_bias_init))
        super().__init__(*args, **kwargs)

    def build_model(self, vision_config: Dict[str, Any], text_config: Dict[str, Any], projection_dim: int):
        """A ``SiglipModel``; the text ``head`` projects to the vision width; the paper's scale and bias."""
        from transformers import SiglipConfig, SiglipModel

        text_config = {**text_config, "projection_size": int(vision_config["hidden_size"])}
        try:
            model = SiglipModel(SiglipConfig(text_config=text_config, vision_config=vision_config))
        except (TypeError, ValueError) as err:
            raise ValueError(f"cannot build a SiglipModel from vision={vision_config} text={text_config}: {err}") \
                from err
        with torch.no_grad():
            model.logit_scale.fill_(self._logit_init[0])
            model.logit_bias.fill_(self._logit_init[1])
        return model

    def text_inputs(self, input_ids: Tensor) -> Tensor:
        """The caption ids right-padded with the pad token to ``max_position_embeddings`` (SigLIP's texts)."""
        missing = self.max_length - input_ids.shape[1]
        if missing < 0:
            raise ValueError(f"captions of {input_ids.shape[1]} tokens exceed the text tower's {self.max_length} "
                             "positions")
        return F.pad(input_ids, (0, missing), value=int(self.hparams.pad_token_id))

    def embeddings(self, images: Tensor, input_ids: Tensor, attention_mask: Optional[Tensor] = None):
        """L2-normalised image and text embeddings ``([B, D], [T, D])``; the texts padded to ``max_length`` and
        read without a mask (``attention_mask`` is ignored)."""
        image = self.clip.vision_model(pixel_values=self.normalize(images)).pooler_output
        text = self.clip.text_model(input_ids=self.text_inputs(input_ids)).pooler_output
        return F.normalize(image, dim=-1), F.normalize(text, dim=-1)

    def pair_logits(self, image: Tensor, text: Tensor) -> Tensor:
        """SigLIP's logits ``logit_scale.exp() * cosine + logit_bias``."""
        return self.clip.logit_scale.exp() * image @ text.t() + self.clip.logit_bias

    def loss(self, logits: Tensor) -> Tensor:
        """The sigmoid loss of ``logits`` ``[B, B]`` (pair ``i`` matches caption ``i``)."""
        signs = 2 * torch.eye(logits.shape[0], device=logits.device, dtype=logits.dtype) - 1
        return -F.logsigmoid(signs * logits).sum(dim=-1).mean()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        """No clamp of the temperature (SigLIP trains ``t`` and ``b`` freely)."""

    def image_processor(self):
        """SigLIP's: resize to ``image_size x image_size`` (no crop), bicubic, ``mean`` / ``std``."""
        from transformers import SiglipImageProcessor

        size = self.image_size
        return SiglipImageProcessor(size={"height": size, "width": size}, image_mean=list(self.hparams.mean),
                                    image_std=list(self.hparams.std), resample=3)
