"""Beyond Intuition (Chen et al. 2023): attention perception times integrated-gradient reasoning feedback.

Layer indices are 0-based: the authors' code counts from 1 for these methods; its ``start_layer=S`` is
``start_layer=S-1`` here.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from .adapters import ActivationRecorder, ModelInputs, linear_weight
from .attention_gradients import attention_and_gradients, target_score
from .base import check_start_layer
from .explained_output import ExplainedOutput
from .explanation_targets import check_explain
from .readout import check_class_token_score, check_readout, check_readout_space, read_out, set_class_token_score
from .registry import register_method
from .rollout import accumulate_residual
from .targets import resolve_target


def _sample_slice(inputs: ModelInputs, start: int, stop: int) -> ModelInputs:
    """Samples ``start:stop`` of a batch (every tensor of :class:`ModelInputs` is batch-first)."""
    return inputs.with_tensors(torch.arange(start, stop), **{name: t[start:stop] for name, t in inputs.tensors.items()})


def attention_perception_headwise(attn: Tensor, grad: Tensor, positions: Optional[Tensor] = None) -> Tensor:
    """Head-wise perception ``Ã = Σ_h w_h A_h`` (Chen et al. 2023, §3.2, head importance).

    As the authors' code computes it (``generate_ours``): ``I_h = mean_ij |(A_h^T ∇A_h)_ij|`` — the mean absolute
    entry of the matrix product, not the paper's inner product ``<A_h, ∇A_h>`` — and ``w_h = I_h / Σ_h' I_h'``
    normalised **per sample** (their code normalises over the whole batch because it runs batch size 1).
    ``positions`` (bool ``[B, N]``): the mean runs over the entries ``(i, j)`` with both positions in it (the
    real tokens of a padded sequence); ``None``: all ``N x N``.
    """
    product = (attn.transpose(-1, -2) @ grad).abs()
    if positions is None:
        importance = product.mean(dim=(-1, -2))  # [B, H]
    else:
        pairs = (positions[:, :, None] & positions[:, None, :])[:, None].to(product.dtype)
        importance = (product * pairs).sum(dim=(-1, -2)) / pairs.sum(dim=(-1, -2))
    weights = importance / importance.sum(dim=1, keepdim=True)
    return (weights[:, :, None, None] * attn).sum(dim=1)


def attention_perception_tokenwise(attn: Tensor, block_input: Tensor, values: Tensor, out_weight: Tensor,
                                   attention_input: Optional[Tensor] = None) -> Tensor:
    """Token-wise perception ``Ā diag(s)`` (Chen et al. 2023, §3.2, token importance).

    ``s_j = ||(v_j W_o^T)|| / ||z_j||`` with ``v`` the value projection of the attention input (heads merged,
    bias included), ``W_o`` the attention output projection (its bias left out) and ``z`` the block input —
    **before** the pre-norm, the code's choice (``generate_ours_c``). With ``attention_input`` given, the
    denominator is the norm of the attention input instead (the same ``Z`` on both sides; identical to the
    block input in a post-norm block).
    """
    vproj = values @ out_weight.transpose(0, 1)
    denominator = block_input if attention_input is None else attention_input
    norm = denominator.norm(dim=-1)
    # a zero block input (a padding token whose embedding is zero, nn.Embedding's padding_idx, in a model without
    # position embeddings: Llama-like decoders) scales its column by 0 instead of 0 / 0
    scale = torch.where(norm > 0, vproj.norm(dim=-1) / norm.clamp(min=torch.finfo(norm.dtype).tiny), 0.0)  # [B, N]
    return attn.mean(dim=1) * scale[:, None, :]


class _BeyondIntuition(ExplainedOutput):
    """Shared machinery of Chen et al. 2023 ("Beyond Intuition"): ``T = F ⊙ P`` (eq. 8).

    * attention perception ``P = Π_{l=L-1..start} (I + Ã_l)`` (``R = R + Ã_l R`` in forward order,
      :func:`methods.rollout.accumulate_residual`, no row normalisation), ``Ã_l`` head-wise or token-wise;
    * reasoning feedback ``F = E_h[( (1/K) Σ_k ∇A_{L-1}(α_k x) )^+]``: the mean over ``K = steps`` points
      ``α_k = linspace(0, 1, K)`` (both ends included) of the gradient of the target's logit w.r.t. the **last**
      block's post-softmax attention, clamped at 0 after the step mean and then averaged over heads
      (``generate_ours`` lines 209-229). ``α_k x`` is the adapter's interpolation (``adapter.inputs.interpolate``): the
      pixels for images, baseline the all-zero normalised image. The α = 1 point is the clean pass, reused. The
      K-1 other points of every sample are batched and need autograd only through the last block.
      ``ig_batch_size``: the most interpolated inputs per forward (a bound on memory; the scores do not depend
      on it beyond float rounding); ``None``: all ``(K-1) * B`` at once; ``"auto"`` (default): on the CPU as
      many as keep one attention map ``[n, H, N, N]`` within 16 MiB (:meth:`ig_sequences_per_forward`; larger
      tensors cost fresh pages from the system on every allocation and fall out of the caches: at batch 16,
      256 positions, BERT-base the 304 sequences of one forward were about 20 % slower per sequence than ...),
      everything at once on other devices.
    * read-out of ``F ⊙ P`` (``readout``, :func:`methods.readout.read_out`): the [CLS] row for [CLS] models, the
      mean over the content rows (the code's ``mae`` read-out) for global average pooling (``auto``).
    * ``reasoning_feedback=False`` returns ``|P|`` read out the same way (their ``ssl=True`` branch).
    * ``gradient_of`` is the ``explain`` option of the other gradient methods (:mod:`methods.explanation_targets`):
      ``'probability'`` (InterpretDL's CV default) or ``'log_probability'`` differentiates the softmax
      probability instead of the logit (``'logit'``, the authors' code, default); ``'logit_difference'`` /
      ``'probability_difference'`` contrast it with ``foil`` (at every integration point too).

    Sequences (the authors' BERT code, ``BERT/ExplanationGenerator.py``): ``α`` scales the embedding output
    (after the embedding LayerNorm, ``BERT.py``: ``embedding_output = alpha * embedding_output``); the default
    ``start_layer=None`` is the authors' per-modality default (images: the value named in each method; BERT:
    the last block for head-wise, the last four for token-wise); ``class_token_score`` ``auto`` = ``zero`` (their
    ``R[:, 0, 0] = 0``), ``keep``; ``include_padding`` (head-wise weights) as for ``gradcam``.
    """

    #: 0-based start layer by default, by the layout's reference code (``Layout.reference``); a negative one
    #: counts from the end and is clipped to the model (the last four blocks of a 3-block model are all three)
    default_start_layers = {"vit": 0, "bert": -1}
    #: ``ig_batch_size="auto"`` on the CPU: the attention-map bytes one integrated-gradient forward may hold
    IG_AUTO_ATTENTION_BYTES = 16 * 2**20

    def __init__(self, start_layer: Optional[int] = None, steps: int = 20, readout: str = "auto",
                 reasoning_feedback: bool = True, gradient_of: str = "logit", ig_batch_size="auto",
                 class_token_score: str = "auto", include_padding: bool = False, foil: Optional[int] = None):
        super().__init__(check_explain(gradient_of, "gradient_of"), foil)
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self.class_token_score = check_class_token_score(class_token_score)
        self.include_padding = bool(include_padding)
        self.start_layer = start_layer
        self.steps = steps
        self.readout = check_readout(readout)
        self.reasoning_feedback = reasoning_feedback
        self.gradient_of = self.explain
        if not (ig_batch_size is None or ig_batch_size == "auto" or (isinstance(ig_batch_size, int)
                                                                   and ig_batch_size >= 1)):
            raise ValueError(f"ig_batch_size must be a positive integer, None or 'auto', got {ig_batch_size!r}")
        self.ig_batch_size = ig_batch_size

    def perception_pass(self, adapter, inputs, target, start):  # pragma: no cover - abstract
        """One clean pass: the perception updates ``Ã_l``, the last block's attention gradient, the targets."""
        raise NotImplementedError

    def ig_sequences_per_forward(self, adapter, inputs) -> int:
        """How many interpolated inputs (``α_k x`` of one sample) one forward of the integrated gradients takes:
        ``ig_batch_size``, or for ``"auto"`` (the default) on the CPU the most whose attention maps
        ``[n, H, N, N]`` stay within :attr:`IG_AUTO_ATTENTION_BYTES` (at least one), and every point at once
        on other devices."""
        if self.ig_batch_size != "auto":
            return int(self.ig_batch_size) if self.ig_batch_size is not None else (self.steps - 1) * inputs.batch_size
        if inputs.device.type != "cpu":
            return (self.steps - 1) * inputs.batch_size
        tokens = adapter.inputs.layout(inputs).num_positions
        itemsize = torch.finfo(inputs.score_dtype).bits // 8
        per_sequence = adapter.token_flow.heads * tokens * tokens * itemsize
        return max(1, self.IG_AUTO_ATTENTION_BYTES // per_sequence)

    def _last_attention_gradients(self, adapter, inputs, target: Tensor):
        """Sum over the α_k < 1 of ``∇A_{L-1}(α_k x)``, batched over steps and samples: each forward takes at
        most :meth:`ig_sequences_per_forward` interpolated inputs (whole steps of the batch when that is at
        least the batch size, else slices of the batch one step at a time)."""
        last = len(adapter.blocks) - 1
        alphas = torch.linspace(0, 1, self.steps, dtype=torch.float64)[:-1]
        if len(alphas) == 0:
            return 0
        batch = inputs.batch_size
        per_forward = max(1, self.ig_sequences_per_forward(adapter, inputs))
        samples = min(batch, per_forward)
        chunk_steps = max(1, per_forward // samples)
        parts = []
        for start in range(0, batch, samples):
            part = inputs if samples == batch else _sample_slice(inputs, start, start + samples)
            part_target = target[start:start + samples]
            foil = self.given_foil
            if isinstance(foil, Tensor) and foil.numel() > 1:
                foil = foil.reshape(-1)[start:start + samples]
            total: Union[int, Tensor] = 0
            for i in range(0, len(alphas), chunk_steps):
                chunk = alphas[i:i + chunk_steps]
                with ActivationRecorder() as rec:
                    adapter.recording.attention(rec, last, "attn", require_grad=True)
                    logits = adapter.forward(adapter.inputs.interpolate(part, chunk), grad_from_block=last)
                part_foil = foil.repeat(len(chunk)) if isinstance(foil, Tensor) and foil.numel() > 1 else foil
                score = target_score(logits, part_target.repeat(len(chunk)), self.gradient_of, part_foil)
                (grad,) = torch.autograd.grad(score, rec["attn"])
                total = total + grad.unflatten(0, (len(chunk), part.batch_size)).sum(dim=0)
            assert isinstance(total, Tensor), "no integration steps"
            parts.append(total)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def resolved_start_layer(self, adapter) -> int:
        """The 0-based first block: ``start_layer``, or the default of the model's layout
        (:attr:`default_start_layers`)."""
        if self.start_layer is not None:
            return check_start_layer(self.start_layer, adapter, self.name)
        default = self.default_start_layers[adapter.inputs.layout_class.reference]
        if default < 0:
            return max(len(adapter.blocks) + default, 0)
        return check_start_layer(default, adapter, self.name, "start_layer (default)")

    def check_adapter(self, adapter) -> None:
        self.resolved_start_layer(adapter)

    def attribute(self, adapter, inputs, target):
        layout = adapter.inputs.layout(inputs)
        start = self.resolved_start_layer(adapter)
        check_readout_space(adapter, start, inputs, self.name)
        updates, last_grad, target = self.perception_pass(adapter, inputs, target, start)
        perception = accumulate_residual(updates)
        if not self.reasoning_feedback:
            row = read_out(perception, adapter, inputs, self.readout, layout).abs()
        else:
            feedback_sum = last_grad + self._last_attention_gradients(adapter, inputs, target)
            feedback = (feedback_sum / self.steps).clamp(min=0).mean(dim=1)
            row = read_out(feedback * perception, adapter, inputs, self.readout, layout)
        return layout.output(set_class_token_score(row, adapter, layout, self.class_token_score, "zero"))


@register_method("beyond_intuition_head")
class BeyondIntuitionHead(_BeyondIntuition):
    __doc__ = (
        "Beyond Intuition, head-wise (Chen et al. 2023, 'Ours-H'): ``Ã_l = Σ_h w_h A_h`` with gradient-based head\n"
        "    weights (see ``attention_perception_headwise``) times the reasoning feedback.\n\n"
        "    Default ``start_layer``: 3 for images = the authors' 1-based 4 used by their perception test for ViT-B;\n"
        "    the last block for sequences (their BERT ``generate_ours``: ``blocks=[layer[-1]]``).\n\n    "
        + (_BeyondIntuition.__doc__ or "")
    )

    default_start_layers = {"vit": 3, "bert": -1}

    def perception_pass(self, adapter, inputs, target, start):
        layers = list(range(start, len(adapter.blocks)))
        attns, grads, _, target = attention_and_gradients(adapter, inputs, target, layers, self.gradient_of,
                                                          self.given_foil)
        layout = adapter.inputs.layout(inputs)
        positions = None   # all N x N entries; padding (a layout's flag) is left out unless include_padding
        if layout.has_padding and not self.include_padding:
            positions = layout.real_positions(attns[0])
        updates = [attention_perception_headwise(a, g, positions) for a, g in zip(attns, grads)]
        return updates, grads[-1], target


@register_method("beyond_intuition_token")
class BeyondIntuitionToken(_BeyondIntuition):
    __doc__ = (
        "Beyond Intuition, token-wise (Chen et al. 2023, 'Ours-T'): ``Ã_l = mean_h A_h diag(s)`` with the value-norm\n"
        "    token scale ``s`` (see ``attention_perception_tokenwise``) times the reasoning feedback.\n\n"
        "    Default ``start_layer``: 6 for images = the authors' 1-based 7 used by their perturbation test for\n"
        "    ViT-B; the last four blocks for sequences (their BERT ``generate_ours_c``: ``layer[-4:]``).\n"
        "    ``token_scale_denominator='attention_input'`` (alias ``'norm1_output'``) divides by the norm of the\n"
        "    attention input instead of the code's block input (``'block_input'``, default).\n"
        "    ``token_scale_values``: the value projection ``v`` of the scale is that of the attention input\n"
        "    (``'attention_input'``, default: the BERT and ViT code) or, as BI's CLIP code computes it\n"
        "    (``vproj_cal(ln_1(x))`` after ``x = x + attention(...)``), of the block's first norm applied to the\n"
        "    post-attention residual stream (``'post_attention'``; adapters with ``post_attention_values``:\n"
        "    the CLIP towers).\n\n    "
        + (_BeyondIntuition.__doc__ or "")
    )

    DENOMINATORS = ("block_input", "attention_input")
    VALUE_SOURCES = ("attention_input", "post_attention")
    DENOMINATOR_ALIASES = {"norm1_output": "attention_input"}

    default_start_layers = {"vit": 6, "bert": -4}

    def __init__(self, start_layer: Optional[int] = None, token_scale_denominator: str = "block_input",
                 token_scale_values: str = "attention_input", **options):
        token_scale_denominator = self.DENOMINATOR_ALIASES.get(token_scale_denominator, token_scale_denominator)
        if token_scale_denominator not in self.DENOMINATORS:
            raise ValueError(f"token_scale_denominator must be one of {self.DENOMINATORS} (or 'norm1_output'), "
                             f"got {token_scale_denominator!r}")
        if token_scale_values not in self.VALUE_SOURCES:
            raise ValueError(f"token_scale_values must be one of {self.VALUE_SOURCES}, got {token_scale_values!r}")
        super().__init__(start_layer=start_layer, **options)
        self.token_scale_denominator = token_scale_denominator
        self.token_scale_values = token_scale_values

    def check_adapter(self, adapter) -> None:
        super().check_adapter(adapter)
        if self.token_scale_values == "post_attention" and adapter.recording.post_attention_values is None:
            raise ValueError(f"{self.name}: token_scale_values='post_attention' (BI's CLIP code) needs a model whose "
                             f"adapter records post-attention values (the CLIP towers); {type(adapter.model).__name__} "
                             f"({adapter.family}) does not")

    def perception_pass(self, adapter, inputs, target, start):
        last = len(adapter.blocks) - 1
        layers = list(range(start, len(adapter.blocks)))
        use_attention_input = self.token_scale_denominator == "attention_input"
        record_values = (adapter.recording.values if self.token_scale_values == "attention_input"
                         else adapter.recording.post_attention_values)
        with ActivationRecorder() as rec:
            for layer in layers:
                adapter.recording.block_input(rec, layer, ("z", layer))
                record_values(rec, layer, ("v", layer))
                if use_attention_input:
                    adapter.recording.attention_input(rec, layer, ("ln", layer))
                adapter.recording.attention(rec, layer, ("a", layer), require_grad=(layer == last))
            logits = adapter.forward(inputs, grad_from_block=last)
        target = resolve_target(logits, target)
        score = target_score(logits, target, self.gradient_of, self.given_foil)
        (last_grad,) = torch.autograd.grad(score, rec[("a", last)])
        updates = [
            attention_perception_tokenwise(
                rec[("a", l)].detach(), rec[("z", l)].detach(), rec[("v", l)].detach(),
                linear_weight(adapter.linears(l).attention.out).detach(),
                rec[("ln", l)].detach() if use_attention_input else None)
            for l in layers
        ]
        return updates, last_grad, target
