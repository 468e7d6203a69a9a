"""The attention implementation a ``transformers`` config is switched to for the duration of a call: the eager
one (the probabilities materialised), or one of this package's own functions registered under a name of its own
through ``transformers.AttentionInterface`` (score edits, recomputed attention, ViT's materialised softmax)."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional


@contextlib.contextmanager
def attention_implementation(config: Any, name: str, attention: Optional[Callable[..., Any]] = None,
                             eager_masks: bool = False) -> Iterator[None]:
    """Within it ``config._attn_implementation`` is ``name``, restored on exit. ``attention``: the function first
    registered under ``name`` (``None``: a name transformers knows, ``"eager"``); ``eager_masks``: the eager mask
    function registered under ``name`` too (``AttentionMaskInterface``), for the masks the model builds."""
    if attention is not None:
        from transformers import AttentionInterface

        AttentionInterface.register(name, attention)
    if eager_masks:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before
