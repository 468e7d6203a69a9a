"""ALTI and ALTI-Logit: norm-based decompositions of each block's attention sub-layer into per-token vectors.

Ferrando, Gallego & Costa-jussa 2022, "Measuring the Mixing of Contextual Information in the Transformer" (EMNLP;
reference ``mt-upc/transformer-contributions``) and Ferrando, Gallego, Tsiamas & Costa-jussa 2023, "Explaining How
Transformers Use Context to Build Predictions" (ACL; reference ``mt-upc/logit-explanations``). The block pieces
come from the adapter's ``decomposition`` capability; conventions and the references' departures from the
papers are listed in each class and in ``docs/alti_notes.md``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from .adapters import ActivationRecorder, MethodUndefinedError, ModelAdapter, ModelInputs, linear_weight
from .base import AttributionMethod
from .explanation_targets import ExplainsALogit, explained_score, resolve_foil
from .readout import read_out
from .registry import OPT_IN, register_method
from .rollout import row_times
from .targets import resolve_target

#: the LayerNorm scale of a decomposed LayerNorm: ``shifted_std`` ``1 / std(x + eps)`` with the population std
#: (the ALTI repository since its 2023-03 fix; the shift cancels, so ``eps`` drops out), ``exact`` the module's
#: ``1 / sqrt(var(x) + eps)``
LN_SCALES = ("shifted_std", "exact")


# ------------------------------------------------------------------------------------------ norms
def norm_parts(norm: nn.Module, name: str) -> Tuple[bool, Tensor, Optional[Tensor], float]:
    """``(centred, weight, bias, eps)`` of a LayerNorm (centred) or an RMSNorm (not centred, no bias; the Gemma
    families' ``GemmaRMSNorm`` / ``Gemma3RMSNorm`` multiply by ``1 + weight``, returned as the weight);
    :class:`MethodUndefinedError` naming the class for any other norm."""
    if isinstance(norm, nn.LayerNorm) and norm.weight is not None:
        return True, norm.weight, norm.bias, float(norm.eps)
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    weight = getattr(norm, "weight", None)
    if type(norm).__name__.endswith("RMSNorm") and isinstance(weight, Tensor) and eps is not None:
        return False, 1 + weight if type(norm).__name__.startswith("Gemma") else weight, None, float(eps)
    raise MethodUndefinedError(f"{name}: the norm {type(norm).__name__} is neither a LayerNorm with a weight nor "
                               "an RMSNorm; its decomposition is not defined here")


def norm_scale(states: Tensor, norm: nn.Module, convention: str, name: str) -> Tensor:
    """The per-token factor ``[...]`` by which ``norm`` divides its (centred) input ``states`` ``[..., D]``:
    a LayerNorm's by ``convention`` (:data:`LN_SCALES`), an RMSNorm's ``1 / sqrt(mean(x^2) + eps)``."""
    centred, _, _, eps = norm_parts(norm, name)
    if not centred:
        return torch.rsqrt(states.pow(2).mean(-1) + eps)
    if convention == "shifted_std":
        return 1 / (states + eps).std(-1, unbiased=False)
    return torch.rsqrt(states.var(-1, unbiased=False) + eps)


def centre(x: Tensor, centred: bool) -> Tensor:
    """``x`` minus its mean over the last dimension where the norm centres its input."""
    return x - x.mean(-1, keepdim=True) if centred else x


# ------------------------------------------------------------------------------------------ one block
def head_outputs(values: Tensor, out_proj: Any, heads: int, out_scale: Optional[Tensor] = None) -> Tensor:
    """``v_j^h W_O^h`` ``[B, H, N, D]``: each head's value vectors (bias included) through its slice of the
    output projection (times the layer scale ``out_scale`` ``[D]`` where the block has one)."""
    weight = linear_weight(out_proj)                        # [D, H * Dh]
    if out_scale is not None:
        weight = out_scale.to(weight)[:, None] * weight
    return torch.einsum("bjhz,dhz->bhjd", values.unflatten(-1, (heads, -1)), weight.unflatten(1, (heads, -1)))


def out_bias(out_proj: Any, like: Tensor, out_scale: Optional[Tensor] = None) -> Tensor:
    """The output projection's bias ``[D]`` (0 without one), times the layer scale ``out_scale``."""
    bias = getattr(out_proj, "bias", None)
    bias = torch.zeros(like.shape[-1], dtype=like.dtype, device=like.device) if bias is None else bias.to(like)
    return bias if out_scale is None else bias * out_scale.to(like)


#: the elements of one chunk of query rows of the ``[B, N, N, D]`` vectors (formed, reduced and dropped in turn)
CHUNK_ELEMENTS = 1 << 21


#: a norm inside the attention sub-layer: ``(module, where, its input states [B, N, width])`` (where:
#: ``BlockDecomposition.attention_output_norm``'s ``"before_proj"`` or ``"after_proj"``)
InnerNorm = Tuple[nn.Module, str, Tensor]


def inner_norm_terms(attention: Tensor, heads: Tensor, bias: Tensor, values: Tensor, out_weight: Tensor,
                     inner: InnerNorm, convention: str, name: str) -> Tuple[Tensor, Tensor, Tensor]:
    """``(A', U', b')`` through a norm inside the attention sub-layer, linearised per token as ALTI linearises a
    LayerNorm: ``N(z_i) = (z_i - mean z_i) * w * s_i + beta`` with ``s_i`` the scale of token ``i``'s own input
    (:func:`norm_scale`, ``convention``), so ``s_i`` goes on the rows of ``A``. ``"before_proj"`` (``z_i`` the
    merged heads ``concat_h sum_j A^h_ij v^h_j``): ``U'^h_j = W_O (w * centre(P_h v^h_j))``, ``P_h`` placing head
    ``h``'s slice in the width, ``b' = W_O beta + b_O``; ``"after_proj"`` (``z_i = o_i``, the projection's output):
    ``U'^h_j = centre(U^h_j) * w``, ``b'_i = s_i centre(b_O) w + beta``. ``out_weight``: ``W_O`` ``[D, H * Dh]``
    with the layer scale folded in, ``heads``: ``U`` from it."""
    norm, where, states = inner
    centred, weight, norm_bias, _ = norm_parts(norm, name)
    scale = norm_scale(states, norm, convention, name)[:, :, None]                        # [B, N, 1]
    if where == "before_proj":
        weight = weight.to(values)
        per_head = values.unflatten(-1, (attention.shape[1], -1))                          # [B, N, H, Dh]
        heads = torch.einsum("bjhz,dhz->bhjd", (values * weight).unflatten(-1, (attention.shape[1], -1)),
                             out_weight.unflatten(1, (attention.shape[1], -1)))
        if centred:
            heads = heads - (per_head.sum(-1) / values.shape[-1]).transpose(1, 2)[..., None] * (out_weight @ weight)
        shift = bias if norm_bias is None else bias + out_weight @ norm_bias.to(values)
        return attention * scale[:, None], heads, shift.expand(*scale.shape[:2], -1)
    if where == "after_proj":
        shift = scale * centre(bias, centred) * weight
        return (attention * scale[:, None], centre(heads, centred) * weight,
                shift if norm_bias is None else shift + norm_bias)
    raise ValueError(f"{name}: a norm inside the attention sits 'before_proj' or 'after_proj', got {where!r}")


def decomposition_terms(x: Tensor, attention: Tensor, values: Tensor, out_proj: Any, post_norm: Optional[nn.Module],
                        residual_sum: Tensor, convention: str, name: str, out_scale: Optional[Tensor] = None,
                        inner: Optional[InnerNorm] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(A', U', x', b')`` of one block: ``T_i(x_j) = sum_h A'^h_ij U'^h_j + [i = j] x'_i`` and
    ``y_i = sum_j T_i(x_j) + b'_i`` (Ferrando et al. 2022, eq. 7-8). ``U^h_j = v_j^h W_O^h`` (values with their bias);
    pre-norm: ``A' = A``, ``U' = U``, ``x' = x``, ``b' = b_O``. Post-norm (``post_norm``, a LayerNorm after the
    residual sum ``residual_sum``): its linear part ``(z - mean z) * gamma * s_i`` (``s_i`` by ``convention``,
    :func:`norm_scale`) moved inside the linear sums: centring and ``gamma`` on ``U`` and ``x``, ``s_i`` on the rows
    of ``A`` and on ``x'``; ``b' = s_i (b_O - mean b_O) gamma + beta``. With the exact scale ``y_i`` is the
    LayerNorm's output (post-norm) or the residual sum (pre-norm). ``out_scale``: a layer scale ``[D]`` on the
    attention output before the residual sum (ViTs, open_clip), folded into ``W_O`` and ``b_O``. ``inner``: a
    norm inside a pre-norm block's attention sub-layer (:func:`inner_norm_terms`)."""
    bias = out_bias(out_proj, x, out_scale)
    heads = head_outputs(values, out_proj, attention.shape[1], out_scale)
    if inner is not None:
        if post_norm is not None or (out_scale is not None and inner[1] == "after_proj"):
            raise MethodUndefinedError(f"{name}: a norm inside the attention is decomposed in a pre-norm block "
                                       "without a layer scale after it only")
        weight = linear_weight(out_proj)
        weight = weight if out_scale is None else out_scale.to(weight)[:, None] * weight
        attention, heads, shift = inner_norm_terms(attention, heads, bias, values, weight, inner, convention, name)
        return attention, heads, x, shift
    if post_norm is None:
        return attention, heads, x, bias.expand_as(x)
    centred, weight, norm_bias, _ = norm_parts(post_norm, name)
    scale = norm_scale(residual_sum, post_norm, convention, name)[:, :, None]       # [B, N, 1]
    shift = scale * centre(bias, centred) * weight
    return (attention * scale[:, None], centre(heads, centred) * weight, centre(x, centred) * weight * scale,
            shift if norm_bias is None else shift + norm_bias)


def row_vectors(terms: Tuple[Tensor, Tensor, Tensor, Tensor], start: int, stop: int) -> Tuple[Tensor, Tensor]:
    """``(T, y)`` of the query rows ``start:stop``: ``[B, r, N, D]`` and ``[B, r, D]`` (:func:`decomposition_terms`)."""
    attention, heads, x, shift = terms
    vectors = torch.einsum("bhij,bhjd->bijd", attention[:, :, start:stop], heads)
    vectors.diagonal(offset=start, dim1=1, dim2=2).add_(x[:, start:stop].transpose(1, 2))
    return vectors, vectors.sum(2) + shift[:, start:stop]


def decomposed_vectors(x: Tensor, attention: Tensor, values: Tensor, out_proj: Any, post_norm: Optional[nn.Module],
                       residual_sum: Tensor, convention: str, name: str, out_scale: Optional[Tensor] = None,
                       inner: Optional[InnerNorm] = None) -> Tuple[Tensor, Tensor]:
    """``(T, y)``: the transformed vectors ``T_i(x_j)`` ``[B, N, N, D]`` and the resultants ``y_i`` ``[B, N, D]`` of
    one block, every row at once (:func:`decomposition_terms`)."""
    terms = decomposition_terms(x, attention, values, out_proj, post_norm, residual_sum, convention, name, out_scale,
                                inner)
    return row_vectors(terms, 0, x.shape[1])


def contributions_of(terms: Tuple[Tensor, Tensor, Tensor, Tensor], real: Tensor, distance_eps: float,
                     rows: Optional[Tensor] = None) -> Tensor:
    """ALTI's normalised contributions ``C`` ``[B, N, N]`` of one block from its :func:`decomposition_terms`
    (Ferrando et al. 2022, eq. 9-10): ``c_ij = max(0, ||y_i||_1 - ||T_i(x_j) - y_i + eps||_1)`` (``eps``:
    ``distance_eps``, the shift torch's ``pairwise_distance`` adds, as the reference calls it), 0 at padded columns
    (``real`` ``[B, N]``), divided by its row sum; padded rows are 0 (``rows`` ``[B, N]``: the query rows kept,
    default ``real``; a read-out position on padding, SigLIP's last token, keeps its row). The vectors are formed
    and reduced a chunk of query rows at a time (:data:`CHUNK_ELEMENTS` per sample), so that no block's whole
    ``[B, N, N, D]`` tensor is held."""
    x = terms[2]
    batch, n, width = x.shape
    step = max(1, CHUNK_ELEMENTS // (n * width))
    proximity = x.new_empty(batch, n, n)
    for b in range(batch):          # one sample at a time: a chunk stays CHUNK_ELEMENTS whatever the batch
        sample = (terms[0][b:b + 1], terms[1][b:b + 1], terms[2][b:b + 1], terms[3][b:b + 1])
        for start in range(0, n, step):
            vectors, resultant = row_vectors(sample, start, min(n, start + step))
            # ||T - y + eps||_1 = ||T - (y - eps)||_1, in place and element-wise (a sample's numbers never depend
            # on its batch: a row whose every c_ij is near 0 turns rounding into shares)
            distance = vectors.sub_((resultant - distance_eps)[:, :, None]).abs_().sum(-1)
            proximity[b, start:start + distance.shape[1]] = resultant.abs().sum(-1)[0, :, None] - distance[0]
            del vectors
    contributions = proximity.clamp_min(0)
    real_f = real.to(contributions.dtype)
    contributions = contributions * real_f[:, None, :]
    totals = contributions.sum(-1, keepdim=True)
    contributions = contributions / torch.where(totals > 0, totals, torch.ones_like(totals))
    return contributions * (real if rows is None else rows).to(contributions.dtype)[:, :, None]


class _BlockDecomposition:
    """Records what one forward needs per block (input, attention, values, post-attention residual) and folds
    each block into its ``[B, N, N]`` contributions as soon as the block has run (a hook on its output), so that
    one block's ``[B, N, N, D]`` vectors exist at a time. ``also(layer, pieces)``: an extra per-block reduction
    of the same pieces (ALTI-Logit's read-out row), kept in :attr:`extra`."""

    def __init__(self, method: "_AltiBase", adapter: ModelAdapter, real: Tensor,
                 also: Optional[Callable[[int, Dict[str, Tensor]], Tensor]] = None, rows: Optional[Tensor] = None):
        self.method, self.adapter, self.real, self.also, self.rows = method, adapter, real, also, rows
        assert adapter.decomposition is not None, "check_adapter refuses a family that does not decompose its blocks"
        self.decomposition = adapter.decomposition
        self.contributions: List[Tensor] = []
        self.extra: List[Tensor] = []
        self.last_output: Optional[Tensor] = None
        self.normed: Optional[Tensor] = None

    def run(self, inputs: ModelInputs, head_gradient: bool = False) -> Tensor:
        """The model's logits; with ``head_gradient`` the final norm's output is recorded as a point to
        differentiate the head to (:attr:`normed`; autograd only from there on)."""
        adapter = self.adapter
        with ActivationRecorder() as rec, torch.no_grad():
            for layer in range(len(adapter.blocks)):
                adapter.recording.block_input(rec, layer, ("x", layer))
                adapter.recording.attention(rec, layer, ("attention", layer))
                adapter.recording.values(rec, layer, ("values", layer))
                self.decomposition.record_post_attention_residual(rec, layer, ("residual", layer))
                inner = self.decomposition.attention_output_norm(layer)
                if inner is not None:
                    rec.input(inner[0], ("inner", layer))
                self.decomposition.record_block_output(rec, layer, ("out", layer), transform=self.folder(rec, layer))
            if head_gradient:
                assert adapter.decoder is not None, "check_adapter refuses a family that is no decoder"
                rec.output(adapter.decoder.final_norm(), "normed", require_grad=True)
            logits = adapter.forward(inputs, grad_from_block=len(adapter.blocks))
            self.normed = rec.outputs.get("normed")
        return logits

    def terms(self, layer: int, pieces: Dict[str, Tensor]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """:func:`decomposition_terms` of block ``layer`` from its recorded ``pieces``."""
        adapter, method = self.adapter, self.method
        post_norm = None if self.decomposition.pre_norm else self.decomposition.block_norms(layer)[0]
        where = self.decomposition.attention_output_norm(layer)
        inner = None if where is None else (where[0], where[1], pieces["inner"])
        return decomposition_terms(pieces["x"], pieces["attention"], pieces["values"],
                                   adapter.linears(layer).attention.out, post_norm, pieces["residual"],
                                   method.layer_norm_scale, method.name,
                                   self.decomposition.attention_output_scale(layer), inner)

    def folder(self, rec: ActivationRecorder, layer: int) -> Callable[[Tensor], None]:
        def fold(output: Tensor) -> None:
            keys = ("x", "attention", "values", "residual") + (("inner",) if ("inner", layer) in rec else ())
            pieces = {k: rec.outputs.pop((k, layer)) for k in keys}
            self.contributions.append(contributions_of(
                self.terms(layer, pieces), self.real.to(output.device), self.method.distance_eps,
                None if self.rows is None else self.rows.to(output.device)))
            if self.also is not None:
                self.extra.append(self.also(layer, pieces))
            if layer == len(self.adapter.blocks) - 1:
                self.last_output = output
        return fold


class _AltiBase(AttributionMethod):
    tags = ("alti", OPT_IN)

    def __init__(self, layer_norm_scale: str, distance_eps: float):
        if layer_norm_scale not in LN_SCALES:
            raise ValueError(f"layer_norm_scale must be one of {LN_SCALES}, got {layer_norm_scale!r}")
        if not float(distance_eps) >= 0:
            raise ValueError(f"distance_eps must be a number >= 0, got {distance_eps!r}")
        self.layer_norm_scale = layer_norm_scale
        self.distance_eps = float(distance_eps)

    def check_adapter(self, adapter: ModelAdapter) -> None:
        super().check_adapter(adapter)
        if adapter.decomposition is None:
            raise MethodUndefinedError(
                f"{self.name}: {type(adapter.model).__name__} ({adapter.family}) does not decompose its blocks "
                "(adapter.decomposition: the attention output must reach the residual stream through linear maps and "
                "per-token norms only, with the block's norms named)")


@register_method("alti")
class Alti(_AltiBase):
    """ALTI (Ferrando et al. 2022, eq. 7-11; ``mt-upc/transformer-contributions`` ``src/contributions.py``).

    Per block: ``T_i(x_j)`` = the attention sub-layer's part from token ``j`` in output ``i`` (heads summed, values
    with their bias) plus the residual ``x_i`` at ``j = i``, through the post-norm LayerNorm's linear part (BERT
    family; pre-norm blocks: the attention's own norm output is already per token, so none; a layer scale is
    folded into ``W_O``, a norm inside the sub-layer, EVA-02's sub-LN or Gemma 3's, linearised as that LayerNorm);
    ``c_ij = max(0, ||y_i||_1 - ||T_i(x_j) - y_i||_1)`` normalised per row (the reference's ``min_sum`` with the
    L1 resultant norm, eq. 9's proximity), then rolled out ``C_{L-1} ... C_0`` (no identity added: the residual
    is inside ``T``) and read at the read-out row (the class token's, a read-out position's, the mean row of a
    mean pool, the fixed weights of DeiT's two tokens; an attention pool refuses). Class-agnostic.
    ``layer_norm_scale``: ``"shifted_std"`` (default, the reference since 2023-03: ``1 / std(x + eps)``,
    population std) or ``"exact"`` (``1 / sqrt(var(x) + eps)``, the module's). ``distance_eps`` (default ``1e-6``):
    the reference's ``pairwise_distance`` adds it to every coordinate of ``T - y``; 0 gives the paper's distance.
    Departure of the reference from the paper: the bias terms count in ``y_i`` but in no ``T_i(x_j)``.
    """

    class_specific = False

    def __init__(self, layer_norm_scale: str = "shifted_std", distance_eps: float = 1e-6):
        super().__init__(layer_norm_scale, distance_eps)

    def check_adapter(self, adapter: ModelAdapter) -> None:
        super().check_adapter(adapter)
        if adapter.readout.kind == "attention_pool":
            raise MethodUndefinedError(
                f"{self.name}: {type(adapter.model).__name__} ({adapter.family}) reads out through an attention "
                "pooling head, a latent query's attention with no residual: its row of ALTI's contributions is not "
                "defined (ALTI reads the row of a token, or the mean row of a mean pool)")

    def attribute(self, adapter, inputs, target):
        layout = adapter.inputs.layout(inputs)
        like = inputs.tensors[next(iter(inputs.tensors))]
        real = layout.real_positions(like.new_zeros(inputs.batch_size, layout.num_positions))
        rows = real.clone()
        if adapter.readout.kind == "position":      # a read-out position on padding (SigLIP's last token) keeps its row
            positions = adapter.inputs.context(inputs).readout_positions
            assert positions is not None, "a model read out at a position has them in its context"
            rows[torch.arange(inputs.batch_size), positions.to(rows.device)] = True
        blocks = _BlockDecomposition(self, adapter, real, rows=rows)
        blocks.run(inputs)
        matrices = blocks.contributions
        row = read_out(matrices.pop(), adapter, inputs, "auto", layout).to(torch.float64)
        while matrices:
            row = row_times(row, matrices.pop())
        return layout.output(row.to(inputs.score_dtype))


@register_method("alti_logit")
class AltiLogit(ExplainsALogit, _AltiBase):
    """ALTI-Logit (Ferrando et al. 2023, eq. 6-9; ``mt-upc/logit-explanations`` ``extract_explanations.py``).

    Per block ``l``: the logit update of token ``j``'s attention vector at the read-out position ``t``,
    ``dlogit^l_j = U_w . LN_f(sum_h A^h_tj v_j^h W_O^h)`` (``U_w`` the head's row of the target ``w``, minus the
    foil's with ``explain="logit_difference"``; ``LN_f`` the final norm's linear part with the scale of the last
    block's output at ``t``, by ``layer_norm_scale``, default ``"exact"`` as the reference's ``l_transform``),
    tracked to the inputs by ALTI's rollout of the blocks below (pre-norm ALTI, :class:`Alti`'s ``c_ij``):
    ``sum_l dlogit^l C_{l-1} ... C_0``. Per-sample targets (token ids; ``None``: the prediction). Not attributed,
    as in the reference: the embeddings' direct path, the MLPs, the biases (``b_O``, the final norm's).
    Pre-norm decoders whose head is linear after the final norm (GPT-2, Llama-like with RMSNorm: exact there too);
    the head's row ``U_w`` is read as the gradient of the explained logit at the final norm's output.
    """

    def __init__(self, explain: str = "logit", layer_norm_scale: str = "exact", distance_eps: float = 1e-6):
        super().__init__(layer_norm_scale, distance_eps)
        self.set_logit_explain(explain, "alti_logit")

    def check_adapter(self, adapter: ModelAdapter) -> None:
        super().check_adapter(adapter)
        decomposition = adapter.decomposition
        if decomposition is None or not decomposition.pre_norm or adapter.readout.kind != "position":
            raise MethodUndefinedError(f"{self.name}: {type(adapter.model).__name__} ({adapter.family}) needs a "
                                       "pre-norm decoder read out at a position (its final norm and linear head)")
        if adapter.decoder is None or not adapter.decoder.linear_head:
            raise MethodUndefinedError(f"{self.name}: {type(adapter.model).__name__} ({adapter.family}) has a head "
                                       "that is not linear after its final norm (a CLIP tower's cosine, a soft-capped "
                                       "LM head): its logit is no sum of per-token terms")

    def attribute(self, adapter, inputs, target):
        layout = adapter.inputs.layout(inputs)
        like = inputs.tensors[next(iter(inputs.tensors))]
        real = layout.real_positions(like.new_zeros(inputs.batch_size, layout.num_positions))
        positions = adapter.inputs.context(inputs).readout_positions
        assert positions is not None, "a model read out at a position has them in its context"

        def at_readout(layer: int, pieces: Dict[str, Tensor]) -> Tensor:
            """``sum_h A^h_tj v_j^h W_O^h`` ``[B, N, D]``: the attention vectors reaching the read-out row (through
            a norm inside the attention sub-layer where the block has one: :func:`decomposition_terms`)."""
            attention, heads, _, _ = blocks.terms(layer, pieces)
            rows = attention[torch.arange(attention.shape[0]), :, positions.to(attention.device)]     # [B, H, N]
            return torch.einsum("bhj,bhjd->bjd", rows, heads)

        blocks = _BlockDecomposition(self, adapter, real, also=at_readout)
        logits = blocks.run(inputs, head_gradient=True)
        target = resolve_target(logits, target)
        foil = resolve_foil(logits, self.call_foil, self.explain)
        assert blocks.normed is not None and blocks.last_output is not None
        rows = torch.arange(inputs.batch_size)
        # the head's row of the target (minus the foil's): the gradient of the explained logit at the normed state
        gradient, = torch.autograd.grad(explained_score(logits, target, self.explain, foil), blocks.normed)
        direction = gradient[rows, positions.to(gradient.device)].detach()
        final = adapter.decoder.final_norm()
        centred, weight, _, _ = norm_parts(final, self.name)
        last = blocks.last_output[rows, positions.to(blocks.last_output.device)]
        scale = norm_scale(last, final, self.layer_norm_scale, self.name)                        # [B]
        direction = centre(direction.to(last) * weight, centred) * scale[:, None]               # [B, D]
        updates = [torch.einsum("bjd,bd->bj", vectors, direction) * real for vectors in blocks.extra]
        matrices = blocks.contributions
        matrices.pop()
        row = updates.pop().to(torch.float64)
        while matrices:
            row = row_times(row, matrices.pop()) + updates.pop().to(torch.float64)
        return layout.output(row.to(inputs.score_dtype))
