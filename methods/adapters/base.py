"""The one interface every model family implements, in words that fit images, text and CLIP alike.

An adapter never re-implements a model: it calls the model's own submodules in the order of the model's own
``forward`` (so its logits are bit-identical to ``model(...)``) and says where the tensors that methods read
live. Methods only ever talk to a :class:`ModelAdapter`; a new family (Hugging Face text classifiers, CLIP
towers) is one folder of :mod:`methods.families`, registered with :func:`register_adapter`.

Vocabulary
----------
* **positions**: the ``N`` entries of the token sequence that the blocks see (``[B, N, D]`` hidden states),
  special tokens ([CLS], registers, [SEP], EOS) and padding included.
* **content positions**: the positions a score is reported for: the image patches (not [CLS] or registers);
  for text every real token of the input (padding excluded).
* **read-out**: where the prediction reads the last hidden states: ``"class_token"`` (one fixed position,
  e.g. [CLS] at 0), ``"mean_content"`` (the mean of the content positions: global average pooling),
  ``"position"`` (one position per sample, e.g. CLIP's EOS token), ``"weighted"`` (a fixed weighted mean of
  positions, :meth:`ReadOut.weights`: a DeiT's [CLS] and distillation tokens, each read by its own
  head and the logits averaged; DINOv2's classifier on ``[CLS] ++ mean of the patches``) or ``"attention_pool"``
  (a learned-query attention pooling head reads the last hidden states: each sample's read-out is its own weight
  vector over the positions, :meth:`ReadOut.weights`, the pool's attention).
* **layout** (:class:`PatchGrid` or :class:`TokenSequence`): how the content positions map to the input, and
  therefore the shape of a method's output: ``[B, P]`` patch scores in row-major grid order for images;
  ``[B, N]`` scores aligned with the input positions for sequences, exactly 0 at padding.
* **context** (:class:`SequenceContext`): what the blocks and the head need besides the hidden states: the
  attention mask (``None`` when every position is real) and the per-sample read-out positions.
"""
from __future__ import annotations

import abc
import contextlib
import weakref
from dataclasses import dataclass, replace
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Hashable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
)

import torch
from torch import Tensor, nn

from .capability import Capability, lacking
from .embedding_offset import check_embedding_offset, offset_added
from .recorder import ActivationRecorder

if TYPE_CHECKING:
    from transformers.pytorch_utils import Conv1D

READOUT_KINDS = ("class_token", "mean_content", "position", "weighted", "attention_pool")
#: the read-outs given by a weight vector per sample over the positions (:meth:`ReadOut.weights`)
WEIGHTED_READOUTS = ("weighted", "attention_pool")

#: what a caller passes: a tensor, or a mapping of tensors as a tokenizer or processor returns it
RawInputs = Union[Tensor, Mapping[str, Any]]
#: optional per-sample ids: a ``LongTensor[B]`` or a list of ints
SampleIds = Optional[Union[Tensor, Sequence[int]]]


class MethodUndefinedError(TypeError):
    """A method that is not defined on this model (e.g. no relevance rule for one of its parts, no LRP topology
    for its family); the message names the method, the model and the reason. Not a bug of the input: the
    conformance matrix (``tests/test_method_contract.py``) lists these combinations with their reasons."""


# ------------------------------------------------------------------------------------------ inputs
@dataclass(frozen=True)
class ModelInputs:
    """A validated batch as the adapter's model reads it.

    ``tensors``: the model's input tensors by name (``{"pixel_values": [B, 3, H, W]}`` for images,
    ``{"input_ids", "attention_mask", ...}`` for text), detached. ``sample_ids``: optional per-sample ids
    (``LongTensor[B]``, e.g. dataset indices) given explicitly by the caller. ``score_dtype``: the dtype of the
    scores a method returns (the images' dtype; the model's floating dtype for token ids). ``embedding_offset``:
    optional ``[B, N, D]`` shift of each row's input embedding, added by every ``embed``
    (:mod:`methods.adapters.embedding_offset`).
    """

    tensors: Mapping[str, Tensor]
    batch_size: int
    score_dtype: torch.dtype
    device: torch.device
    sample_ids: Optional[Tensor] = None
    embedding_offset: Optional[Tensor] = None

    def __getitem__(self, name: str) -> Tensor:
        return self.tensors[name]

    def with_tensors(self, rows: Optional[Tensor] = None, **tensors: Tensor) -> "ModelInputs":
        """The same batch with some tensors replaced (e.g. scaled pixels); the batch size follows them.
        ``rows`` (``LongTensor[M]``, the selected, repeated or regrouped rows): row ``j`` stems from row
        ``rows[j]`` and gets its embedding offset. Without ``rows`` the rows are the same (same batch size: the
        offset is kept); another batch size with an offset and no ``rows`` is an error (which rows get which
        offset cannot be guessed). ``sample_ids`` are kept for the same batch size, dropped otherwise."""
        merged = {**self.tensors, **tensors}
        size = int(next(iter(tensors.values())).shape[0])
        offset = self.embedding_offset
        if offset is not None and rows is not None:
            if len(rows) != size:
                raise ValueError(f"with_tensors: {len(rows)} rows named for tensors of {size} rows")
            offset = offset[rows.to(offset.device)]
        elif offset is not None and size != self.batch_size:
            raise ValueError(f"with_tensors: {size} rows made from a batch of {self.batch_size} that carries an "
                             "embedding offset; name the row each stems from (rows=...)")
        return replace(self, tensors=merged, batch_size=size,
                       sample_ids=self.sample_ids if size == self.batch_size else None, embedding_offset=offset)

    def offset_by(self, offset: Tensor) -> "ModelInputs":
        """These rows with their input embeddings shifted by ``offset`` ``[B, N, D]`` (checked)."""
        first = next(iter(self.tensors.values()))
        return replace(self, embedding_offset=check_embedding_offset(offset, self.batch_size, int(first.shape[1])))


