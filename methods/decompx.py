"""DecompX: every representation decomposed into per-input-token vectors, propagated to the class logits.

Modarressi, Fayyaz, Aghazadeh, Yaghoobzadeh & Pilehvar 2023, "DecompX: Explaining Transformers Decisions by
Propagating Token Decomposition" (ACL; reference ``mohsenfayyaz/DecompX``, its forks of transformers' BERT and
RoBERTa). The pieces come from the adapter's ``decomposition`` capability (with ``decomposes_network``); the
conventions, and where the reference departs from the paper, are in :class:`DecompX`'s docstring.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from .adapters import ActivationRecorder, MethodUndefinedError, ModelAdapter, ModelInputs, linear_weight
from .alti import head_outputs, norm_parts, out_bias
from .base import AttributionMethod
from .explanation_targets import ExplainsALogit, resolve_foil
from .input_points import check_choice
from .registry import OPT_IN, register_method
from .targets import resolve_target

#: how a bias is shared among the input tokens' vectors (the reference's ``bias_decomp_type``): ``absdot`` by
#: ``|<x_j, b>|``, ``norm`` by ``||x_j||``, ``equal`` among the nonzero vectors, ``cls`` all to position 0
BIAS_SHARES = ("absdot", "norm", "equal", "cls")
#: the MLP activation's approximation (the reference's ``FFN_approx_type``): ``gelu_zo`` the zero-origin slope
#: ``act(h) / h`` per neuron, ``gelu_la`` GELU's tangent at ``h`` (slope and intercept), ``relu`` ``[h > 0]``
FFN_APPROXIMATIONS = ("gelu_zo", "gelu_la", "relu")
#: the head activation's approximation (the reference's ``tanh_approx_type``): ``zo`` zero-origin slope, ``la``
#: the tangent
HEAD_APPROXIMATIONS = ("zo", "la")
#: the shift the reference adds to the bias weights' row sums and to the zero-origin slopes' denominators
SHIFT = 1e-12
#: the elements of one chunk of output rows of the MLP's ``[B, r, N, F]`` vectors (formed, reduced, dropped in turn)
CHUNK_ELEMENTS = 1 << 20
#: the elements of one chunk of output rows of the attention's ``[B, r, N, D]`` vectors (each chunk reads the
#: value-projected parts of every token once)
ATTENTION_CHUNK_ELEMENTS = 1 << 22


# ------------------------------------------------------------------------------------------ pieces
def share_bias(vectors: Tensor, bias: Tensor, kind: str) -> Tensor:
    """``x_ik + w_ik b`` (paper eq. 5-6): the bias ``b`` (``[D]``, or ``[B, r, D]`` one per output row) split
    among the input tokens ``j`` of ``vectors`` ``[B, r, N, D]`` by the weights of ``kind`` (:data:`BIAS_SHARES`),
    divided by their sum over ``j`` plus :data:`SHIFT` (the reference's). A zero vector (a padded input) gets no
    share but under ``cls``."""
    b = bias.view(1, 1, 1, -1) if bias.dim() == 1 else bias[:, :, None, :]
    if kind == "absdot":
        weights = (vectors @ bias if bias.dim() == 1 else torch.einsum("brjd,brd->brj", vectors, bias)).abs()
    elif kind == "norm":
        weights = vectors.norm(dim=-1)
    elif kind == "equal":
        weights = (vectors.norm(dim=-1) != 0).to(vectors.dtype)
    else:
        weights = torch.zeros(vectors.shape[:-1], dtype=vectors.dtype, device=vectors.device)
        weights[..., 0] = 1.0
    weights = weights / (weights.sum(-1, keepdim=True) + SHIFT)
    return vectors + weights[..., None] * b


def gelu_tangent(pre: Tensor, post: Tensor) -> Tuple[Tensor, Tensor]:
    """``(slope, intercept)`` of the exact (erf) GELU's tangent at ``pre``, the intercept from the model's own
    activation ``post``: the reference's ``gelu_linear_approximation``."""
    cdf = (1 + torch.erf(pre / math.sqrt(2))) / 2
    pdf = torch.exp(-pre.pow(2) / 2) / math.sqrt(2 * math.pi)
    slope = cdf + pre * pdf
    return slope, post - slope * pre


def activation_tangent(activation: Any, pre: Tensor, post: Tensor) -> Tuple[Tensor, Tensor]:
    """``(slope, intercept)`` of an element-wise ``activation``'s tangent at ``pre`` (its derivative by autograd;
    ``tanh``: ``1 - tanh(x)^2`` as the reference's ``tanh_linear_approximation``)."""
    with torch.enable_grad():
        x = pre.detach().clone().requires_grad_(True)
        slope, = torch.autograd.grad(activation(x).sum(), x)
    return slope, post - slope * pre


def through_activation(vectors: Tensor, pre: Tensor, post: Tensor, approximation: str, share: str,
                       activation: Any = None) -> Tensor:
    """The element-wise activation ``post = act(pre)`` (``[B, r, F]``) applied to the input tokens' parts
    ``vectors`` ``[B, r, N, F]`` of ``pre`` by a per-neuron linear map: zero-origin slope ``post / (pre + 1e-12)``
    (``*_zo``), ReLU's mask (``relu``), or a tangent whose intercept is shared as a bias (``gelu_la``: GELU's;
    ``la``: ``activation``'s, by autograd)."""
    if approximation.endswith("zo"):
        return vectors * (post / (pre + SHIFT))[:, :, None]
    if approximation == "relu":
        return vectors * (pre > 0).to(vectors.dtype)[:, :, None]
    slope, intercept = gelu_tangent(pre, post) if approximation == "gelu_la" else \
        activation_tangent(activation, pre, post)
    return share_bias(vectors * slope[:, :, None], intercept, share)


def value_projected(state: Tensor, value: Any, heads: int) -> Tensor:
    """Every token's parts ``[B, S, J, D]`` through the value projection's weight (no bias), head by head:
    ``[B, H, S, J * Dh]``, laid out for one matrix product with each head's attention rows."""
    weight = linear_weight(value)                                                          # [H * Dh, D]
    batch, n, parts, _ = state.shape
    out = state.new_empty(batch, heads, n, parts, weight.shape[0] // heads)
    for head, rows in enumerate(weight.chunk(heads, 0)):
        out[:, head] = torch.matmul(state, rows.t())
    return out.flatten(-2)


def through_linear(vectors: Tensor, layer: Any, include_biases: bool, share: str) -> Tensor:
    """``W x_j`` for every input token's part (``[B, r, N, D_in]`` -> ``[B, r, N, D_out]``), the layer's bias
    shared (:func:`share_bias`) or left out."""
    out = torch.einsum("brjd,ed->brje", vectors, linear_weight(layer))
    bias = getattr(layer, "bias", None)
    return share_bias(out, bias, share) if include_biases and bias is not None else out


def through_layer_norm(vectors: Tensor, states: Tensor, norm: nn.Module, include_biases: bool, share: str,
                       name: str) -> Tensor:
    """A LayerNorm applied to the parts ``x_j`` of its input ``states`` ``[B, r, D]`` (paper eq. 8):
    ``gamma * (x_j - mean(x_j)) / sqrt(var(states) + eps)``, the scale of the whole input (the reference's
    ``ln_decomposer``: exact, since the parts sum to ``states``), ``beta`` shared."""
    centred, weight, bias, eps = norm_parts(norm, name)
    if not centred:
        raise MethodUndefinedError(f"{name}: DecompX decomposes LayerNorms; {type(norm).__name__} is an RMSNorm")
    scale = torch.rsqrt(states.var(-1, unbiased=False) + eps)[:, :, None, None]
    out = (vectors - vectors.mean(-1, keepdim=True)) * scale * weight
    return share_bias(out, bias, share) if include_biases and bias is not None else out


# ------------------------------------------------------------------------------------------ the propagation
class _Propagation:
    """Records what one forward needs per block and folds each block into the decomposed hidden states as soon as
    the block has run (a hook on its output): ``state`` ``[B, N, N, D]`` (output row ``i``, input token ``j``)
    holds one block's vectors at a time, overwritten row by row; with the value-projected copy of it that the
    attention mixes, two such tensors are held, plus one chunk of rows' MLP vectors (:data:`CHUNK_ELEMENTS`).
    The last block forms only the read-out row."""

    def __init__(self, method: "DecompX", adapter: ModelAdapter):
        self.method, self.adapter = method, adapter
        assert adapter.decomposition is not None, "check_adapter refuses a family that does not decompose its blocks"
        self.decomposition = adapter.decomposition
        self.state: Optional[Tensor] = None

    def record(self, rec: ActivationRecorder) -> None:
        adapter = self.adapter
        adapter.recording.block_input(rec, 0, "x")
        adapter.recording.values(rec, 0, "values")
        for layer in range(len(adapter.blocks)):
            up, down = adapter.linears(layer).mlp
            adapter.recording.attention(rec, layer, ("attention", layer))
            self.decomposition.record_post_attention_residual(rec, layer, ("residual", layer))
            rec.output(up, ("pre", layer))
            rec.input(down, ("post", layer))
            rec.input(self.decomposition.block_norms(layer)[1], ("ln2", layer))
            self.decomposition.record_block_output(rec, layer, ("out", layer), transform=self.folder(rec, layer))
        head = self.decomposition.head_layers()
        rec.output(head.first, "head_pre")
        rec.input(head.last, "head_post")

    def folder(self, rec: ActivationRecorder, layer: int) -> Any:
        def fold(output: Tensor) -> None:
            pieces = {k: rec.outputs.pop((k, layer)) for k in ("attention", "residual", "pre", "post", "ln2")}
            if layer == 0:
                pieces.update(x=rec.outputs.pop("x"), values=rec.outputs.pop("values"))
            self.state = self.block(layer, pieces)
        return fold

    def block(self, layer: int, pieces: Dict[str, Tensor]) -> Tensor:
        """Block ``layer``'s output decomposed (paper §3, eq. 4-12): attention with its value path and the
        residual, the bias of the value and output projections shared, LN1, the MLP, LN2; a chunk of output rows
        at a time (the last block: the read-out row alone)."""
        attention = pieces["attention"]
        batch, heads, n = attention.shape[0], attention.shape[1], attention.shape[2]
        linears = self.adapter.linears(layer).attention
        out_proj = linears.out
        state = self.state
        if state is None:
            # block 0: each token's own input vector; its value vectors (bias included) through the heads
            moved = head_outputs(pieces["values"], out_proj, heads)                       # [B, H, N, D]
            bias = out_bias(out_proj, pieces["x"])
        else:
            value = linears.v
            assert value is not None  # the text encoders have separate projections
            # every token's parts through the value projection (its bias is shared below)
            mixable = value_projected(state, value, heads)                              # [B, H, S, J * Dh]
            bias = out_bias(out_proj, state)
            value_bias = getattr(value, "bias", None)
            if value_bias is not None:
                bias = bias + linear_weight(out_proj) @ value_bias.to(bias)
        out_weight = linear_weight(out_proj).unflatten(1, (heads, -1))                     # [D, H, Dh]
        rows_total = 1 if layer == len(self.adapter.blocks) - 1 else n
        width = pieces["residual"].shape[-1]
        mlp_step = max(1, CHUNK_ELEMENTS // (batch * n * max(width, pieces["pre"].shape[-1])))
        attention_step = max(mlp_step, ATTENTION_CHUNK_ELEMENTS // (batch * n * width))
        # the new rows overwrite the old ones, which only their own rows' residual reads once ``mixable`` is formed
        # (the read-out row of the last block goes to a tensor of its own)
        result = pieces["residual"].new_empty(batch, rows_total, n, width) if state is None or rows_total < n \
            else state
        for start in range(0, rows_total, attention_step):
            stop = min(rows_total, start + attention_step)
            if state is None:
                vectors = torch.einsum("bhij,bhjd->bijd", attention[:, :, start:stop], moved)
                vectors.diagonal(offset=start, dim1=1, dim2=2).add_(pieces["x"][:, start:stop].transpose(1, 2))
            else:
                mixed = torch.matmul(attention[:, :, start:stop], mixable).unflatten(-1, (n, -1))
                vectors = torch.einsum("bhijz,dhz->bijd", mixed, out_weight) + state[:, start:stop]
                del mixed
            for first in range(start, stop, mlp_step):
                last = min(stop, first + mlp_step)
                result[:, first:last] = self.rows_after_attention(
                    layer, vectors[:, first - start:last - start], bias, pieces, slice(first, last))
        return result

    def rows_after_attention(self, layer: int, vectors: Tensor, bias: Tensor, pieces: Dict[str, Tensor],
                             rows: slice) -> Tensor:
        method, adapter = self.method, self.adapter
        share, biases = method.bias_decomposition, method.include_biases
        if biases:
            vectors = share_bias(vectors, bias, share)
        first_norm, second_norm = self.decomposition.block_norms(layer)
        vectors = through_layer_norm(vectors, pieces["residual"][:, rows], first_norm, biases, share, method.name)
        up, down = adapter.linears(layer).mlp
        hidden = through_linear(vectors, up, biases, share)
        hidden = through_activation(hidden, pieces["pre"][:, rows], pieces["post"][:, rows],
                                    method.ffn_approximation, share)
        vectors = vectors + through_linear(hidden, down, biases, share)
        return through_layer_norm(vectors, pieces["ln2"][:, rows], second_norm, biases, share, method.name)

    def head(self, rec: ActivationRecorder) -> Tensor:
        """The read-out row's parts through the head (paper §3.4, eq. 13-14): ``[B, N, C]``, each input token's part of
        each logit."""
        method = self.method
        assert self.state is not None, "the blocks have run"
        layers = self.decomposition.head_layers()
        share, biases = method.bias_decomposition, method.include_biases
        vectors = through_linear(self.state, layers.first, biases, share)                     # [B, 1, N, D']
        vectors = through_activation(vectors, rec["head_pre"][:, None], rec["head_post"][:, None],
                                     method.head_approximation, share, layers.activation)
        return through_linear(vectors, layers.last, biases, share)[:, 0]


@register_method("decompx")
class DecompX(ExplainsALogit, AttributionMethod):
    """DecompX (Modarressi et al. 2023, §3, eq. 2-14; ``mohsenfayyaz/DecompX`` ``src/modeling_bert.py``).

    Every hidden state is kept as one vector per input token, ``x_i = sum_k x_i<=k``, from the first block's input
    (token ``k``'s own embedding at ``i = k``) through each block: attention ``sum_h sum_j A^h_ij x_j<=k W^h_Att``
    plus the residual (eq. 4-7; block 0 moves the value bias with the attention, footnote 4), LayerNorm with the
    scale of the whole input (eq. 8, exact), the MLP with its activation as the zero-origin line
    ``theta = act(z) / z`` per neuron (eq. 10-11), the second LayerNorm (eq. 12); then the [CLS] row through the
    head (pooler and classifier, eq. 13) to each token's part of each logit (eq. 14). Each bias is shared among
    the tokens by AbsDot (eq. 5) or ``bias_decomposition`` (:data:`BIAS_SHARES`), so the parts sum to the logit.
    The map: the target's column (``explain="logit"``; minus the foil's with ``logit_difference``), [CLS] and
    [SEP] included, padding 0. Options (defaults: the reference's demo configuration): ``include_biases``
    (``False``: the paper's NoBias), ``ffn_approximation`` (:data:`FFN_APPROXIMATIONS`, ``gelu_zo``),
    ``head_approximation`` (``zo``). The reference beyond the paper: the tangent (``*_la``) and ReLU options,
    whose intercepts are shared even under NoBias; ``1e-12`` added to the slopes' and the shares' denominators.
    Not implemented: its ``include_bias_token``, ``abssim`` / ``dot`` shares and norm-based ``rollout``.
    """

    tags = ("decomposition", OPT_IN)

    def __init__(self, include_biases: bool = True, bias_decomposition: str = "absdot",
                 ffn_approximation: str = "gelu_zo", head_approximation: str = "zo", explain: str = "logit"):
        if not isinstance(include_biases, bool):
            raise ValueError(f"include_biases must be True or False, got {include_biases!r}")
        self.include_biases = include_biases
        self.bias_decomposition = check_choice(bias_decomposition, BIAS_SHARES, "bias_decomposition", "decompx")
        self.ffn_approximation = check_choice(ffn_approximation, FFN_APPROXIMATIONS, "ffn_approximation", "decompx")
        self.head_approximation = check_choice(head_approximation, HEAD_APPROXIMATIONS, "head_approximation",
                                               "decompx")
        self.set_logit_explain(explain, "decompx")

    def check_adapter(self, adapter: ModelAdapter) -> None:
        super().check_adapter(adapter)
        decomposition = adapter.decomposition
        if decomposition is None or not decomposition.decomposes_network or decomposition.pre_norm:
            raise MethodUndefinedError(
                f"{self.name}: {type(adapter.model).__name__} ({adapter.family}) does not decompose its whole network "
                "(adapter.decomposition.decomposes_network: post-norm blocks with an element-wise MLP, a head of two "
                "linear layers read at position 0)")

    def attribute(self, adapter: ModelAdapter, inputs: ModelInputs, target: Any) -> Tensor:
        propagation = _Propagation(self, adapter)
        with ActivationRecorder() as rec, torch.no_grad():
            propagation.record(rec)
            logits = adapter.forward(inputs, grad_from_block=len(adapter.blocks))
            contributions = propagation.head(rec)                                             # [B, N, C]
        target = resolve_target(logits, target).to(contributions.device)
        rows = torch.arange(inputs.batch_size, device=contributions.device)
        scores = contributions[rows, :, target]
        foil = resolve_foil(logits, self.call_foil, self.explain)
        if foil is not None:
            scores = scores - contributions[rows, :, foil.to(contributions.device)]
        return adapter.inputs.layout(inputs).output(scores.to(inputs.score_dtype))
