"""The ``decomposes_blocks`` capability of a pre-norm family (ALTI, ALTI-Logit, DecompX, Value Zeroing's reads).

A family whose every block is ``x + attention(norm_a(x))`` then ``+ mlp(norm_b(.))``, with the two norms as
attributes of the block module, gives the capability with :class:`PreNormDecomposition` and the two attribute
names: the block's output is recorded at the block, the post-attention residual ``x + attention(...)`` as the
input of the second norm. A family with another layout (post-norm encoders, DINOv2's optional norm names, Gemma 3's
sandwich norms) overrides :meth:`~PreNormDecomposition.block_norms`.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, List, Optional, Tuple

from torch import Tensor, nn

from .recorder import ActivationRecorder


class PreNormDecomposition:
    """``decomposes_blocks`` from :attr:`block_norm_names` (before the attention, before the MLP)."""

    decomposes_blocks = True
    #: the block's attributes: the norm entering the attention, the norm entering the MLP
    block_norm_names: Tuple[str, str] = ("norm1", "norm2")
    blocks: List[Any]

    def block_norms(self, layer: int) -> Tuple[nn.Module, nn.Module]:
        """The norm entering block ``layer``'s attention, then the one entering its MLP."""
        block = self.blocks[layer]
        return getattr(block, self.block_norm_names[0]), getattr(block, self.block_norm_names[1])

    def record_block_output(self, rec: ActivationRecorder, layer: int, key: Hashable,
                            transform: Optional[Callable[[Tensor], Any]] = None) -> None:
        rec.output(self.blocks[layer], key, transform=transform)

    def record_post_attention_residual(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        """The input of the MLP's norm: ``x + attention output`` (with any layer scale)."""
        rec.input(self.block_norms(layer)[1], key)