def check_sample_ids(sample_ids: SampleIds, batch_size: int) -> Optional[Tensor]:
    """``None`` or an integer ``LongTensor[B]`` of per-sample ids (a list is accepted)."""
    if sample_ids is None:
        return None
    ids = torch.as_tensor(sample_ids)
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dim() != 1:
        raise ValueError(f"sample_ids must be one integer id per sample, got dtype {ids.dtype}, shape "
                         f"{tuple(ids.shape)}")
    if ids.shape[0] != batch_size:
        raise ValueError(f"sample_ids has {ids.shape[0]} entries but the batch has {batch_size} samples")
    return ids.long().cpu()


def scaled_copies(inputs: ModelInputs, alphas: Tensor, scale_name: str) -> ModelInputs:
    """``S * B`` samples, step-major: the tensors of ``inputs`` once per ``alpha`` (``[S]``), with the per-sample
    factor ``scale_name`` (``[S * B]``: each copy's alpha, replacing one already there) that the adapter's
    ``embed`` multiplies into its embeddings (integrated gradients of the text families)."""
    steps = len(alphas)
    repeated = {name: t.repeat((steps,) + (1,) * (t.dim() - 1)) for name, t in inputs.tensors.items()
                if name != scale_name}
    scale = alphas.to(device=inputs.device, dtype=inputs.score_dtype).repeat_interleave(inputs.batch_size)
    return inputs.with_tensors(torch.arange(inputs.batch_size).repeat(steps), **repeated, **{scale_name: scale})


# ------------------------------------------------------------------------------------------ layouts
# Both layouts answer the same questions (methods never ask which one they hold); ``like`` is a tensor whose
# first dimension is the batch and last the positions, giving device (and shape where the layout has none).
@dataclass(frozen=True)
class PatchGrid:
    """Image tokens: ``prefix`` special tokens ([CLS], registers), then a row-major ``rows x cols`` patch grid.

    Content positions are ``prefix:``; a method's output is ``[B, rows * cols]``. No padding.
    """

    rows: int
    cols: int
    prefix: int

    #: what the model reads (pixel values), which says how an evaluation feeds and perturbs its inputs
    modality = "image"
    #: whose reference code the methods' per-modality defaults follow (the authors' ViT code)
    reference = "vit"
    #: whether some positions of a sample can be padding (left out of per-sample statistics)
    has_padding = False
    #: whether a method's output holds the class token's position
    reports_class_token = False

    @property
    def grid(self) -> Tuple[int, int]:
        return self.rows, self.cols

    @property
    def content(self) -> slice:
        return slice(self.prefix, None)

    @property
    def num_positions(self) -> int:
        """``N``: the positions the blocks see."""
        return self.rows * self.cols + self.prefix

    @property
    def num_scores(self) -> int:
        """The width of a method's output (``P`` patches)."""
        return self.rows * self.cols

    def output(self, scores: Tensor) -> Tensor:
        """Per-position scores ``[..., N]`` -> the method's output ``[..., P]`` (patch positions only)."""
        return scores[..., self.prefix:]

    def real_positions(self, like: Tensor, include_padding: bool = False) -> Tensor:
        """Bool ``[B, N]``: the positions of per-sample statistics (means, minima): all of them."""
        return torch.ones(like.shape[0], like.shape[-1], dtype=torch.bool, device=like.device)

    def content_positions(self, like: Tensor) -> Tensor:
        """Bool ``[B, N]``: the content positions (the patches)."""
        inside = torch.zeros(like.shape[0], like.shape[-1], dtype=torch.bool, device=like.device)
        inside[:, self.content] = True
        return inside

    def batch_content_positions(self, num_positions: int, device: Union[torch.device, str, None]) -> Tensor:
        """The indices of the positions that are content in some sample of the batch (the patches)."""
        return torch.arange(num_positions, device=device)[self.content]

    def content_scores(self, scores: Tensor) -> Tensor:
        """``scores`` ``[B, N]`` with what is not content of its sample at 0 among the positions :meth:`output`
        keeps: unchanged (it keeps the patches only)."""
        return scores

    def without_padding(self, values: Tensor) -> List[Tensor]:
        """Each sample's values ``[N, ...]`` at its real positions: all of them."""
        return list(values)

    def mean_over_content(self, values: Tensor) -> Tensor:
        """Mean of ``values`` ``[B, ..., N]`` over the content positions of the last dimension: ``[B, ...]``."""
        return values[..., self.content].mean(dim=-1)

    def mean_over_content_rows(self, matrix: Tensor) -> Tensor:
        """Mean of ``matrix`` ``[B, ..., N, N]`` over its content rows: ``[B, ..., N]``."""
        return matrix[..., self.content, :].mean(dim=-2)


@dataclass(frozen=True)
class TokenSequence:
    """Text tokens: ``attention_mask`` ``[B, N]`` (1 real, 0 padding) and ``content_mask`` ``[B, N]`` (bool, the
    real tokens that are not special tokens). A method's output is ``[B, N]``, aligned with the input
    positions, exactly 0 at padding; special tokens keep their scores. Members as :class:`PatchGrid`'s."""

    attention_mask: Tensor
    content_mask: Tensor

    #: token ids; the authors' BERT code
    modality = "text"
    reference = "bert"
    has_padding = True
    reports_class_token = True

    @property
    def content(self) -> Tensor:
        return self.content_mask

    @property
    def num_positions(self) -> int:
        return int(self.attention_mask.shape[-1])

    num_scores = num_positions

    def output(self, scores: Tensor) -> Tensor:
        mask = self.attention_mask.to(dtype=torch.bool, device=scores.device)
        return scores.masked_fill(~mask.reshape(mask.shape[:1] + (1,) * (scores.dim() - 2) + mask.shape[1:]), 0)

    def real_positions(self, like: Tensor, include_padding: bool = False) -> Tensor:
        """The real tokens, or every position with ``include_padding`` (what the authors' batch-1 code does on
        a padded input)."""
        mask = self.attention_mask.to(device=like.device).bool()
        return torch.ones_like(mask) if include_padding else mask

    def content_positions(self, like: Tensor) -> Tensor:
        return self.content_mask.to(like.device)

    def batch_content_positions(self, num_positions: int, device: Union[torch.device, str, None]) -> Tensor:
        return self.content_mask.any(dim=0).nonzero().flatten().to(device)

    def content_scores(self, scores: Tensor) -> Tensor:
        return scores * self.content_mask.to(device=scores.device, dtype=scores.dtype)

    def without_padding(self, values: Tensor) -> List[Tensor]:
        return [v[m.bool()] for v, m in zip(values, self.attention_mask)]

    def mean_over_content(self, values: Tensor) -> Tensor:
        weights = self.content_mask.to(device=values.device, dtype=values.dtype)
        weights = weights.reshape(weights.shape[:1] + (1,) * (values.dim() - 2) + weights.shape[1:])
        return (values * weights).sum(dim=-1) / weights.sum(dim=-1).clamp_min(1)

    def mean_over_content_rows(self, matrix: Tensor) -> Tensor:
        weights = self.content_mask.to(device=matrix.device, dtype=matrix.dtype)
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1)
        weights = weights.reshape(weights.shape[:1] + (1,) * (matrix.dim() - 3) + weights.shape[1:] + (1,))
        return (matrix * weights).sum(dim=-2)


