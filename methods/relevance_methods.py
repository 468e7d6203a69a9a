"""Relevance-propagation (LRP) attribution methods of Chefer et al. (2021a) on stock Transformers.

All methods run :class:`methods.lrp.LRPEngine` once per batch, with one target per sample: one forward with
hooks, at most one ``torch.autograd.grad`` for the attention gradients, one batched relevance pass that stops
as low as the method needs. The relevance starts from the one-hot target (value 1, not the logit value), the
gradients are of the pre-softmax target logit, as in ``TE:baselines/ViT/ViT_explanation_generator.py``.

Layer indices (``start_layer``) are 0-based: the index of the first block included. Rule sets: ``"ours"``
(alpha=1/beta=0 Linear, renormalised Add; used by Transformer Attribution) and ``"orig"`` (separately normalised
Linear groups, plain proportional Add; the paper's full-LRP and partial-LRP baselines); see
:mod:`methods.lrp.rules`. The reference LRP models use a final LayerNorm eps of 1e-5 (timm: 1e-6); these
methods use the model as given.
"""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from .base import AttributionMethod, check_start_layer
from .explained_output import ExplainedOutput
from .explanation_targets import explained_scores, resolve_foil
from .lrp import TOPOLOGIES, LRPEngine
from .lrp.engine import Explained
from .lrp.rules import get_rules
from .lrp.topology import INPUT_POINTS, Topology
from .readout import check_class_token_score, check_readout, is_sequence, read_out, set_class_token_score
from .registry import register_method
from .rollout import ReadoutRollout


class _LRPMethod(AttributionMethod):
    """Shared options: ``rules`` (rule set name), ``readout`` (:func:`methods.readout.read_out`; ``auto``,
    the default, is the model's own read-out: the [CLS] row, or the mean over the patch rows of an
    average-pooled model) and, for sequences, ``class_token_score``
    (:func:`methods.readout.set_class_token_score`; ``auto``: what TE's BERT code does for the method).
    ``recompute_attention`` (default ``True``): where the adapter has an ``attention_recompute`` (the decoder LMs) and
    the relevance pass goes through more than one block, each block's attention map is recomputed in a backward
    pass and held one at a time (:meth:`methods.lrp.LRPEngine.run`); ``False`` keeps every map from the forward
    (faster, same values bit for bit)."""

    default_rules = "ours"
    default_class_token_score = "zero"

    def __init__(self, rules: Optional[str] = None, readout: str = "auto", class_token_score: str = "auto",
                 recompute_attention: bool = True):
        self.rules = self.default_rules if rules is None else rules
        get_rules(self.rules)  # validate early
        self.readout = check_readout(readout)
        self.class_token_score = check_class_token_score(class_token_score)
        self.recompute_attention = bool(recompute_attention)

    def _read_out(self, matrix: Tensor, adapter, inputs, include_padding: bool = False) -> Tensor:
        return self._finish(read_out(matrix, adapter, inputs, self.readout, adapter.inputs.layout(inputs)), adapter,
                            inputs, include_padding)

    def _rollout_row(self, adapter, inputs, target, layers, row_normalize: bool, reduce, with_gradients: bool,
                     include_padding: bool = False, explained: Optional[Explained] = None) -> Tensor:
        """The read-out row of the rollout of ``reduce(layer, R_A, grad)`` ``[B, N, N]`` over ``layers``, each
        block's matrix folded into the row as soon as the relevance pass (and, ``with_gradients``, the backward
        pass it runs in) reaches it, from the last block down (:class:`methods.rollout.ReadoutRollout`; the
        engine's ``cam_reduce``): no per-block map is kept."""
        layout = adapter.inputs.layout(inputs)
        composed = ReadoutRollout(row_normalize, lambda m: read_out(m, adapter, inputs, self.readout, layout))

        def fold(layer: int, cam: Tensor, grad: Optional[Tensor]) -> None:
            composed.add(reduce(layer, cam, grad), overwrite=True)

        LRPEngine(self.rules).run(adapter, inputs, target, cam_layers=layers,
                                  grad_layers=layers if with_gradients else (), cam_reduce=fold,
                                  recompute=self.recompute_attention, explained=explained)
        return self._finish(composed.row(), adapter, inputs, include_padding)

    def _finish(self, row: Tensor, adapter, inputs, include_padding: bool) -> Tensor:
        layout = adapter.inputs.layout(inputs)
        row = set_class_token_score(row, adapter, layout, self.class_token_score, self.default_class_token_score,
                                    include_padding)
        return layout.output(row)


