"""AnswerLMModule: trains a stock Hugging Face causal language model from scratch to answer: the next token after
each sequence of a text datamodule is the sample's class, one token per class (the associative-recall benchmark's
values, ``datamodules.associative_recall``).

Conventions
-----------
* ``model_type`` / ``config``: a ``transformers`` config of that type (``llama``: ``LlamaConfig``) built from
  ``config`` (plain values: ``hidden_size``, ``num_hidden_layers``, ...) with the vocabulary of the datamodule's
  tokenizer (``vocab_size``, ``pad_token_id``; no BOS / EOS), and its ``AutoModelForCausalLM`` with random
  weights (``seed``-independent of the data: Lightning's ``seed_everything`` seeds it).
* Answer tokens: the datamodule's ``classes`` are tokens of its tokenizer (one id each; checked at ``setup``); the
  class of a sample is the token the model should predict after the sample's last real token.
* Loss: cross-entropy of the next-token logits over the **whole vocabulary** at each row's last real token (the
  decoder adapters' read-out; right or left padding, position ids ``attention_mask.cumsum(-1) - 1`` as
  ``generate()``) against the answer token; ``<stage>/acc`` is the accuracy among the answer tokens (the argmax of
  the logits restricted to them: what ``evaluation.classifier.AnswerTokenClassifier`` predicts). Logged as
  :func:`lightning_modules.classification_step.classification_loss` logs (``train/loss``, ``val/acc``, ...).
* Recipe: AdamW (``lr``, ``weight_decay`` on weight matrices and embeddings only, ``betas``), linear warm-up over
  ``warmup_steps`` optimizer steps (or ``warmup_ratio`` of all steps when it is 0), then ``decay`` (``cosine``,
  ``linear`` or ``constant``; ``lightning_modules.lr_schedule``). On associative recall the slow warm-up matters:
  the induction circuit appeared by step 200 after a 150-step warm-up to 3e-3 (batch 512), and not within
  500 steps after a 30-step one.
* ``num_threads`` (default 1): torch's intra-op threads while fitting, restored afterwards (``null``: torch's
  setting). A model this small gains nothing from more, and on cores shared with other jobs two threads per
  process oversubscribe them: one training step took 0.87 s with 2 threads and 0.26 s with 1 (2 cores, load
  average about 9).
* Export (:meth:`export`): ``save_pretrained`` of the causal LM (safetensors, float32) with ``id2label`` /
  ``label2id`` naming the answer tokens in class order (``evaluate.py`` reads the LM as a classifier over them),
  the datamodule's tokenizer, and ``training.json`` (metrics, the datamodule's ``max_length``), in one folder that
  ``AutoModelForCausalLM.from_pretrained`` and ``models.sources.load_model`` read.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_modules.classification_step import StageSteps
from lightning_modules.lr_schedule import stepped_schedule
from methods.adapters.tokens import last_real_positions, positions_from_mask
from methods.config_values import PlainDict
from models.checkpoint_io import cpu_float32_state_dict, fresh_export_folder
from models.sources import check_remote_code_options

#: the file an export writes beside the model: marks the folder as this module's export (replaceable)
EXPORT_METADATA = "training.json"
NO_MODEL = ("AnswerLMModule builds its model from the datamodule's tokenizer at setup: fit it with a text "
            "datamodule (train.py)")


class AnswerLMModule(StageSteps, pl.LightningModule):
    """A causal LM trained from scratch to predict each sample's class token (module docstring)."""

    #: train.py's default export: ``<trainer.default_root_dir>/classifier`` (a folder)
    export_name = "classifier"

    def __init__(self, model_type: str = "llama", config: Optional[PlainDict] = None, lr: float = 3e-3,
                 weight_decay: float = 0.01, betas: Tuple[float, float] = (0.9, 0.999), warmup_steps: int = 0,
                 warmup_ratio: float = 0.05, decay: str = "cosine", num_threads: Optional[int] = 1) -> None:
        super().__init__()
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1 or null (torch's setting), got {num_threads}")
        if warmup_steps < 0 or not 0.0 <= warmup_ratio < 1.0:
            raise ValueError(f"warmup_steps must be >= 0 and warmup_ratio in [0, 1), got {warmup_steps}, "
                             f"{warmup_ratio}")
        check_remote_code_options(config, "config")
        self.save_hyperparameters()
        self.model: Optional[nn.Module] = None
        self.register_buffer("answer_ids", torch.zeros(0, dtype=torch.long), persistent=False)
        self._threads_before: Optional[int] = None

    def on_fit_start(self) -> None:
        if self.hparams.num_threads is not None:
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(int(self.hparams.num_threads))

    def on_fit_end(self) -> None:
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None

    # ------------------------------------------------------------------------------------------ set-up
    def data_config(self) -> Dict[str, Any]:
        """Nothing to hand over: the model is trained from scratch on the datamodule's own tokenizer."""
        return {}

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is None:
            raise ValueError("AnswerLMModule needs a text datamodule (its tokenizer and classes)")
        self.build(datamodule)

    def build(self, datamodule: Any) -> None:
        """The model (once) for ``datamodule``'s tokenizer, and the answer ids of its ``classes``."""
        tokenizer, answer_ids = self.answer_tokens(datamodule)
        self.answer_ids = answer_ids.to(self.answer_ids.device)
        if self.model is not None:
            return
        from transformers import AutoConfig, AutoModelForCausalLM

        options = {**dict(self.hparams.config or {}), "vocab_size": len(tokenizer),
                   "pad_token_id": tokenizer.pad_token_id, "bos_token_id": None, "eos_token_id": None}
        config = AutoConfig.for_model(self.hparams.model_type, **options)
        self.model = AutoModelForCausalLM.from_config(config)
        self.model.train()

    @staticmethod
    def answer_tokens(datamodule: Any) -> Tuple[Any, Tensor]:
        """``(tokenizer, answer token ids [C])`` of a datamodule whose ``classes`` are tokens of its tokenizer."""
        name = type(datamodule).__name__
        tokenizer = getattr(datamodule, "tokenizer", None)
        if tokenizer is None or not hasattr(tokenizer, "save_pretrained"):
            raise ValueError(f"datamodule {name} has no Hugging Face tokenizer: AnswerLMModule trains on token "
                             "batches and exports the tokenizer with the model")
        classes = [str(c) for c in (getattr(datamodule, "classes", None) or ())]
        if len(classes) < 2:
            raise ValueError(f"datamodule {name} names {len(classes)} classes; the answer tokens are its classes")
        vocab = tokenizer.get_vocab()
        missing = [c for c in classes if c not in vocab]
        if missing:
            raise ValueError(f"the classes {missing[:5]} of datamodule {name} are not tokens of its tokenizer: "
                             "AnswerLMModule predicts one token per class")
        return tokenizer, torch.tensor([vocab[c] for c in classes], dtype=torch.long)

    # ------------------------------------------------------------------------------------------ forward
    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        """Next-token logits ``[B, V]`` at each row's last real token."""
        if self.model is None:
            raise RuntimeError(NO_MODEL)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        out: Any = self.model(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=positions_from_mask(attention_mask))
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        return out.logits[rows, last_real_positions(attention_mask)]

    def _step(self, batch: Dict[str, Any], stage: str) -> Tensor:
        if not isinstance(batch, dict) or "input_ids" not in batch or "label" not in batch:
            got = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
            raise KeyError(f"AnswerLMModule needs dict batches with 'input_ids' and 'label', got {got}")
        logits = self(batch["input_ids"], batch.get("attention_mask")).float()
        labels = batch["label"]
        loss = F.cross_entropy(logits, self.answer_ids[labels])
        acc = (logits[:, self.answer_ids].argmax(dim=-1) == labels).float().mean()
        on_step = stage == "train"
        for key, value in (("loss", loss), ("acc", acc)):
            self.log(f"{stage}/{key}", value, on_step=on_step and key == "loss", on_epoch=True, prog_bar=True,
                     sync_dist=stage != "train", batch_size=labels.shape[0])
        return loss

    def configure_optimizers(self):
        if self.model is None:
            raise RuntimeError(NO_MODEL)
        decay, no_decay = [], []
        for param in self.model.parameters():
            if param.requires_grad:
                (decay if param.ndim >= 2 else no_decay).append(param)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": self.hparams.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=self.hparams.lr, betas=tuple(self.hparams.betas))
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        warm = self.hparams.warmup_steps or int(round(self.hparams.warmup_ratio * total))
        return stepped_schedule(opt, warm, total, self.hparams.decay)

    # ------------------------------------------------------------------------------------------ export
    def export(self, folder: Union[str, os.PathLike], datamodule: Any,
               metadata: Optional[Dict[str, Any]] = None) -> Path:
        """Write the causal LM (``save_pretrained``, safetensors, float32) with ``id2label`` / ``label2id`` naming
        its answer tokens, the datamodule's tokenizer, and ``training.json`` with ``metadata`` to ``folder``;
        returns the folder. A folder holding an earlier export is replaced; any other non-empty path is refused."""
        tokenizer, _ = self.answer_tokens(datamodule)
        if self.model is None:
            self.build(datamodule)
        folder = fresh_export_folder(folder, EXPORT_METADATA, type(self).__name__)
        classes = [str(c) for c in datamodule.classes]
        model: Any = self.model
        model.config.id2label = {i: name for i, name in enumerate(classes)}
        model.config.label2id = {name: i for i, name in enumerate(classes)}
        model.save_pretrained(str(folder), state_dict=cpu_float32_state_dict(model))
        tokenizer.save_pretrained(str(folder))
        info = {"classes": classes, "answer_tokens": classes, "max_length": getattr(datamodule, "max_length", None),
                "datamodule": type(datamodule).__name__, "hparams": dict(self.hparams), **(metadata or {})}
        (folder / EXPORT_METADATA).write_text(json.dumps(info, indent=2, default=str) + "\n")
        return folder