Layout = Union[PatchGrid, TokenSequence]


@dataclass(frozen=True)
class TokenSpace:
    """The tokens one block sees: ``count`` positions (``N``), their ``grid`` (rows, cols) where they form one
    (``None`` for sequences), the hidden ``width`` and the attention ``heads``. Every block of an isotropic model
    shares one (the layout's); a hierarchical model (Swin) has one per stage, joined by transitions
    (``ModelAdapter.token_flow``)."""

    count: int
    grid: Optional[Tuple[int, int]]
    width: int
    heads: int


@dataclass(frozen=True)
class SequenceContext:
    """What blocks and head need besides the hidden states: the attention mask (``[B, N]``, 1 real / 0 padding;
    ``None`` when all positions are real), the read-out positions (``[B]``; ``None`` unless the read-out is
    ``"position"``) and the position ids (``[B, N]``) of families whose blocks apply positions themselves
    (rotary embeddings of decoder LMs; ``None`` elsewhere)."""

    attention_mask: Optional[Tensor] = None
    readout_positions: Optional[Tensor] = None
    position_ids: Optional[Tensor] = None

    def repeat(self, times: int) -> "SequenceContext":
        """The context of ``times`` copies of the batch, copy-major (``[c0 s0, c0 s1, ..., c1 s0, ...]``)."""
        def rep(t: Optional[Tensor]) -> Optional[Tensor]:
            return None if t is None else t.repeat((times,) + (1,) * (t.dim() - 1))
        return SequenceContext(rep(self.attention_mask), rep(self.readout_positions), rep(self.position_ids))


# ------------------------------------------------------------------------------------------ hook points
#: a linear layer: ``nn.Linear``, or ``transformers``' ``Conv1D`` (GPT-2), a linear layer whose weight is stored
#: transposed (``[in, out]``); read its weight with :func:`linear_weight`, its width with :func:`out_features`
Projection = Union[nn.Linear, "Conv1D"]


def linear_weight(layer: Projection) -> Tensor:
    """The weight of ``layer`` as ``nn.Linear`` stores it: ``[out, in]`` (a ``Conv1D``'s, transposed)."""
    return layer.weight if isinstance(layer, nn.Linear) else layer.weight.t()


def out_features(layer: Projection) -> int:
    """The output width of ``layer``."""
    return int(layer.out_features if isinstance(layer, nn.Linear) else layer.nf)


@dataclass(frozen=True)
class AttentionLinears:
    """The linear layers of one attention sub-layer: a fused ``qkv`` projection (timm; GPT-2's ``c_attn``, a
    ``Conv1D``: output ``[q | k | v]``, width ``3 * D``) or separate ``q``, ``k``, ``v`` projections (Hugging
    Face; with grouped-query attention ``k`` and ``v`` are narrower than ``q``), and the output projection
    ``out``. Read weights with :func:`linear_weight`. ``multihead``: an ``nn.MultiheadAttention`` (open_clip)
    applies its packed ``in_proj_weight`` and its ``out_proj`` functionally, so no projection module runs that a
    hook could reach: then ``qkv``, ``q``, ``k``, ``v`` are ``None``, ``out`` is its ``out_proj`` (to read its
    weight, never to hook) and rules act through the module's ``query`` / ``key`` / ``value`` inputs. An attention
    pooling head's learned query has its own ``q`` and a fused key-value projection ``kv`` (output ``[k | v]``,
    width ``2 * D``)."""

    out: Projection
    qkv: Optional[Projection] = None
    q: Optional[Projection] = None
    k: Optional[Projection] = None
    v: Optional[Projection] = None
    multihead: Optional[nn.MultiheadAttention] = None
    kv: Optional[Projection] = None


@dataclass(frozen=True)
class BlockLinears:
    """The linear layers of one block (``ModelAdapter.linears``): its attention sub-layer's (:class:`AttentionLinears`)
    and its MLP's two, ``mlp`` = (up-projection, down-projection) (a gated MLP: ``up_proj`` and ``down_proj``; its
    gate is the family's own member)."""

    attention: AttentionLinears
    mlp: Tuple[Projection, Projection]


@dataclass(frozen=True)
class HeadLayers:
    """A classifier head as DecompX decomposes it: ``last(activation(first(h_0)))`` on the read-out token's hidden
    state ``h_0`` (position 0; dropout between, identity in eval): two linear layers (read weights with
    :func:`linear_weight`) and the element-wise ``activation`` between them (BERT's pooler: ``tanh``)."""

    first: Projection
    activation: Callable[[Tensor], Tensor]
    last: Projection