def _relevance_times_gradient(_layer: int, cam: Tensor, grad: Optional[Tensor]) -> Tensor:
    """``mean_h relu(grad_A * R_A)`` ``[B, N, N]``, the product in ``R_A``'s storage (the gradient is autograd's)."""
    assert grad is not None, "the layer's attention gradient (grad_layers) is needed"
    return cam.mul_(grad).clamp_(min=0).mean(dim=1)


def _positive_relevance(_layer: int, cam: Tensor, _grad: Optional[Tensor]) -> Tensor:
    """``mean_h relu(R_A)`` ``[B, N, N]`` (clamped in ``R_A``'s storage)."""
    return cam.clamp_(min=0).mean(dim=1)


@register_method("lrp")
class FullLRP(_LRPMethod):
    """Full LRP to the input pixels (Chefer et al. 2021a baseline "LRP"; ``ViT_LRP.py:324-343``,
    ``method="full"``).

    Relevance from the one-hot target through head, [CLS] selection, all blocks, the positional-embedding Add
    (its share dropped) and the patch-embedding convolution (z^B rule), summed over RGB: ``[B, H, W]``.
    ``rules="orig"`` (default, the paper's baseline, ``ViT_orig_LRP.py``) or ``"ours"``.

    Sequences (TE's BERT ``generate_full_lrp``): the relevance at the encoder input (the embedding LayerNorm's
    output; TE never propagates into the embeddings) summed over the hidden dimension: ``[B, N]`` (not a pixel
    map), with the [CLS] entry set to 0 (``class_token_score``: ``auto`` = ``zero``, or ``keep``).
    ``text_input="word_embeddings"`` continues through the embedding sum (Add rules) to the word embeddings'
    share (the position and token-type shares dropped); default ``"encoder_input"`` (the reference). Another
    value on a model whose topology has no such input point (the images) is an error naming the model.
    """

    default_rules = "orig"
    #: full LRP goes through every block down to the input, where float32 can lose about three digits on a
    #: 30-block LM (issue 36: batched vs alone 1.4e-3 of the largest score on SmolLM2 in float32, 4e-13 in
    #: float64; 3.9e-6 on the prompts of ``benchmarks/precision.py``). The default stays the model's precision (at
    #: least float32), so a float32 model's maps and every existing result are unchanged; ask for
    #: ``accumulate_dtype="float64"`` on deep models (``benchmarks/README.md``, precision section)
    accumulate_dtype = None

    def __init__(self, rules: Optional[str] = None, class_token_score: str = "auto", text_input: str = "encoder_input",
                 recompute_attention: bool = True):
        super().__init__(rules, class_token_score=class_token_score, recompute_attention=recompute_attention)
        if text_input not in INPUT_POINTS:
            raise ValueError(f"lrp: text_input must be one of {INPUT_POINTS}, got {text_input!r}")
        self.text_input = text_input

    def check_adapter(self, adapter) -> None:
        topology = TOPOLOGIES.get(type(adapter), Topology)
        if self.text_input != "encoder_input" and self.text_input not in topology.input_points:
            raise ValueError(f"{self.name}: text_input={self.text_input!r} needs a model whose LRP topology stops at "
                             f"its word embeddings (the text families); {type(adapter.model).__name__} "
                             f"({adapter.family}) has none")

    def attribute(self, adapter, inputs, target) -> Tensor:
        res = LRPEngine(self.rules, input_point=self.text_input).run(adapter, inputs, target, to_input=True,
                                                                     recompute=self.recompute_attention)
        layout = adapter.inputs.layout(inputs)
        assert res.input_relevance is not None   # to_input=True
        if is_sequence(layout):
            row = res.input_relevance.sum(dim=-1)
            return layout.output(set_class_token_score(row, adapter, layout, self.class_token_score, "zero"))
        return res.input_relevance.sum(dim=1)


