"""What every Hugging Face adapter (text classifiers, both CLIP towers) does the same way: run a slice of the
encoder's layers with the mask the model itself builds, make the attention probabilities differentiable with
frozen parameters, and switch the config to eager attention for the duration of a call.

A family adapter derives from :class:`HFEncoderBlocks` (a :class:`~methods.adapters.base.ModelAdapter`) and says
where its config lives (:meth:`~HFEncoderBlocks.attention_config`), which mask its layers take
(:meth:`~HFEncoderBlocks.block_mask`) and which extra keyword arguments (:meth:`~HFEncoderBlocks.block_kwargs`).
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Optional

import torch
from torch import Tensor

from .base import ModelAdapter, ModelInputs, SequenceContext


class HFEncoderBlocks(ModelAdapter):
    """``run_blocks``, ``forward`` and ``eager_attention`` of a Hugging Face encoder whose layers are called as
    ``layer(hidden, mask, **kwargs)``."""

    def attention_config(self) -> Any:
        """The ``PretrainedConfig`` whose ``_attn_implementation`` the layers read."""
        return self.model.config

    def block_mask(self, hidden: Tensor, context: SequenceContext) -> Optional[Tensor]:
        """The mask the layers take, built as the model builds it for the current attention implementation
        (``None``: no mask)."""
        return None

    def block_kwargs(self) -> Dict[str, Any]:
        """Extra keyword arguments of every layer call (CLIP's text tower: ``is_causal``)."""
        return {}

    def run_blocks(self, hidden: Tensor, context: SequenceContext, start: int = 0,
                   stop: Optional[int] = None) -> Tensor:
        blocks = self.blocks[start:stop]
        if not blocks:
            return hidden
        mask = self.block_mask(hidden, context)
        kwargs = self.block_kwargs()
        for block in blocks:
            hidden = block(hidden, mask, **kwargs)
        return hidden

    def forward(self, inputs: ModelInputs, grad_from_block: int = 0, pre_logits: bool = False) -> Tensor:
        """As :meth:`ModelAdapter.forward`; the hidden states entering block ``grad_from_block`` are made to
        require grad, so that the attention probabilities (an output of ``eager_attention_forward``, not of a
        module whose output could be replaced) are differentiable even when every parameter is frozen."""
        context = self.context(inputs)
        with torch.no_grad():
            hidden = self.run_blocks(self.embed(inputs), context, 0, grad_from_block)
        with torch.enable_grad():
            if grad_from_block < self.depth:
                hidden = hidden.detach().requires_grad_(True)
            hidden = self.run_blocks(hidden, context, grad_from_block)
            return self.head(hidden, context, pre_logits=pre_logits)

    @contextlib.contextmanager
    def eager_attention(self) -> Iterator[None]:
        """``_attn_implementation = "eager"`` on :meth:`attention_config` (SDPA and flash attention never
        materialise the probabilities), restored on exit; any other config (CLIP's other tower) is left alone."""
        config = self.attention_config()
        before = config._attn_implementation
        config._attn_implementation = "eager"
        try:
            yield
        finally:
            config._attn_implementation = before
