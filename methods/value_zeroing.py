"""Value Zeroing (Mohebbi, Zuidema, Chrupała & Alishahi, "Quantifying Context Mixing in Transformers", EACL 2023).

For block ``l`` and token ``j`` the block is run again on its own input ``x^{l}`` with token ``j``'s value vectors
set to 0 in every head (``Recording.value_edit``), and every output moves:
``C^l_{ij} = d(x~^{l+1}_i(¬j), x^{l+1}_i)``, ``d`` the cosine distance (default) or the Euclidean distance;
each row ``i`` is then divided by its sum. Every block reuses its own clean input, so the whole map costs one
forward (the clean states, block by block) plus ``N`` single-block runs per block: ``N + 1`` forwards in all,
the zeroed tokens batched (``chunk`` of them per pass, each pass ``chunk x B`` sequences). The reference
conventions (``convention``), read from the two reference implementations:

* ``authors`` (hmohebbi/ValueZeroing ``scoring/value_zeroing.py``, encoders): every position zeroed, scikit-learn's
  ``cosine_distances`` (clipped to ``[0, 2]``), rows divided by their sums; rollout
  (``compute_joint_attention(res=False)``): the plain product ``C^{L-1} ... C^{0}``, no identity added;
* ``inseq`` (Inseq ``attr/feat/ops/value_zeroing.py``, decoders): causal (an entry above the diagonal, a token
  that cannot reach the output, is 0), entries below ``1e-5`` set to 0 before the rows are divided by their sums
  (a zero row divided by 1), and the last block's states read after the model's final norm (Inseq compares the
  model's last hidden state, which Hugging Face decoders return normed; read through the decoder head's
  pre-logits, so decoders only);
* ``auto`` (default): ``inseq`` on the families with a ``ModelAdapter.decoder``,
  ``authors`` elsewhere.

Padding is never zeroed and never scored (its rows and columns are 0 before the rows are normalised), so a
padded row gets the map it gets alone.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import torch
from torch import Tensor

from .adapters import MethodUndefinedError, ModelAdapter, ModelInputs, SequenceContext
from .base import AttributionMethod, check_start_layer
from .readout import check_readout, read_out
from .registry import register_method
from .rollout import ReadoutRollout, row_times

DISTANCES = ("cosine", "euclidean")
CONVENTIONS = ("auto", "authors", "inseq")
#: Inseq's ``min_score_threshold``: entries below it are set to 0 before the rows are normalised
INSEQ_THRESHOLD = 1e-5


def token_distance(moved: Tensor, clean: Tensor, distance: str) -> Tensor:
    """Per-position distance ``[...]`` of ``moved`` from ``clean`` (``[..., D]``, broadcast): ``cosine``, ``1 -``
    the cosine, clipped to ``[0, 2]`` as scikit-learn's ``cosine_distances``, computed as ``|u - v|^2 / 2`` of the
    unit vectors (equal in exact arithmetic; no cancellation when the outputs barely move); ``euclidean``, the L2
    norm of the difference."""
    if distance == "euclidean":
        return (moved - clean).norm(dim=-1)
    unit = moved / moved.norm(dim=-1, keepdim=True)
    clean_unit = clean / clean.norm(dim=-1, keepdim=True)
    return (0.5 * (unit - clean_unit).square().sum(dim=-1)).clamp(0, 2)


def final_normed(adapter: ModelAdapter, name: str) -> Callable[[Tensor], Tensor]:
    """A decoder's final norm (``Decoder.final_norm``), applied at every position
    ``[S, N, D]`` (the ``inseq`` convention's last block); ``ValueError`` on the other families."""
    if adapter.decoder is None:
        raise ValueError(f"{name}: convention='inseq' reads the last block after a decoder's final norm; "
                         f"{type(adapter.model).__name__} ({adapter.family}) is not a decoder")
    return adapter.decoder.final_norm()


def _zeroing_edit(layer: int, zeroed: Tensor) -> Callable[[int, Tensor], Tensor]:
    """The value edit of block ``layer`` that sets, in sequence ``s``, the values of the positions ``zeroed[s]``
    (bool ``[S, N]``) to 0 in every head."""
    def edit(at: int, values: Tensor) -> Tensor:
        return values.masked_fill(zeroed[:, :, None, None], 0) if at == layer else values
    return edit


def zeroing_distances(adapter: ModelAdapter, hidden: Tensor, clean: Tensor, context: SequenceContext, layer: int,
                      columns: Tensor, distance: str, chunk: int,
                      after: Optional[Callable[[Tensor], Tensor]] = None) -> Tensor:
    """``[B, N, N]``: entry ``(i, j)`` the distance of position ``i``'s output of block ``layer`` (input ``hidden``
    ``[B, N, D]``, clean output ``clean``) from its output with position ``j``'s values zeroed, for the
    positions ``j`` in ``columns`` (0 elsewhere); ``chunk`` zeroed positions per pass; ``after``: applied to both
    outputs before the distance (the final norm of Inseq's last block)."""
    batch, n = hidden.shape[:2]
    assert adapter.recording.value_edit is not None, "check_adapter refuses a family without a value edit"
    matrix = hidden.new_zeros(batch, n, n)
    reference = clean if after is None else after(clean)
    for part in columns.split(chunk):
        copies = len(part)
        zeroed = torch.zeros(copies, n, dtype=torch.bool, device=hidden.device)
        zeroed[torch.arange(copies, device=hidden.device), part.to(hidden.device)] = True
        with adapter.recording.value_edit(_zeroing_edit(layer, zeroed.repeat_interleave(batch, dim=0))):
            moved = adapter.run_blocks(hidden.repeat(copies, 1, 1), context.repeat(copies), layer, layer + 1)
        if after is not None:
            moved = after(moved)
        d = token_distance(moved.unflatten(0, (copies, batch)), reference[None], distance)   # [c, B, N]
        matrix[:, :, part.to(hidden.device)] = d.permute(1, 2, 0).to(matrix.dtype)
    return matrix


@register_method("value_zeroing")
class ValueZeroing(AttributionMethod):
    """Value Zeroing (Mohebbi et al. 2023, §3): ``C^l_{ij} = d(x~^{l+1}_i(¬j), x^{l+1}_i)``, row-normalised.

    Each block's matrix ``[B, N, N]`` (module docstring; :meth:`matrices` returns them all) from block ``x^l``'s
    own clean input, token ``j``'s value vectors zeroed in every head, bias included (the reference zeroes
    ``value_layer[:, :, j]`` after the projection). ``distance``: ``cosine`` (default) or ``euclidean``. The map:
    the read-out row (:func:`methods.readout.read_out`, ``readout``) of block ``layer``'s matrix (default the
    last), or with ``rollout`` of the product ``C^{layer} ... C^{0}`` (the authors' ``res=False``; with
    ``rollout_residual`` each factor gets the identity and is row-normalised again, their ``res=True``).
    ``convention``: ``authors`` / ``inseq`` / ``auto`` (module docstring). ``chunk``: zeroed tokens per pass
    (memory: ``chunk x B`` sequences through one block). Class-agnostic; no gradients. The reference departs
    from the paper only in the Inseq conventions (threshold, final norm); Inseq's ``euclidean`` (``torch.cdist``
    of the two states, ``1 -`` it) does not run: ours is the paper's distance ``||x~_i - x_i||``.
    """

    class_specific = False
    layer_options = ("layer",)
    tags = ("perturbation", "opt_in")

    def __init__(self, distance: str = "cosine", rollout: bool = False, rollout_residual: bool = False,
                 layer: int = -1, chunk: int = 16, convention: str = "auto", readout: str = "auto"):
        if distance not in DISTANCES:
            raise ValueError(f"value_zeroing: distance must be one of {DISTANCES}, got {distance!r}")
        if convention not in CONVENTIONS:
            raise ValueError(f"value_zeroing: convention must be one of {CONVENTIONS}, got {convention!r}")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"value_zeroing: chunk must be a positive number of zeroed tokens per pass, got {chunk!r}")
        if rollout_residual and not rollout:
            raise ValueError("value_zeroing: rollout_residual=True needs rollout=True")
        self.distance = distance
        self.rollout = bool(rollout)
        self.rollout_residual = bool(rollout_residual)
        self.layer = layer
        self.chunk = chunk
        self.convention = convention
        self.readout = check_readout(readout)

    def check_adapter(self, adapter: ModelAdapter) -> None:
        super().check_adapter(adapter)
        if adapter.recording.value_edit is None:
            raise MethodUndefinedError(
                f"{self.name}: {type(adapter.model).__name__} ({adapter.family}) gives no edit of its value vectors "
                "(adapter.recording.value_edit): its attention computes the values where no hook reaches them, or "
                "in windows")
        if self._convention(adapter) == "inseq":
            final_normed(adapter, self.name)

    def _convention(self, adapter: ModelAdapter) -> str:
        if self.convention == "auto":
            return "inseq" if adapter.decoder is not None else "authors"
        return self.convention

    def matrices(self, adapter: ModelAdapter, inputs: ModelInputs) -> List[Tensor]:
        """Blocks ``0 ... layer``'s row-normalised matrices ``[B, N, N]`` (query rows ``i``, zeroed columns ``j``;
        0 at padding rows and columns)."""
        last = check_start_layer(self.layer, adapter, self.name, "layer")
        inseq = self._convention(adapter) == "inseq"
        context = adapter.inputs.context(inputs)
        layout = adapter.inputs.layout(inputs)
        hidden = adapter.embed(inputs)
        real = layout.real_positions(hidden[..., 0]).to(hidden.device)
        columns = real.any(dim=0).nonzero().flatten()
        keep = (real[:, :, None] & real[:, None, :]).to(hidden.dtype)
        if adapter.decoder is not None:
            keep = keep.tril()
        first = last if not self.rollout else 0
        with torch.no_grad():
            hidden = adapter.run_blocks(hidden, context, 0, first)
            found = []
            for layer in range(first, last + 1):
                clean = adapter.run_blocks(hidden, context, layer, layer + 1)
                after = final_normed(adapter, self.name) if inseq and layer == len(adapter.blocks) - 1 else None
                m = zeroing_distances(adapter, hidden, clean, context, layer, columns, self.distance, self.chunk,
                                      after) * keep
                if inseq:
                    m = m.masked_fill(m < INSEQ_THRESHOLD, 0)
                sums = m.sum(dim=-1, keepdim=True)
                found.append(m / torch.where(sums == 0, torch.ones_like(sums), sums))
                hidden = clean
        return found

    def attribute(self, adapter, inputs, target):
        layout = adapter.inputs.layout(inputs)
        blocks = self.matrices(adapter, inputs)
        read = lambda m: read_out(m, adapter, inputs, self.readout, layout)   # noqa: E731
        if not self.rollout:
            return layout.output(read(blocks[-1]))
        if self.rollout_residual:
            composed = ReadoutRollout(row_normalize=True, read=read)
            for m in reversed(blocks):
                composed.add(m)
            return layout.output(composed.row())
        row = read(blocks[-1]).to(torch.float64)
        for m in reversed(blocks[:-1]):
            row = row_times(row, m)
        return layout.output(row.to(blocks[-1].dtype))