@register_method("partial_lrp")
class PartialLRP(_LRPMethod):
    """Partial LRP (Voita et al. 2019 as run by Chefer et al. 2021a; ``ViT_LRP.py:371-380``, "last_layer").

    ``mean_h relu(R_A)`` of the last block, [CLS] row, patch columns, where ``R_A`` is the LRP relevance of the
    attention map (``attn_cam``, after the /2 of the matmul rule). Default ``rules="orig"`` (the paper's
    baseline). Only the last block is propagated through (down to its attention map). Sequences (TE's BERT
    ``generate_LRP_last_layer``): ``class_token_score`` ``auto`` = ``zero``.
    """

    default_rules = "orig"

    def attribute(self, adapter, inputs, target) -> Tensor:
        last = len(adapter.blocks) - 1
        res = LRPEngine(self.rules).run(adapter, inputs, target, cam_layers=[last])
        return self._read_out(res.attn_cam[last].clamp(min=0).mean(dim=1), adapter, inputs)


@register_method("transformer_attribution")
class TransformerAttribution(_LRPMethod, ExplainedOutput):
    """Transformer Attribution (Chefer et al. 2021a, Sec. 3.3 "relevance and gradient diffusion"; reference code
    ``ViT_LRP.py:357-369`` and its ``compute_rollout_attention``, ``:38-49``).

    Per block ``Abar_l = mean_h relu(grad_A_l * R_A_l)`` (gradient of the pre-softmax target logit w.r.t. the
    post-softmax attention map, times its LRP relevance ``attn_cam`` under "ours" rules; relu per head, then
    the head mean), then ``C = (Abar_{L-1} + I) ... (Abar_s + I)``, [CLS] row, patch columns.
    For global-average-pooled models (no reference) the mean over patch rows replaces the [CLS] row.

    * ``start_layer``: 0-based index of the first block included (default 0 = the reference's default; the
      TE evaluation scripts, ``generate_visualizations.py`` / ``imagenet_seg_eval.py``, call it with 1).
    * ``row_normalize``: the ViT reference does **not** row-normalise (the line is commented out,
      ``ViT_LRP.py:44-45``) — default ``False``; ``True`` divides each ``Abar_l + I`` by its row sums (as
      attention rollout and TE's BERT variant do).
    * ``rules``: default ``"ours"`` (TE's BERT pipeline too; Beyond Intuition's BERT pipeline runs the same
      function on its ``"orig"``-rules model).

    Sequences (TE ``BERT/ExplanationGenerator.py`` ``generate_LRP``): ``row_normalize=None`` (default) means
    ``True`` for token sequences (TE's BERT rollout row-normalises) and ``False`` for images; the [CLS]->[CLS]
    entry is set to the row minimum (``class_token_score``: ``auto`` = ``row_min``; Beyond Intuition's copy sets
    it to 0: ``zero``; ``keep``); the minimum is over the real positions (``include_padding=True``: over all
    ``N``, as the authors' batch-1 code does on a padded input). TE's BERT default ``start_layer=11`` is the
    last block of BERT-base (``start_layer=-1`` here); the default here stays 0.

    Streaming: only the read-out row ``read(C)`` is formed (:class:`methods.rollout.ReadoutRollout`; equal to the
    read-out of the full product up to float rounding). The relevance pass runs inside the backward pass, from
    the last block down, and each block's ``Abar_l`` is folded into the row as soon as its ``R_A`` and gradient
    are known and then dropped: at most two blocks' gradients, one block's ``R_A`` and no ``[B, N, N]`` per
    block are held; each block's recorded attention (saved by the graph and read by the relevance pass) is
    released as the pass goes through it. On the decoder LMs (adapters with an ``attention_recompute``) no block's
    attention is recorded or saved by the forward: the backward recomputes each block's probabilities from its
    saved ``q``, ``k``, ``v`` (one more eager attention per block) and the relevance pass goes through the block
    as soon as its backward is done, so one block's map is held at a time; the values are the same bit for bit.
    ``recompute_attention=False`` keeps each block's map from the forward instead (no extra attention).

    ``explain`` / ``foil`` (:mod:`methods.explanation_targets`; default ``"logit"``, the reference's): the output
    ``y`` whose gradient ``grad_A`` is, and the relevance starts from ``dy/dz`` at the logits ``z`` instead of the
    one-hot target (the same thing for the logit); e.g. ``"logit_difference"`` starts from ``e_t - e_f``.
    """

    default_class_token_score = "row_min"
    layer_options = ("start_layer",)
    #: ``row_normalize=None`` by the layout's reference code (``Layout.reference``)
    AUTO_ROW_NORMALIZE = {"vit": False, "bert": True}

    def __init__(self, start_layer: int = 0, row_normalize: Optional[bool] = None, rules: Optional[str] = None,
                 readout: str = "auto", class_token_score: str = "auto", include_padding: bool = False,
                 recompute_attention: bool = True, explain: str = "logit", foil: Optional[int] = None):
        super().__init__(rules, readout, class_token_score, recompute_attention)
        ExplainedOutput.__init__(self, explain, foil)
        self.start_layer = start_layer
        self.row_normalize = row_normalize
        self.include_padding = bool(include_padding)

    def explained(self) -> Optional[Explained]:
        """The engine's explained output (``None`` for the logit: the engine's own one-hot start)."""
        if self.explain == "logit":
            return None
        foil, explain = self.given_foil, self.explain

        def scores(logits: Tensor, target: Tensor) -> Tensor:
            return explained_scores(logits, target, explain, resolve_foil(logits, foil, explain))
        return scores

    def attribute(self, adapter, inputs, target) -> Tensor:
        start = check_start_layer(self.start_layer, adapter, self.name)
        layers = list(range(start, len(adapter.blocks)))
        normalize = self.row_normalize
        if normalize is None:
            normalize = self.AUTO_ROW_NORMALIZE[adapter.inputs.layout(inputs).reference]
        return self._rollout_row(adapter, inputs, target, layers, normalize, _relevance_times_gradient, True,
                                 self.include_padding, self.explained())


