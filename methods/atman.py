"""AtMan: attention manipulation (Deiseroth et al., NeurIPS 2023, "AtMan: Understanding Transformer Predictions
Through Memory Efficient Attention Manipulation", Sec. 3; the authors' code: Aleph-Alpha/AtMan,
``atman-magma/atman_magma/manipulate_attention.py``, ``explainer.py``, ``conceptual_suppression.py``,
``logit_parsing.py``).

Token ``t`` is suppressed in every block and head by scaling its key column of the pre-softmax scores ``S`` after a
shift by each query row's minimum: ``S'_ij = (S_ij - min_k S_ik) * f_j`` with ``f_t = suppression`` (0.1, the
reference's ``suppression_factor``; the paper's ``1 - f`` with ``f = 0.9``) and ``f_j = 1`` elsewhere, so not an
additive mask; a softmax is shift-invariant, so the untouched columns keep their scores. Conceptual suppression
(Sec. 3, ``conceptual_threshold``) suppresses with ``t`` every content token ``j`` whose input embedding has
cosine similarity ``s >= threshold`` with ``t``'s, with ``f_j = (1 - f)(1 - s) + f`` (``conceptual_scaled=False``:
``f_j = f``). Score of ``t``: ``y(suppressed) - y(clean)``, ``y`` the explained output (``explain``, default
``"log_probability"``: ``CE(clean) - CE(suppressed)``, the sign of ``get_delta_cross_entropies``; an important
token scores negative). ``score="drop"`` returns ``y(clean) - y(suppressed)`` (an important token scores positive, as
occlusion's: what a test that ranks the highest score first needs), ``score="squared"`` the square of the default,
the reference's ``square_outputs=True`` (its document-QA explainer; its panda example squares the values too).
Conventions, departures and the golden cases: ``docs/atman.md``.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .adapters import MethodUndefinedError, ModelAdapter, ModelInputs, PatchGrid
from .explained_output import ExplainedOutput
from .explanation_targets import explained_scores
from .input_points import point_values, resolve_point, select_rows
from .registry import register_method
from .targets import TargetType

#: what a token's score is, from ``d = y(suppressed) - y(clean)``: the authors' ``d`` (default), ``-d``, ``d ** 2``
SCORES = ("delta", "drop", "squared")


def suppressed_scores(scores: Tensor, factors: Tensor, keys: Tensor) -> Tensor:
    """AtMan's edit of pre-softmax scores ``[R, H, N, N]``: ``m + (S - m) * f`` in the columns whose factor
    ``factors`` ``[R, N]`` is not 1 (``m``: each query row's minimum over the real keys ``keys`` ``[R, N]`` bool),
    the other columns returned as they are."""
    shift = scores.masked_fill(~keys[:, None, None, :], float("inf")).amin(dim=-1, keepdim=True)
    f = factors.to(scores.dtype)[:, None, None, :]
    return torch.where(f != 1, shift + (scores - shift) * f, scores)


def cosine_matrix(embeddings: Tensor, eps: float = 1e-8) -> Tensor:
    """``[M, M]`` cosine similarities of ``embeddings`` ``[M, D]``, norms floored at ``eps``, clipped to [-1, 1]
    (the reference's ``get_similarity_matrix``)."""
    unit = embeddings / embeddings.norm(dim=-1, keepdim=True).clamp_min(eps)
    return (unit @ unit.T).clamp(-1, 1)


@register_method("atman")
class AtMan(ExplainedOutput):
    """AtMan (Deiseroth et al. 2023): per content token, a forward with its key column suppressed in every
    block's pre-softmax scores; see :mod:`methods.atman`. Options: ``suppression`` (the factor ``f``, 0.1),
    ``conceptual_threshold`` (``None``: off; the reference's ``Explainer`` default is 0.6), ``conceptual_scaled``,
    ``chunk`` (suppressed copies per forward), ``explain`` (``"log_probability"``), ``foil``, ``score``
    (:data:`SCORES`: ``"delta"``, the authors' sign, default; ``"drop"``; ``"squared"``)."""

    tags = ("perturbation", "opt_in")

    def __init__(self, suppression: float = 0.1, conceptual_threshold: Optional[float] = None,
                 conceptual_scaled: bool = True, chunk: int = 64, explain: str = "log_probability",
                 foil: Optional[int] = None, score: str = "delta"):
        super().__init__(explain, foil)
        if score not in SCORES:
            raise ValueError(f"atman: score must be one of {SCORES}, got {score!r}")
        if not (isinstance(suppression, (int, float)) and not isinstance(suppression, bool) and suppression >= 0):
            raise ValueError(f"atman: suppression must be a float >= 0, got {suppression!r}")
        if conceptual_threshold is not None and not (isinstance(conceptual_threshold, (int, float))
                                                     and 0 <= conceptual_threshold <= 1):
            raise ValueError(f"atman: conceptual_threshold must be None or in [0, 1], got {conceptual_threshold!r}")
        if not (isinstance(chunk, int) and not isinstance(chunk, bool) and chunk >= 1):
            raise ValueError(f"atman: chunk must be a positive int, got {chunk!r}")
        self.suppression = float(suppression)
        self.conceptual_threshold = None if conceptual_threshold is None else float(conceptual_threshold)
        self.conceptual_scaled = bool(conceptual_scaled)
        self.chunk = chunk
        self.score = score

    def check_adapter(self, adapter: ModelAdapter) -> None:
        super().check_adapter(adapter)
        if adapter.recording.score_edit is None:
            raise MethodUndefinedError(f"atman: {adapter.family} has no pre-softmax attention-score edit "
                                       "(adapter.recording.score_edit)")
        if self.conceptual_threshold is not None:
            resolve_point(adapter, "embedding", self.name)

    # ------------------------------------------------------------------ the suppressed copies
    def factors(self, adapter: ModelAdapter, inputs: ModelInputs, content: Tensor) -> List[Tensor]:
        """Per sample ``b``, ``[M_b, N]`` factors: row ``i`` suppresses its ``i``-th content position (and, with
        conceptual suppression, the content positions similar to it)."""
        n = content.shape[1]
        positions = [row.nonzero().flatten() for row in content.cpu()]
        embeddings = self._content_embeddings(adapter, inputs, positions) if self.conceptual_threshold is not None \
            else [None] * len(positions)
        out = []
        for p, e in zip(positions, embeddings):
            rows = torch.ones(len(p), n, dtype=torch.float64)
            rows[torch.arange(len(p)), p] = self.suppression
            if e is not None:
                rows[:, p] = self._conceptual(cosine_matrix(e.double()), rows[:, p])
            out.append(rows)
        return out

    def _conceptual(self, similarity: Tensor, factors: Tensor) -> Tensor:
        """The content columns of the factors with the similar tokens suppressed too (module docstring)."""
        f = self.suppression
        similar = similarity >= float(self.conceptual_threshold)  # type: ignore[arg-type]
        similar.fill_diagonal_(False)
        scaled = (1 - f) * (1 - similarity) + f if self.conceptual_scaled else torch.full_like(similarity, f)
        return torch.where(similar, scaled, factors)

    @staticmethod
    def _content_embeddings(adapter: ModelAdapter, inputs: ModelInputs, positions: List[Tensor]) -> List[Tensor]:
        """Per sample, its content positions' input embeddings ``[M_b, D]`` (text: the word embeddings; images:
        the patch embeddings)."""
        x = point_values(adapter, inputs, "embedding")
        if x.dim() == 4:                                    # a convolution's [B, D, rows, cols]
            x = x.flatten(2).transpose(1, 2)
        layout = adapter.inputs.layout(inputs)
        offset = layout.prefix if isinstance(layout, PatchGrid) and x.shape[1] == layout.num_scores else 0
        return [x[b, p.to(x.device) - offset] for b, p in enumerate(positions)]

    # ------------------------------------------------------------------ the call
    def attribute(self, adapter: ModelAdapter, inputs: ModelInputs, target: TargetType) -> Tensor:
        layout = adapter.inputs.layout(inputs)
        like = torch.zeros(inputs.batch_size, layout.num_positions)
        content = layout.content_positions(like)
        keys = layout.real_positions(like)
        with torch.no_grad():
            logits = _logits(adapter, inputs)
        target, foil = self.resolve(logits, target)
        clean = explained_scores(logits, target, self.explain, foil)
        factors = self.factors(adapter, inputs, content)
        jobs: List[Tuple[int, int]] = [(b, i) for b, f in enumerate(factors) for i in range(len(f))]
        positions = [row.nonzero().flatten() for row in content.cpu()]
        scores = torch.zeros(inputs.batch_size, layout.num_positions, dtype=clean.dtype, device=clean.device)
        for start in range(0, len(jobs), self.chunk):
            chunk = jobs[start:start + self.chunk]
            rows = torch.tensor([b for b, _ in chunk])
            chunk_factors = torch.stack([factors[b][i] for b, i in chunk]).to(logits.device)
            chunk_keys = keys[rows.to(keys.device)].to(logits.device)

            def edit(_layer: int, s: Tensor, f: Tensor = chunk_factors, k: Tensor = chunk_keys) -> Tensor:
                return suppressed_scores(s, f, k)

            assert adapter.recording.score_edit is not None, "check_adapter refuses a family without a score edit"
            with torch.no_grad(), adapter.recording.score_edit(edit):
                out = _logits(adapter, select_rows(inputs, rows))
            rows = rows.to(clean.device)
            values = explained_scores(out, target[rows], self.explain, None if foil is None else foil[rows])
            for (b, i), value, row in zip(chunk, values, rows):
                scores[b, positions[b][i]] = value - clean[row]
        if self.score == "drop":
            scores = 0.0 - scores                           # 0 - 0 = +0.0: the unscored positions stay +0.0
        elif self.score == "squared":
            scores = scores.square()
        return layout.output(scores)


def _logits(adapter: ModelAdapter, inputs: ModelInputs) -> Tensor:
    context = adapter.inputs.context(inputs)
    return adapter.head(adapter.run_blocks(adapter.embed(inputs), context), context)
