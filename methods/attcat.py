"""AttCAT: attentive class activation tokens (Qiang et al., NeurIPS 2022).

Reference: qiangyao1988/AttCAT, ``BERT_explainability/modules/BERT/ExplanationGenerator.py::generate_TransCAM``
(commit 441262f), which this module follows where it departs from the paper (the mean over query rows of the
attention, the block inputs ``output_hidden_states[l]`` and their total gradients).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import Tensor

from .adapters import ActivationRecorder
from .base import check_start_layer
from .explained_output import ExplainedOutput
from .explanation_targets import explained_scores
from .registry import OPT_IN, register_method
from .rollout import carry_to_readout_space

#: which query rows a mean over rows reads (:func:`real_query_rows`)
QUERY_ROWS = ("real", "all")


def mean_over_query_rows(matrix: Tensor, rows: Optional[Tensor]) -> Tensor:
    """``[B, N]``: the mean of ``matrix`` ``[B, N, N]`` (query rows, key columns) over the query rows ``rows``
    (bool ``[B, N]``, the real tokens of a padded batch; ``None``: every row)."""
    if rows is None:
        return matrix.mean(dim=-2)
    weights = rows.to(device=matrix.device, dtype=matrix.dtype)
    return (weights[:, :, None] * matrix).sum(dim=-2) / weights.sum(dim=-1, keepdim=True)


def real_query_rows(layout, inputs, query_rows: str) -> Optional[Tensor]:
    """The query rows a mean over rows reads: the real tokens of a padded batch (``query_rows="real"``), else
    ``None`` (every row: images, or ``"all"`` as the batch-1 reference code reads a padded input)."""
    if not layout.has_padding or query_rows == "all":
        return None
    like = torch.empty(inputs.batch_size, layout.num_positions, dtype=inputs.score_dtype, device=inputs.device)
    return layout.real_positions(like)


@register_method("attcat")
class AttCAT(ExplainedOutput):
    """AttCAT (Qiang et al. 2022, Eqs. 6-8): ``S_j = Σ_{l >= start} α^l_j Σ_d h^l_jd ∂y/∂h^l_jd``.

    ``h^l``: the residual stream entering block ``l`` (``output_hidden_states[l]``: the embedding output for
    block 0), ``∂y/∂h^l`` its total gradient (one forward, one backward); ``α^l_j``: block ``l``'s post-softmax
    attention, mean over heads, then mean over the query rows: the attention token ``j`` receives (the code's
    ``att.mean(0).mean(0)``). Signed, not normalised, no [CLS]/[SEP] zeroing, every position reported (padding 0).
    ``y``: the explained output (``explain``, default the target's logit as the code's one-hot product).
    ``query_rows="real"`` (default) averages over the real tokens only, so a padded row equals the row alone; the
    code runs batch 1 (``"all"``: every row, padding included, as that code would on a padded input).
    ``start_layer`` (0-based; the code: 0). Blocks in another token space than the read-out's (Swin) carry
    their scores up through the transitions (each token the sum of its sources) before the sum.
    """

    tags = ("transformer_2022", "gradient", OPT_IN)
    layer_options = ("start_layer",)

    def __init__(self, start_layer: int = 0, query_rows: str = "real", explain: str = "logit",
                 foil: Optional[int] = None):
        super().__init__(explain, foil)
        if query_rows not in QUERY_ROWS:
            raise ValueError(f"attcat: query_rows must be one of {QUERY_ROWS}, got {query_rows!r}")
        self.start_layer = start_layer
        self.query_rows = query_rows

    def attribute(self, adapter, inputs, target):
        start = check_start_layer(self.start_layer, adapter, self.name)
        layout = adapter.inputs.layout(inputs)
        layers = range(start, len(adapter.blocks))
        rows = real_query_rows(layout, inputs, self.query_rows)
        received: Dict[int, Tensor] = {}
        with ActivationRecorder() as rec:
            for layer in layers:
                adapter.recording.block_input(rec, layer, ("h", layer), require_grad=True)
                adapter.recording.attention(rec, layer, ("a", layer),
                                         transform=lambda a: mean_over_query_rows(a.detach().mean(dim=1), rows))
            logits = adapter.forward(inputs, grad_from_block=start)
            hidden = [rec[("h", layer)] for layer in layers]
            received = {layer: rec[("a", layer)] for layer in layers}
        target, foil = self.resolve(logits, target)
        grads = torch.autograd.grad(explained_scores(logits, target, self.explain, foil).sum(), hidden)
        total: Optional[Tensor] = None
        for layer, h, grad in zip(layers, hidden, grads):
            cam = (h.detach() * grad).sum(dim=-1) * received[layer].to(grad.dtype)
            cam = carry_to_readout_space(adapter, cam, layer)
            total = cam if total is None else total + cam
        assert total is not None, "at least one block"
        return layout.output(total)