@register_method("lrp_rollout")
class LRPRollout(_LRPMethod):
    """LRP-rollout (``ViT_LRP.py:345-354``, ``method="rollout"``; not a paper baseline): rollout of
    ``mean_h relu(R_A_l)`` with the identity added and no row normalisation, [CLS] row, patch columns.
    ``start_layer`` 0-based (default 0), ``rules`` default ``"ours"`` (the reference runs it on ViT_LRP).
    Sequences: ``class_token_score`` ``auto`` = ``zero``.

    Streaming: as Transformer Attribution's (without gradients): each block's ``mean_h relu(R_A_l)`` is folded
    into the read-out row as soon as the relevance pass reaches it, from the last block down, then dropped. On
    the decoder LMs (``recompute_attention``, default ``True``) the maps come recomputed in a backward pass whose
    gradients are dropped, one block at a time, instead of being recorded by the forward."""

    layer_options = ("start_layer",)

    def __init__(self, start_layer: int = 0, row_normalize: bool = False, rules: Optional[str] = None,
                 readout: str = "auto", class_token_score: str = "auto", recompute_attention: bool = True):
        super().__init__(rules, readout, class_token_score, recompute_attention)
        self.start_layer = start_layer
        self.row_normalize = row_normalize

    def attribute(self, adapter, inputs, target) -> Tensor:
        start = check_start_layer(self.start_layer, adapter, self.name)
        layers = list(range(start, len(adapter.blocks)))
        return self._rollout_row(adapter, inputs, target, layers, self.row_normalize, _positive_relevance, False)
