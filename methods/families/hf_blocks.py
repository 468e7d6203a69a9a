"""What every Hugging Face adapter (text classifiers, both CLIP towers) does the same way: run a slice of the
encoder's layers with the mask the model itself builds, make the attention probabilities differentiable with
frozen parameters, and switch the config to eager attention for the duration of a call.

A family adapter derives from :class:`HFEncoderBlocks` (a :class:`~methods.adapters.base.ModelAdapter`) and says
where its config lives (:meth:`~HFEncoderBlocks.attention_config`), which mask its layers take
(:meth:`~HFEncoderBlocks.block_mask`) and which extra keyword arguments (:meth:`~HFEncoderBlocks.block_kwargs`).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, Optional

from torch import Tensor

from ..adapters.base import AttentionEdit, ModelAdapter, Recording, SequenceContext, TokenFlow
from ..adapters.capability import Capability
from .hf_implementation import attention_implementation
from .hf_score_edit import score_edited_attention


class HFEncoderBlocks(ModelAdapter):
    """``run_blocks`` and ``eager_attention`` of a Hugging Face encoder whose layers are called as
    ``layer(hidden, mask, **kwargs)``. The hidden states entering ``grad_from_block`` require grad, so that the
    attention probabilities (an output of ``eager_attention_forward``, not of a module whose output could be
    replaced) are differentiable even when every parameter is frozen."""

    #: the model's (or tower's) ``PretrainedConfig``
    config: Any

    #: isotropic: ``config.hidden_size`` wide, ``config.num_attention_heads`` heads
    token_flow = Capability(lambda adapter: TokenFlow(adapter, int(adapter.config.hidden_size),
                                                      int(adapter.config.num_attention_heads)))

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



class HFBaseBlocks(HFEncoderBlocks):
    """A model whose blocks live in one submodule (``base_attr``: BERT's ``bert``, a decoder's ``model``), as
    :meth:`layers_of` that submodule; ``self.base`` and ``self.blocks`` are set on construction."""

    base_attr = "?"

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.base: Any = getattr(model, self.base_attr)
        self.blocks = list(self.layers_of(self.base))

    @staticmethod
    def layers_of(base: Any) -> Any:
        raise NotImplementedError  # pragma: no cover - each family names its blocks

    @classmethod
    def depth_of(cls, model: Any) -> int:
        return len(cls.layers_of(getattr(model, cls.base_attr)))


class HFScoreEdit(AttentionEdit):
    """The blocks call their attention through ``transformers.AttentionInterface``: the scores edited through an
    attention function registered there (a family whose attention is its own code declares its own edit)."""

    adapter: "HFEncoderBlocks"

    def __call__(self, edit: Callable[[int, Tensor], Tensor]) -> contextlib.AbstractContextManager[None]:
        """The blocks' scores edited through an attention function registered with ``transformers``
        (:mod:`methods.families.hf_score_edit`) on :meth:`attention_config`."""
        return score_edited_attention(self.adapter.attention_config(), self.adapter.blocks, edit)


class HFRecording(Recording):
    """Where methods hook in a Hugging Face encoder: the eager attention, and the hidden states entering
    ``grad_from_block`` require grad (the attention probabilities are an output of ``eager_attention_forward``, not
    of a module whose output could be replaced, so they are differentiable even when every parameter is frozen).
    Each family names its modules."""

    adapter: "HFEncoderBlocks"
    score_edit: Capability[Optional[AttentionEdit]] = Capability(lambda recording: HFScoreEdit(recording.adapter))

    hidden_requires_grad = True

    @contextlib.contextmanager
    def eager_attention(self) -> Iterator[None]:
        """``_attn_implementation = "eager"`` on :meth:`attention_config` (SDPA and flash attention never
        materialise the probabilities), restored on exit; any other config (CLIP's other tower) is left alone."""
        with attention_implementation(self.adapter.attention_config(), "eager"):
            yield
