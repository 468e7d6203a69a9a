"""Where AttnLRP / CP-LRP place their rules in transformers' SigLIP towers: as in CLIP's
(:mod:`methods.families.hf_clip.rules`), except that the vision tower's rules act on the whole tower model
(its attention pooling head included)."""
from __future__ import annotations

from typing import Any

from torch import nn

from ..hf_clip.rules import CLIPTowerRules, PatchVisionRules, TokenTextRules


class SiglipVisionRules(PatchVisionRules, CLIPTowerRules):
    """The vision tower: the scope is the tower model (the pooling head is part of it)."""

    adapter: Any

    def scope(self) -> nn.Module:
        return self.adapter.tower_model


class SiglipTextRules(TokenTextRules, CLIPTowerRules):
    """The text tower, as CLIP's."""