# ------------------------------------------------------------------------------------------ interface
class RuleMap:
    """Where AttnLRP / CP-LRP (:mod:`methods.attnlrp`; Achtibat et al. 2024, rules placed by layer type) put their
    rules in one family's models: a family declares it as ``rule_map = Capability(TheSubclass)`` (in its
    folder's ``rules.py``), which reads the family's modules through :attr:`adapter`. The defaults fit a model
    whose norms and activations are modules inside ``adapter.model``, with no gated MLP, no attention outside the
    blocks and no product the rules cannot hook. :meth:`head_rules` is the one state: the identity rule's
    stabiliser that an adapter's ``head`` reads (:attr:`head_epsilon`) for the non-linearities it computes itself.
    """

    def __init__(self, adapter: "ModelAdapter") -> None:
        self.adapter = adapter
        #: the identity rule's stabiliser while :meth:`head_rules` is in force (``None``: plain gradients)
        self.head_epsilon: Optional[float] = None

    def scope(self) -> nn.Module:
        """The module whose norms and element-wise activations carry the rules (found by type, as LXT patches
        classes: ``nn.LayerNorm`` and the activation modules of torch, timm and transformers)."""
        return self.adapter.model

    def problems(self) -> List[str]:
        """What in this model has no relevance rule of :mod:`methods.attnlrp` (e.g. a gated MLP), or ``[]``."""
        return []

    def head_attention_linears(self) -> List[AttentionLinears]:
        """The linear layers of the attention sub-layers outside the blocks (an attention pooling head: its
        query ``q`` and key-value ``kv`` projections), given the attention rules as the blocks' ones; ``[]``
        (default) when there are none."""
        return []

    def gated_mlps(self) -> List[nn.Module]:
        """The gated MLPs, ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` (Llama's, Qwen's, Gemma's), given
        the identity rule on the activation and the uniform rule on the product; ``[]`` (default) when none."""
        return []

    def product_rules(self, attention: Tuple[float, float, float], gate: str,
                      gamma: Optional[float] = None) -> Optional[contextlib.AbstractContextManager[None]]:
        """For a model that forms its multiplicative interactions where :mod:`methods.attnlrp` cannot hook them
        (timm's EVA and BEiT attention computes ``q``, ``k``, ``v`` with a functional linear layer; timm's GLU
        MLPs), a context in which the family places those rules itself: the gradients at ``q``, ``k``, ``v``
        times the factors ``attention`` (``(q, k, v)``), and in every gated MLP the uniform rule on the product
        (``gate="uniform"``: half of the gradient to each factor) or the gate branch held constant
        (``gate="constant"``); ``gamma``: the gamma rule asked for on every linear layer (a family whose model
        computes some linear layer functionally raises :class:`MethodUndefinedError`). ``None`` (default):
        :mod:`methods.attnlrp` hooks the adapter's ``linears`` (attention) and :meth:`gated_mlps` itself."""
        return None

    def input_embedding(self) -> nn.Module:
        """The module whose output is the per-position input embedding: the token-id embedding for text (no
        position or token-type share), the patch embedding for images (no [CLS], no positions)."""
        raise NotImplementedError(f"{self.adapter.family} does not name its input embedding")

    def embedding_scores(self, products: Tensor) -> Tensor:
        """``embedding * gradient`` (the :meth:`input_embedding` output's shape) summed over the width: scores
        ``[B, num_scores]`` in the output layout (token positions; patches in row-major grid order)."""
        return products.sum(dim=-1).flatten(1)

    @contextlib.contextmanager
    def head_rules(self, epsilon: float) -> Iterator[None]:
        """Within it, the adapter's ``head`` applies the identity rule (:mod:`methods.adapters.gradient_rules`,
        with the stabiliser ``epsilon``) to the non-linearities it computes itself rather than through a module
        (a functional ``tanh`` or ``relu``, CLIP's L2 normalisation); the values are unchanged."""
        before = self.head_epsilon
        self.head_epsilon = epsilon
        try:
            yield
        finally:
            self.head_epsilon = before


