"""Where AttnLRP / CP-LRP place their rules in transformers' BERT-like text classifiers: the defaults (norms and
activations found by type in the model), the word embeddings as the input embedding (LXT's ``input_embeds``), and
the functional ``tanh`` / activations of the heads under :meth:`head_rules`."""
from __future__ import annotations

from typing import Any

from torch import nn

from ...adapters.base import RuleMap


class TextRules(RuleMap):
    """The word embeddings (``get_input_embeddings()``) as the input embedding."""

    adapter: Any

    def input_embedding(self) -> nn.Module:
        return self.adapter.model.get_input_embeddings()
