"""Where AttnLRP / CP-LRP place their rules in transformers' DeBERTa-v2/v3 classifiers: the defaults (norms and
activations found by type, the uniform rule's factors at ``query_proj`` / ``key_proj`` / ``value_proj``), the
word embeddings as the input embedding, and the ``ContextPooler``'s activation (built inside its ``forward``, no
submodule) under :meth:`head_rules`. How the c2p / p2c position terms are treated: ``NOTES.md``."""
from __future__ import annotations

from typing import Any

from torch import nn

from ...adapters.base import RuleMap


class DebertaRules(RuleMap):
    """The word embeddings (``get_input_embeddings()``) as the input embedding."""

    adapter: Any

    def input_embedding(self) -> nn.Module:
        return self.adapter.model.get_input_embeddings()