class BlockDecomposition:
    """The per-token decomposition of a family's blocks (``ModelAdapter.decomposition``: ALTI, ALTI-Logit, DecompX):
    the attention sub-layer's output enters the residual stream through linear maps and per-token norms only, so
    that each block output decomposes per input token. The defaults fit blocks that name their two norms
    :attr:`norm_names` and whose module output is the residual stream."""

    #: ``True``: a block computes ``x + attn(norm(x))``; ``False``, post-norm as in BERT: ``norm(x + attn(x))``
    pre_norm: bool = True
    #: the block's attributes: the attention sub-layer's norm, then the MLP sub-layer's
    norm_names: Tuple[str, str] = ("norm1", "norm2")
    #: DecompX's capability (:meth:`head_layers`): every piece from the first block's input to the logits is one
    #: DecompX propagates per input token: post-norm blocks whose MLP is ``down(act(up(x)))`` with an element-wise
    #: activation (``linears(layer).mlp``; no gate), a read-out at position 0 and a head of two linear layers around an
    #: element-wise activation
    decomposes_network: bool = False

    def __init__(self, adapter: "ModelAdapter") -> None:
        self.adapter = adapter

    def block_norms(self, layer: int) -> Tuple[nn.Module, nn.Module]:
        """Block ``layer``'s two norm modules in the model's order: the attention sub-layer's (before it in a
        pre-norm block, after its residual sum in a post-norm one), then the MLP sub-layer's."""
        block = self.adapter.blocks[layer]
        return getattr(block, self.norm_names[0]), getattr(block, self.norm_names[1])

    def record_block_output(self, rec: ActivationRecorder, layer: int, key: Hashable,
                            transform: Optional[Callable[[Tensor], Any]] = None) -> None:
        """Record the residual stream leaving block ``layer`` ``[B, N, D]`` (``transform``: applied to it as
        :meth:`ActivationRecorder.output` does; it runs once the block's other recorded tensors are there)."""
        rec.output(self.adapter.blocks[layer], key, transform=transform)

    def record_post_attention_residual(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        """Record block ``layer``'s residual sum after its attention sub-layer, ``x + attn(...)`` ``[B, N, D]``
        (the output projection's bias and any layer scale included), before any norm that follows it: the input
        of the MLP's norm (pre-norm) or of the attention's (post-norm)."""
        rec.input(self.block_norms(layer)[1 if self.pre_norm else 0], key)

    def attention_output_scale(self, layer: int) -> Optional[Tensor]:
        """The per-channel layer scale ``[D]`` by which block ``layer`` multiplies its attention sub-layer's
        output (after the output projection) before the residual sum; ``None``: none."""
        return None

    def attention_output_norm(self, layer: int) -> Optional[Tuple[nn.Module, str]]:
        """A per-token norm inside block ``layer``'s attention sub-layer, with where it sits: ``"before_proj"``
        (on the merged heads' product, before the output projection: EVA-02's sub-LN) or ``"after_proj"`` (on the
        output projection's output, before the residual sum: Gemma 3's ``post_attention_layernorm``); ``None``:
        none. Its input is the tensor it normalises (a forward pre-hook on it records it)."""
        return None

    def head_layers(self) -> HeadLayers:
        """Only where :attr:`decomposes_network`: the head from the read-out token to the logits
        (:class:`HeadLayers`)."""
        raise NotImplementedError(f"{self.adapter.family} does not name its head as two linear layers and an "
                                  "activation")


class Decoder(abc.ABC):
    """The facts of a decoder family (``ModelAdapter.decoder``): a position attends only to itself and the positions
    before it (an edit of token ``j``'s values cannot reach an output before ``j``), and the head reads the last
    block's output after :meth:`final_norm`."""

    def __init__(self, adapter: "ModelAdapter") -> None:
        self.adapter = adapter

    @property
    @abc.abstractmethod
    def is_lm(self) -> bool:
        """A causal language model (logits over its vocabulary at the read-out position, a target is a token id)
        rather than a sequence classifier."""

    @abc.abstractmethod
    def final_norm(self) -> nn.Module:
        """The norm applied to the last block's output before the head."""

    @property
    def linear_head(self) -> bool:
        """ALTI-Logit's capability: the head is linear after :meth:`final_norm` at the read-out position, so that a
        logit is a sum of the final norm's per-token terms (a soft-capped LM head is not)."""
        return True


#: an edit of one block's attention tensor: ``edit(layer, tensor) -> tensor`` of the same shape
Edit = Callable[[int, Tensor], Tensor]


class AttentionEdit(abc.ABC):
    """An edit of a family's attention, applied in a context (``Recording.value_edit``, ``score_edit``)."""

    def __init__(self, adapter: "ModelAdapter") -> None:
        self.adapter = adapter

    @abc.abstractmethod
    def __call__(self, edit: Edit) -> contextlib.AbstractContextManager[None]:
        """A context in which every block's tensor passes through ``edit``; the model is restored on exit."""


class AttentionRecompute(abc.ABC):
    """A family's attention probabilities recomputed in the backward pass (``Recording.attention_recompute``)."""

    def __init__(self, adapter: "ModelAdapter") -> None:
        self.adapter = adapter

    @abc.abstractmethod
    def __call__(self, consume: Callable[[int, Tensor, Tensor], None],
                 lowest: int) -> contextlib.AbstractContextManager[Tensor]:
        """A context in which ``ModelAdapter.forward`` saves no block's attention probabilities for the backward
        pass; the backward recomputes each block's probabilities ``A_l`` ``[B, H, N, N]`` from its saved ``q``,
        ``k``, ``v`` (one more eager attention per block) and calls ``consume(l, A_l, dy/dA_l)`` with them, **from
        the last block down**, for every block from ``lowest`` up that ``forward`` records autograd for; the
        gradients are those of the eager attention bit for bit. The context yields a scalar ``anchor``:
        differentiating the target to it runs the backward down to block ``lowest``'s probabilities and no further
        (its gradient is 0). While the context is in force the attention modules of those blocks return no
        probabilities (``record_attention`` records nothing there; it still does below ``lowest`` and without
        autograd). The model is restored on exit."""


class ValueRecorder(abc.ABC):
    """Records a family's value projections where the family says (``Recording.post_attention_values``)."""

    def __init__(self, adapter: "ModelAdapter") -> None:
        self.adapter = adapter

    @abc.abstractmethod
    def __call__(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        """Record block ``layer``'s value projection ``[B, N, D]`` (heads merged, bias included) under ``key``."""


class ReadOut:
    """Where the prediction reads the last hidden states (``ModelAdapter.readout``; :mod:`methods.readout` reads the
    matching rows): ``kind``, one of :data:`READOUT_KINDS`; ``class_token``, whether position 0 holds a class token
    whose row a method may read instead of the model's own read-out (default: the read-out is the class token); and,
    for a kind of :data:`WEIGHTED_READOUTS`, the family's ``weights`` (:meth:`weights`)."""

    def __init__(self, adapter: "ModelAdapter", kind: str, class_token: Optional[bool] = None,
                 weights: Optional[Callable[[ModelInputs, Layout], Tensor]] = None) -> None:
        self.adapter = adapter
        self.kind = kind
        self.class_token = kind == "class_token" if class_token is None else class_token
        self._weights = weights

    def weights(self, inputs: ModelInputs, layout: Layout) -> Tensor:
        """Per sample, the weight of each position of ``layout`` in what the head reads, ``[B, N]``, each row summing
        to 1, 0 at the positions it does not read; the weighted mean of rows stands for the prediction
        (:func:`methods.readout.read_out`). ``"weighted"``: fixed weights (a DeiT's [CLS] and distillation tokens,
        1/2 each); ``"attention_pool"``: the pooling head's attention, mean over its heads."""
        if self.kind not in WEIGHTED_READOUTS or self._weights is None:
            raise NotImplementedError(f"{self.adapter.family} reads out with {self.kind!r}, not a weighted mean of "
                                      "positions")
        return self._weights(inputs, layout)


class InputFormat(abc.ABC):
    """What a family's model reads (``ModelAdapter.inputs``): raw inputs validated into :class:`ModelInputs`, their
    layout and context, the inputs scaled towards a baseline (integrated gradients) and positions removed from the
    hidden states (token ablation). :attr:`layout_class`: the class of :meth:`layout`'s answers, whose ``modality``
    says what the model reads (``image``: pixel values; ``text``: token ids) and so how an evaluation feeds and
    perturbs its inputs (``evaluation.classifier``)."""

    layout_class: Type[Layout] = PatchGrid

    def __init__(self, adapter: "ModelAdapter") -> None:
        self.adapter = adapter

    @abc.abstractmethod
    def prepare(self, inputs: RawInputs, sample_ids: SampleIds = None) -> ModelInputs:
        """Validate a tensor or a mapping of tensors as a tokenizer/processor returns it; errors name the problem."""

    @abc.abstractmethod
    def layout(self, inputs: Union[ModelInputs, RawInputs]) -> Layout:
        """The layout of ``inputs`` (a :class:`ModelInputs`, or raw inputs, which are validated first)."""

    @abc.abstractmethod
    def context(self, inputs: ModelInputs) -> SequenceContext: ...

    @abc.abstractmethod
    def interpolate(self, inputs: ModelInputs, alphas: Tensor) -> ModelInputs:
        """The inputs scaled towards the baseline by each ``alpha`` (``[S]``), ``S * B`` samples step-major:
        pixels for images (the all-zero normalised image as baseline), embeddings for text."""

    def normalises_word_embeddings_alone(self) -> bool:
        """Whether the word embeddings reach a scale-free normalisation with nothing added first (no position or
        token-type embedding): ``norm(a e) = norm(e)`` for every ``a`` above its epsilon, so a path from the zero
        embedding jumps at its start (``methods.integrated_gradients``' ``auto`` baseline). ``False`` unless the
        family says so."""
        return False

    def drop_positions(self, hidden: Tensor, context: SequenceContext,
                       removed: Tensor) -> Tuple[Tensor, SequenceContext]:
        """``len(removed) * B`` sequences (sample-major: ``[s0 r0, s0 r1, ..., s1 r0, ...]``), each the hidden
        states without one position of ``removed`` (the others keep their positional embedding), with the
        matching context (attention mask and position ids shortened; read-out positions shifted)."""
        batch, n = hidden.shape[:2]
        r = len(removed)
        keep = torch.arange(n, device=hidden.device)[None, :].expand(r, n)
        keep = keep[keep != removed[:, None].to(hidden.device)].reshape(r, n - 1)
        shortened = hidden[:, keep].flatten(0, 1)
        mask = context.attention_mask
        if mask is not None:
            mask = mask[:, keep.to(mask.device)].flatten(0, 1)
        positions = context.readout_positions
        if positions is not None:
            shift = (removed.to(positions.device)[None, :] < positions[:, None]).long()
            positions = (positions[:, None] - shift).flatten()
        ids = context.position_ids
        if ids is not None:
            ids = ids[:, keep.to(ids.device)].flatten(0, 1)
        return shortened, SequenceContext(mask, positions, ids)


class TokenFlow:
    """How the tokens flow through a family's blocks (``ModelAdapter.token_flow``): each block's token space and the
    transitions between blocks. This class is an isotropic model's: every block sees the layout's tokens, with the
    hidden ``width`` and ``heads`` attention heads that the family's declaration reads from its model
    (``token_flow = Capability(lambda adapter: TokenFlow(adapter, width, heads))``)."""

    def __init__(self, adapter: "ModelAdapter", width: int, heads: int) -> None:
        self.adapter = adapter
        #: the hidden width and the attention heads of the last block, the read-out's (every block's when isotropic)
        self.width = width
        self.heads = heads

    def token_space(self, layer: int, layout: Layout) -> TokenSpace:
        """The token space of block ``layer`` for inputs of ``layout``: the layout's positions, :attr:`width` and
        :attr:`heads`."""
        grid = layout.grid if isinstance(layout, PatchGrid) else None
        return TokenSpace(layout.num_positions, grid, self.width, self.heads)

    def transition(self, layer: int, like: Tensor) -> Optional[Tensor]:
        """How the tokens entering block ``layer`` are formed from those leaving block ``layer - 1``: a sparse
        ``[N_layer, N_layer-1]`` map whose row ``t`` holds the share of each earlier token in token ``t`` (rows sum
        to 1; a 2x2 patch merge: 1/4 at each of its four sources), in ``like``'s dtype and device. ``None``: the
        identity (the same tokens)."""
        return None


class Recording(abc.ABC):
    """Where methods hook in a family's models (``ModelAdapter.recording``): the tensors an
    :class:`ActivationRecorder` records, the eager attention that materialises the probabilities, and the
    capabilities that hook the attention (recomputed in the backward, its values or scores edited)."""

    #: whether ``ModelAdapter.forward`` makes the hidden states entering ``grad_from_block`` require grad
    hidden_requires_grad: bool = False
    #: capability: the attention probabilities recomputed in the backward pass (:class:`AttentionRecompute`)
    attention_recompute: Capability[Optional[AttentionRecompute]] = Capability(lacking)
    #: capability: the value projection ``[B, N, D]`` of the block's first norm applied to the residual stream after
    #: the attention sub-layer, recorded (:class:`ValueRecorder`: Beyond Intuition's CLIP token scale)
    post_attention_values: Capability[Optional[ValueRecorder]] = Capability(lacking)
    #: capability: every block's value vectors edited (:class:`AttentionEdit`: Value Zeroing). In the context
    #: ``value_edit(edit)`` every block's value vectors pass through ``edit(layer, values) -> values`` before the
    #: attention product: ``values`` ``[B, N, H, Dh]`` (heads split; grouped-query attention: the key-value heads),
    #: bias included, the tensor the block then multiplies by its attention probabilities; the edit returns a tensor
    #: of the same shape. Nothing else of the block changes (queries and keys keep the unedited projection).
    value_edit: Capability[Optional[AttentionEdit]] = Capability(lacking)
    #: capability: every block's pre-softmax attention scores edited (:class:`AttentionEdit`: AtMan). In the context
    #: ``score_edit(edit)`` every block ``l`` of ``ModelAdapter.forward`` (and ``run_blocks``) computes its attention
    #: probabilities as ``softmax(edit(l, S_l) + M)`` with eager attention: ``S_l`` ``[B, H, N, N]`` the block's
    #: scaled scores ``q k^T / sqrt(d)`` (after a family's soft-capping, before the additive attention mask ``M``:
    #: causal, padding, sliding window), query rows by key columns; ``edit`` returns a tensor of the same shape. The
    #: edit runs in the scores' dtype; columns it returns unchanged give exactly the model's own attention.
    score_edit: Capability[Optional[AttentionEdit]] = Capability(lacking)

    def __init__(self, adapter: "ModelAdapter") -> None:
        self.adapter = adapter

    @abc.abstractmethod
    def attention(self, rec: ActivationRecorder, layer: int, key: Hashable, require_grad: bool = False,
                  transform: Optional[Callable[[Tensor], Tensor]] = None) -> None:
        """Record block ``layer``'s post-softmax attention ``[B, H, N, N]`` (after dropout: identity in eval), the
        tensor the references hook; ``require_grad`` makes it differentiable for ``d logit / d A``."""

    @abc.abstractmethod
    def values(self, rec: ActivationRecorder, layer: int, key: Hashable) -> None:
        """Record block ``layer``'s value projection ``[B, N, D]`` (heads merged, bias included)."""

    @abc.abstractmethod
    def attention_input(self, rec: ActivationRecorder, layer: int, key: Hashable, require_grad: bool = False) -> None:
        """Record the hidden states entering block ``layer``'s attention: the norm output in a pre-norm block,
        the block input in a post-norm one."""

    def block_input(self, rec: ActivationRecorder, layer: int, key: Hashable, require_grad: bool = False) -> None:
        """Record the residual stream entering block ``layer``."""
        rec.input(self.adapter.blocks[layer], key, require_grad=require_grad)

    @abc.abstractmethod
    def eager_attention(self) -> contextlib.AbstractContextManager[None]:
        """Context in which the attention probabilities are materialised (fused attention switched off),
        restoring the model's setting on exit."""


class LogitLens(abc.ABC):
    """The logit lens of a family (LeGrad's capability, ``ModelAdapter.lens``): its own final norm and head read at
    every position."""

    def __init__(self, adapter: "ModelAdapter") -> None:
        self.adapter = adapter

    @abc.abstractmethod
    def logits(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """The family's own final norm and head applied to **every** position of ``hidden`` ``[B, N, D]`` (hidden
        states leaving any block) as if the read-out read that position alone: logits ``[B, N, C]`` (a CLIP /
        SigLIP / open_clip tower: the scorer's logits of each position's projected embedding; ``pre_logits``: that
        embedding, or the latent the classifier reads)."""


class ModelAdapter(abc.ABC):
    """What a method may know about a model. Subclasses wrap one family of stock models.

    Structure: ``len(blocks)`` blocks, their widths and heads in :attr:`token_flow`; where the prediction reads them
    in :attr:`readout`; what the model reads in :attr:`inputs` (:class:`InputFormat`), whose ``layout_class`` says
    how an evaluation feeds and perturbs its inputs (``evaluation.classifier``).

    What only some methods need is a capability object, declared as ``name = Capability(build)``
    (:mod:`methods.adapters.capability`; ``None`` where the family lacks it): a method whose options need one checks
    it before any batch (``AttributionMethod.check``) and names the model and the option.
    """

    #: a human-readable name of the family, used in error messages
    family: str = "?"
    #: where the prediction reads the last hidden states (:class:`ReadOut`; a [CLS] read-out unless the family says)
    readout: Capability[ReadOut] = Capability(lambda adapter: ReadOut(adapter, "class_token"))
    #: where methods hook: the family's :class:`Recording`
    recording: Capability[Recording]
    #: where AttnLRP / CP-LRP place their rules in this family's models (the family's ``rules.py``; one per adapter:
    #: it holds the head rules' state)
    rule_map: Capability[RuleMap] = Capability(RuleMap)
    #: the model and its blocks, whose submodules are read by name (torch types those as ``Tensor | Module``)
    model: Any
    blocks: List[Any]

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._signature = self.signature_of(model)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every family's ``embed`` (its own or a mixin's) adds its inputs' ``embedding_offset``
        (:func:`offset_added`)."""
        super().__init_subclass__(**kwargs)
        cls.embed = offset_added(cls.embed)  # type: ignore[method-assign]

    # -------------------------------------------------------------- which models
    @classmethod
    @abc.abstractmethod
    def supports(cls, model: nn.Module) -> Optional[str]:
        """``None`` if this family adapts ``model``; else the reason it does not (for the error message)."""

    @classmethod
    def signature_of(cls, model: nn.Module) -> tuple:
        """The structural facts an adapter reads once (read-out, depth, ...): a cached adapter whose model no
        longer has them is resolved again."""
        return ()

    # -------------------------------------------------------------- structure
    #: how the tokens flow through the blocks (:class:`TokenFlow`: each block's token space, width and heads, and the
    #: transitions between blocks)
    token_flow: Capability[TokenFlow]

    #: what the model reads (:class:`InputFormat`: the inputs validated, their layout and context, scaled towards the
    #: baseline, positions removed)
    inputs: Capability[InputFormat]

    # -------------------------------------------------------------- forward pieces (the model's own order)
    @abc.abstractmethod
    def embed(self, inputs: ModelInputs) -> Tensor:
        """Hidden states entering block 0, ``[B, N, D]``."""

    @abc.abstractmethod
    def run_blocks(self, hidden: Tensor, context: SequenceContext, start: int = 0,
                   stop: Optional[int] = None) -> Tensor: ...

    @abc.abstractmethod
    def head(self, hidden: Tensor, context: SequenceContext, pre_logits: bool = False) -> Tensor:
        """Final norm (if any), read-out and classifier: logits ``[B, C]`` (``pre_logits``: the latent the
        classifier reads)."""

    def forward(self, inputs: ModelInputs, grad_from_block: int = 0, pre_logits: bool = False) -> Tensor:
        """The model's logits, with autograd recorded only from block ``grad_from_block`` on.

        Everything before that block runs under ``torch.no_grad()``: methods that need gradients only down to
        some block pay for no graph below it (``grad_from_block=len(blocks)``: no graph at all but the head's). With
        the recording's ``hidden_requires_grad`` the hidden states entering that block require grad.
        """
        context = self.inputs.context(inputs)
        with torch.no_grad():
            hidden = self.run_blocks(self.embed(inputs), context, 0, grad_from_block)
        with torch.enable_grad():
            if self.recording.hidden_requires_grad and grad_from_block < len(self.blocks):
                hidden = hidden.detach().requires_grad_(True)
            hidden = self.run_blocks(hidden, context, grad_from_block)
            return self.head(hidden, context, pre_logits=pre_logits)


    @abc.abstractmethod
    def linears(self, layer: int) -> BlockLinears:
        """The linear layers of block ``layer``: its attention sub-layer's and its MLP's (:class:`BlockLinears`)."""

    #: capability: a decoder, its attention causal (:class:`Decoder`: Value Zeroing's convention, ALTI-Logit)
    decoder: Capability[Optional[Decoder]] = Capability(lacking)
    #: capability: each block's output decomposes per input token (:class:`BlockDecomposition`: ALTI, DecompX)
    decomposition: Capability[Optional[BlockDecomposition]] = Capability(lacking)
    #: capability: the family's own final norm and head read at every position (:class:`LogitLens`: LeGrad)
    lens: Capability[Optional[LogitLens]] = Capability(lacking)


class ImageAdapter(ModelAdapter):
    """What the image families share. Inputs: normalised images ``[B, num_channels, H, W]`` (a tensor, or
    ``{"pixel_values": ...}`` as an image processor returns it) of a size :meth:`image_size_problem` accepts.
    Layout: a patch grid after ``num_prefix_tokens`` prefix tokens. Integrated gradients scale the normalised
    pixels (the all-zero normalised image as baseline)."""

    num_channels = 3
    num_prefix_tokens = 1
    #: (height, width) of a patch
    patch_size: Tuple[int, int]

    def image_size_problem(self, size: Tuple[int, int]) -> Optional[str]:
        """Why the model cannot read images of ``size`` (``None``: it can)."""
        return None

    inputs: Capability[InputFormat] = Capability(lambda adapter: ImageInputs(adapter))


class ImageInputs(InputFormat):
    """The inputs of an :class:`ImageAdapter`: normalised images, a patch grid after the prefix tokens, the pixels
    scaled towards the all-zero normalised image."""

    adapter: ImageAdapter

    def prepare(self, inputs: RawInputs, sample_ids: SampleIds = None) -> ModelInputs:
        adapter = self.adapter
        images = inputs.get("pixel_values") if isinstance(inputs, Mapping) else inputs
        if not isinstance(images, Tensor) or images.dim() != 4 or images.shape[1] != adapter.num_channels:
            shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise ValueError(f"expected a normalised image batch [B, {adapter.num_channels}, H, W] (a tensor or "
                             f"{{'pixel_values': ...}}), got {shape}")
        if not images.dtype.is_floating_point:
            raise ValueError(f"expected normalised floating-point images, got dtype {images.dtype}")
        problem = adapter.image_size_problem((int(images.shape[-2]), int(images.shape[-1])))
        if problem is not None:
            raise ValueError(problem)
        images = images.detach()
        return ModelInputs({"pixel_values": images}, int(images.shape[0]), images.dtype, images.device,
                           check_sample_ids(sample_ids, int(images.shape[0])))

    def layout(self, inputs: Union[ModelInputs, RawInputs]) -> PatchGrid:
        if not isinstance(inputs, ModelInputs):
            inputs = self.prepare(inputs)
        images = inputs["pixel_values"]
        return PatchGrid(images.shape[-2] // self.adapter.patch_size[0], images.shape[-1] // self.adapter.patch_size[1],
                         self.adapter.num_prefix_tokens)

    def context(self, inputs: ModelInputs) -> SequenceContext:
        return SequenceContext()

    def interpolate(self, inputs: ModelInputs, alphas: Tensor) -> ModelInputs:
        images = inputs["pixel_values"]
        alphas = alphas.to(dtype=images.dtype, device=images.device)
        return inputs.with_tensors(pixel_values=(alphas[:, None, None, None, None] * images[None]).flatten(0, 1))


# ------------------------------------------------------------------------------------------ registry
ADAPTERS: List[Type[ModelAdapter]] = []
_RESOLVED: "weakref.WeakKeyDictionary[nn.Module, ModelAdapter]" = weakref.WeakKeyDictionary()


def register_adapter(cls: Type[ModelAdapter]) -> Type[ModelAdapter]:
    """Class decorator: make ``adapter_for`` consider this family. A subclass of a registered family (a more
    specific model, e.g. timm's distilled DeiT of its ViT) is consulted before its base."""
    if cls not in ADAPTERS:
        bases = [i for i, known in enumerate(ADAPTERS) if issubclass(cls, known)]
        if bases:
            ADAPTERS.insert(min(bases), cls)
        else:
            ADAPTERS.append(cls)
    return cls


def adapter_for(model: nn.Module) -> ModelAdapter:
    """The adapter of ``model``, resolved once per model object and then reused.

    ``TypeError`` naming the model class and the supported families (with each family's reason) otherwise.
    """
    cached = _RESOLVED.get(model)
    if cached is not None and cached._signature == cached.signature_of(model):
        return cached
    reasons: Dict[str, str] = {}
    for adapter_cls in ADAPTERS:
        reason = adapter_cls.supports(model)
        if reason is None:
            adapter = adapter_cls(model)
            _RESOLVED[model] = adapter
            return adapter
        reasons[adapter_cls.family] = reason
    raise TypeError(
        f"model class {type(model).__module__}.{type(model).__name__} is not supported; supported families: "
        f"{', '.join(a.family for a in ADAPTERS)} ({'; '.join(f'{k}: {v}' for k, v in reasons.items())})"
    )
