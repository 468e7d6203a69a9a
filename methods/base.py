"""The call shape every attribution method shares: ``method(model, inputs, target=None, sample_ids=None)``."""
from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Optional, Tuple

from torch import Tensor, nn

from .adapters import ModelAdapter, ModelInputs, RawInputs, SampleIds, adapter_for
from .model_state import preserved_model_state
from .precision import Accumulate, compute_dtype, computed_in, result_dtype
from .targets import TargetType


class AttributionMethod:
    """Base class. Subclasses implement :meth:`attribute` and declare their kind.

    * ``class_specific``: whether the result depends on ``target``.

    * ``reads_foil``: whether the call reads a ``foil`` (a contrastive explanation target,
      :mod:`methods.explanation_targets`).

    ``__call__(model, inputs, target=None, sample_ids=None, foil=None, embedding_offset=None)``:

    * ``inputs``: a tensor (normalised images ``[B, 3, H, W]``) or a mapping of tensors as a tokenizer or
      processor returns it (``{"pixel_values"}``, ``{"input_ids", "attention_mask", ...}``);
    * ``target``: ``None`` (each sample's predicted class), an ``int`` or a ``LongTensor[B]``;
    * ``sample_ids``: optional per-sample ids (``LongTensor[B]``, e.g. dataset indices), for methods whose
      output is a function of the sample's identity (the random baseline);
    * ``embedding_offset``: optional ``[B, N, D]`` shift of each sample's input embedding (the adapter's
      ``rule_map.input_embedding()`` output; token inputs), seen by every forward the method runs, whatever rows it
      regroups; rows it builds itself (a baseline) have none (:mod:`methods.adapters.embedding_offset`).

    It resolves the model's adapter (once per model), checks the options against it (:meth:`check_adapter`;
    :meth:`check` does the same before any batch), validates the inputs, runs :meth:`attribute` with the
    model in eval mode and eager attention (unless the method never reads attention probabilities:
    :attr:`reads_attention`) inside :func:`preserved_model_state` (the model comes back exactly as
    it was), and returns raw scores in the layout of the inputs (``adapter.inputs.layout``): ``[B, P]`` patch scores
    in row-major grid order for images (full ``lrp``: ``[B, H, W]`` pixel maps), ``[B, N]`` per input position
    for sequences with padding exactly 0; in float32 (float64 for float64 images, or token ids into a float64
    model) and on the inputs' device. ``accumulate_dtype`` (every method's option, :mod:`methods.precision`):
    the precision the call computes in, at least float32 by default (full ``lrp``: float64).
    """

    name: str = "?"
    class_specific: bool = True
    #: labels to select methods by (``methods.available_methods(tag=...)``; ``"opt_in"``: left out of
    #: ``methods: null``)
    tags: Tuple[str, ...] = ()
    #: options holding a 0-based block index (negative values count from the end), checked against the depth
    layer_options: Tuple[str, ...] = ()
    #: whether the method reads the attention probabilities (then the call runs with eager attention; a method
    #: that never does keeps the model's fused / sdpa attention)
    reads_attention: bool = True
    #: the ``foil`` of the call in progress (``None`` outside a call)
    call_foil: TargetType = None

    @property
    def reads_foil(self) -> bool:
        """Whether the call reads a ``foil`` (a method built with a contrastive ``explain`` says so)."""
        return False
    #: the precision the call computes in (:mod:`methods.precision`; ``None``: at least float32, ``"model"``: the
    #: model's own); set by ``build_method(name, accumulate_dtype=...)``
    accumulate_dtype: Accumulate = None

    def __call__(self, model: nn.Module, inputs: RawInputs, target: TargetType = None,
                 sample_ids: SampleIds = None, foil: TargetType = None,
                 embedding_offset: Optional[Tensor] = None) -> Tensor:
        if foil is not None and not self.reads_foil:
            raise ValueError(f"{self.name}: foil= is read only by a method built with a contrastive explanation "
                             "target (explain='logit_difference' or 'probability_difference')")
        adapter = adapter_for(model)
        self.check_adapter(adapter)
        batch = adapter.inputs.prepare(inputs, sample_ids=sample_ids)
        if embedding_offset is not None:
            batch = batch.offset_by(embedding_offset)
        returned = result_dtype(batch.score_dtype)
        compute = compute_dtype(model, self.accumulate_dtype)
        attention = adapter.recording.eager_attention() if self.reads_attention else contextlib.nullcontext()
        self.call_foil = foil
        try:
            with preserved_model_state(model), computed_in(model, compute), attention:
                if compute is not None:   # the floating inputs (pixels) and the scores follow the compute dtype
                    batch = replace(batch, score_dtype=compute, tensors={
                        k: v.to(compute) if v.is_floating_point() else v for k, v in batch.tensors.items()})
                scores = self.attribute(adapter, batch, target)
        finally:
            self.call_foil = None
        layout = adapter.inputs.layout(batch)
        if layout.has_padding and scores.dim() == 2:
            scores = layout.output(scores)  # padding exactly 0, whatever the method computed there
        return scores.detach().to(dtype=returned, device=batch.device)

    def check(self, model: nn.Module) -> None:
        """Whether this method's options fit ``model``, before any batch (the evaluation module calls it right
        after loading the model; every call checks again): ``ValueError`` naming the method, the option and the
        model otherwise (:meth:`check_adapter`)."""
        self.check_adapter(adapter_for(model))

    def check_adapter(self, adapter: ModelAdapter) -> None:
        """Every block index of :attr:`layer_options` within ``[-depth, depth)``; a subclass adds the options
        that need a capability the adapter declares (a flag of :class:`~methods.adapters.ModelAdapter`)."""
        for option in self.layer_options:
            value = getattr(self, option)
            if value is not None:
                check_start_layer(value, adapter, self.name, option)

    def attribute(self, adapter: ModelAdapter, inputs: ModelInputs, target: TargetType) -> Tensor:
        """Raw scores of ``inputs`` (validated by the adapter) for ``target``; see :meth:`__call__`."""
        raise NotImplementedError

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in sorted(vars(self).items()) if not k.startswith("_"))
        return f"{type(self).__name__}({opts})"


def check_start_layer(start_layer: int, adapter: ModelAdapter, name: str, option: str = "start_layer") -> int:
    """Validate a 0-based block index (negative values count from the end, -1 = the last block) of method
    ``name``'s ``option`` on ``adapter``'s model; the index from the front."""
    depth = len(adapter.blocks)
    if not -depth <= start_layer < depth:
        raise ValueError(f"{name}: {option}={start_layer} is outside {type(adapter.model).__name__} with {depth} "
                         f"blocks (valid: {-depth} to {depth - 1}, negative values count from the end)")
    return start_layer % depth
