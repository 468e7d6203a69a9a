"""Attributions of a decoder LM's generated text: every generated token explained over the prompt and the tokens
generated before it.

    from evaluation.words import explain_generation
    result = explain_generation("attnlrp", lm, tokenizer, ["The capital of France is"], max_new_tokens=8)
    result.scores            # [B, T, N]: step t's scores over the N = prompt + generated positions
    result.generated_tokens  # per row, the generated tokens as text
    result                   # a notebook cell shows the heatmap; result.save("gen.html") writes a page

* **Decoding**: greedy (the argmax of each step's next-token logits, as ``model.generate(do_sample=False)``),
  batched over the prompts: the prompts are left padded (a tokenizer's right-padded batch is moved to the left),
  the position ids come from the mask (``attention_mask.cumsum(-1) - 1``, as ``generate`` and the decoder adapter
  count them), the logits are the adapter's (:mod:`methods.families.hf_decoder`: the model's own modules, the
  padding queries of a left-padded row kept finite). Each step recomputes the whole sequence (no key/value
  cache): the attribution of each step runs the whole sequence anyway. A row stops after ``max_new_tokens`` or
  at its first EOS token (included, explained); a finished row's later positions are padding (``pad_token_id``,
  mask 0), and decoding ends when every row has finished.
* **Attribution**: step ``t`` (0-based) of row ``b`` explains the logit of the generated token ``t`` at the last
  position of its context (the prompt and generated tokens ``0 .. t-1``: the adapter's read-out, each row's last
  real token), by one call of the method on the rows still generating at that step, the inputs cut to the
  ``P + t`` positions of the contexts (``P``: the padded prompt width). ``scores[b, t, :P + t]`` are the method's
  scores on that context: exactly 0 at the prompt's padding; ``scores[b, t, P + t:]`` (the token itself and
  later ones) are 0, and so is every step a row did not generate (``generated_mask``). A row's scores equal the
  ones it gets alone, up to float rounding (the adapter's padding guarantee).
* **Tokens as text**: ``tokenizer.decode([id])`` of each position (what a single token reads as; byte-level BPE
  pieces of a multi-byte character may show U+FFFD), ``""`` at padding.
* **HTML** (:class:`GenerationAttribution` ``.html()``, ``._repr_html_``, ``.save``): per prompt a block, one row
  per generated token (the token, then its context with each token coloured by its score on the word layer's
  diverging scale, :mod:`evaluation.words.heatmap`); every token is HTML-escaped, control and bidirectional
  characters are shown as escapes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from methods import AttributionMethod, build_method
from methods.adapters import adapter_for

from .heatmap import STYLE, escape, legend_html, page_html, score_color

GENERATION_STYLE = """
.ta-heatmap .ta-gen td.ta-text{white-space:normal}
.ta-heatmap .ta-tok{white-space:pre;border-radius:3px;padding:1px 2px;margin:0 1px;display:inline-block;
  line-height:1.5}
.ta-heatmap .ta-target{white-space:pre;outline:2px solid #333;border-radius:3px;padding:1px 2px;margin:0 1px;
  display:inline-block;line-height:1.5}
.ta-heatmap th.ta-step{text-align:right;vertical-align:top;font-weight:400;font-size:12px;padding:6px 10px 6px 0;
  white-space:nowrap;color:#555;width:1%}
"""


@dataclass
class GenerationAttribution:
    """The result of :func:`explain_generation` (``B`` prompts, ``T`` decoding steps, ``N = P + T`` positions).

    * ``scores`` ``[B, T, N]``: step ``t``'s scores over the positions (0 at padding, at positions ``>= P + t``
      and at steps a row did not generate);
    * ``input_ids`` ``[B, N]``: the left-padded prompts then the generated tokens (``pad_token_id`` after a
      row's EOS); ``attention_mask`` ``[B, N]``: 1 at the prompts' real tokens and the generated ones;
    * ``generated_ids`` ``[B, T]`` (``input_ids[:, P:]``) and ``generated_mask`` ``[B, T]`` (the steps each row
      generated); ``prompt_length``: ``P``;
    * ``tokens``: per row, the text of each of the ``N`` positions (``""`` at padding); ``generated_tokens``:
      per row, the text of its generated tokens; ``generated_text``: per row, the generated tokens decoded
      together; ``method``: the method's name.
    """

    scores: Tensor
    input_ids: Tensor
    attention_mask: Tensor
    generated_ids: Tensor
    generated_mask: Tensor
    prompt_length: int
    tokens: List[List[str]]
    generated_tokens: List[List[str]]
    generated_text: List[str]
    method: str
    options: dict = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return int(self.generated_ids.shape[1])

    def context_scores(self, row: int, step: int) -> Tensor:
        """The scores of step ``step`` of row ``row`` on the real positions of its context (prompt tokens, then
        the generated tokens before it), ``[n]``."""
        mask = self.context_mask(row, step)
        return self.scores[row, step][mask]

    def context_mask(self, row: int, step: int) -> Tensor:
        """``[N]`` bool: the real positions of the context of step ``step`` of row ``row``."""
        mask = self.attention_mask[row].bool().clone()
        mask[self.prompt_length + step:] = False
        return mask

    def html(self, scale: Union[str, float] = "row", titles: Optional[Sequence[Any]] = None,
             legend: bool = True) -> str:
        """An HTML fragment: per prompt a block, one row per generated token (see :func:`generation_html`)."""
        return generation_html(self, scale=scale, titles=titles, legend=legend)

    def _repr_html_(self) -> str:
        return self.html()

    def save(self, path: Union[str, Path], page_title: str = "Generation attributions", **options: Any) -> Path:
        """Write :meth:`html` (``options`` are its keywords) as a self-contained UTF-8 page at ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page_html(self.html(**options), page_title), encoding="utf-8")
        return path


# ------------------------------------------------------------------------------------------------ inputs
def _eos_ids(model: nn.Module, tokenizer: Any, eos_token_id: Union[int, Sequence[int], None]) -> List[int]:
    if eos_token_id is None:
        for source in (getattr(model, "generation_config", None), getattr(model, "config", None), tokenizer):
            eos_token_id = getattr(source, "eos_token_id", None)
            if eos_token_id is not None:
                break
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, int):
        return [eos_token_id]
    return [int(i) for i in eos_token_id]


def _pad_id(model: nn.Module, tokenizer: Any, eos: List[int]) -> int:
    for source in (tokenizer, getattr(model, "generation_config", None), getattr(model, "config", None)):
        pad = getattr(source, "pad_token_id", None)
        if pad is not None:
            return int(pad)
    return eos[0] if eos else 0


def left_padded(input_ids: Tensor, attention_mask: Tensor, pad_id: int) -> tuple:
    """``(input_ids, attention_mask)`` with each row's real tokens (one contiguous run) moved to the right end
    and ``pad_id`` before them; trailing all-padding columns of the batch are dropped first."""
    mask = attention_mask.long()
    lengths = mask.sum(dim=1)
    if bool((lengths == 0).any()):
        raise ValueError("explain_generation: a prompt has no tokens")
    width = int(lengths.max())
    starts = (mask * torch.arange(mask.shape[1], 0, -1, device=mask.device)).argmax(dim=1)   # first real column
    ids = torch.full((mask.shape[0], width), pad_id, dtype=torch.long, device=input_ids.device)
    new_mask = torch.zeros((mask.shape[0], width), dtype=torch.long, device=input_ids.device)
    for i, (start, length) in enumerate(zip(starts.tolist(), lengths.tolist())):
        row = mask[i, start:start + length]
        if not bool(row.all()):
            raise ValueError(f"explain_generation: prompt {i}'s real tokens are not contiguous")
        ids[i, width - length:] = input_ids[i, start:start + length]
        new_mask[i, width - length:] = 1
    return ids, new_mask


def _prompt_batch(tokenizer: Any, prompts: Any, add_special_tokens: bool, pad_id: int, device: Any) -> tuple:
    if isinstance(prompts, str):
        prompts = [prompts]
    if isinstance(prompts, Mapping):
        ids = torch.as_tensor(prompts["input_ids"])
        mask = prompts.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask)
    else:
        prompts = list(prompts)
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise TypeError("prompts must be a string, a list of strings or a tokenizer's batch (input_ids, "
                            "attention_mask)")
        rows = [tokenizer(p, add_special_tokens=add_special_tokens)["input_ids"] for p in prompts]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            if len(r):
                ids[i, width - len(r):] = torch.as_tensor(r, dtype=torch.long)
                mask[i, width - len(r):] = 1
    if ids.dim() == 1:
        ids, mask = ids[None], mask[None]
    ids, mask = left_padded(ids.long(), mask, pad_id)
    return ids.to(device), mask.to(device)


# ------------------------------------------------------------------------------------------------ decoding
@torch.no_grad()
def greedy_decode(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int,
                  eos_ids: Sequence[int], pad_id: int) -> tuple:
    """Greedy decoding of left-padded prompts through the model's adapter (position ids from the mask; no
    key/value cache). Returns ``(input_ids [B, P + T], attention_mask [B, P + T], generated_mask [B, T])``."""
    adapter = adapter_for(model)
    if adapter.readout.kind != "position" or adapter.decoder is None or not adapter.decoder.is_lm:
        raise ValueError(f"explain_generation needs a decoder language model (a causal LM with its adapter), not "
                         f"{type(model).__name__}")
    ids, mask = input_ids, attention_mask.long()
    active = torch.ones(ids.shape[0], dtype=torch.bool, device=ids.device)
    eos = torch.as_tensor(list(eos_ids), dtype=torch.long, device=ids.device)
    steps = []
    for _ in range(max_new_tokens):
        prepared = adapter.inputs.prepare({"input_ids": ids, "attention_mask": mask})
        context = adapter.inputs.context(prepared)
        logits = adapter.head(adapter.run_blocks(adapter.embed(prepared), context), context)
        token = torch.where(active, logits.argmax(dim=-1), torch.full_like(active, pad_id, dtype=torch.long))
        ids = torch.cat([ids, token[:, None]], dim=1)
        mask = torch.cat([mask, active.long()[:, None]], dim=1)
        steps.append(active.clone())
        active = active & ~torch.isin(token, eos)
        if not bool(active.any()):
            break
    generated = torch.stack(steps, dim=1) if steps else torch.zeros((ids.shape[0], 0), dtype=torch.bool,
                                                                      device=ids.device)
    return ids, mask, generated


# ------------------------------------------------------------------------------------------------ the API
def explain_generation(method: Union[str, AttributionMethod], model: nn.Module, tokenizer: Any, prompts: Any,
                       max_new_tokens: int = 20, *, eos_token_id: Union[int, Sequence[int], None] = None,
                       add_special_tokens: bool = True, **options: Any) -> GenerationAttribution:
    """Decode ``prompts`` greedily with ``model`` (a decoder LM) and explain every generated token with
    ``method`` (a registered name, built with ``options``, or an :class:`~methods.AttributionMethod`).

    ``prompts``: a string, a list of strings (tokenized one by one, ``add_special_tokens`` as the tokenizer
    adds them, e.g. Llama's BOS) or a tokenizer's batch (left or right padded); ``max_new_tokens``: the most
    tokens per row; ``eos_token_id``: the ids that end a row (default: the model's ``generation_config``, its
    config, the tokenizer's; ``[]``: never stop early). See the module docstring for the conventions.
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if isinstance(method, str):
        name = method
        method = build_method(method, **options)
    elif isinstance(method, AttributionMethod):
        if options:
            raise TypeError("options are for a method given by name; build the method with them instead")
        name = getattr(method, "name", type(method).__name__)
    else:
        raise TypeError(f"method must be a registered method's name or an AttributionMethod, got {type(method)}")
    eos = _eos_ids(model, tokenizer, eos_token_id)
    pad_id = _pad_id(model, tokenizer, eos)
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = _prompt_batch(tokenizer, prompts, add_special_tokens, pad_id, device)
    p = int(prompt_ids.shape[1])
    ids, mask, generated = greedy_decode(model, prompt_ids, prompt_mask, max_new_tokens, eos, pad_id)
    b, t_total = generated.shape
    n = p + t_total
    scores: Optional[Tensor] = None
    for t in range(t_total):
        rows = generated[:, t].nonzero().flatten()
        batch = {"input_ids": ids[rows, :p + t], "attention_mask": mask[rows, :p + t]}
        step = method(model, batch, target=ids[rows, p + t])
        if scores is None:
            scores = torch.zeros((b, t_total, n), dtype=step.dtype, device=step.device)
        scores[rows.to(scores.device), t, :p + t] = step
    if scores is None:   # pragma: no cover - max_new_tokens >= 1 always gives one step
        scores = torch.zeros((b, 0, n))
    tokens = [[_token_text(tokenizer, i) if m else "" for i, m in zip(r.tolist(), mr.tolist())]
              for r, mr in zip(ids, mask)]
    generated_tokens = [[tokens[i][p + s] for s in range(t_total) if bool(generated[i, s])] for i in range(b)]
    generated_text = [tokenizer.decode([int(x) for x, g in zip(ids[i, p:].tolist(), generated[i].tolist()) if g])
                      for i in range(b)]
    return GenerationAttribution(scores=scores, input_ids=ids, attention_mask=mask, generated_ids=ids[:, p:],
                                 generated_mask=generated, prompt_length=p, tokens=tokens,
                                 generated_tokens=generated_tokens, generated_text=generated_text, method=name,
                                 options=dict(options))


def _token_text(tokenizer: Any, token_id: int) -> str:
    return str(tokenizer.decode([int(token_id)]))


# ------------------------------------------------------------------------------------------------ HTML
def _max_abs(values: List[float]) -> float:
    return max((abs(v) for v in values if math.isfinite(v)), default=0.0)


def _fmt(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.3g}"


def _token_span(text: str, score: float, scale: float) -> str:
    r, g, b = score_color(score, scale)
    strength = 0.0 if scale <= 0 or math.isnan(score) else min(abs(score) / scale, 1.0)
    fg = "#fff" if strength > 0.55 else "#111"
    return (f'<span class="ta-tok" style="background-color:rgb({r},{g},{b});color:{fg}" '
            f'title="{escape(repr(text))}: {_fmt(score)}">{escape(text)}</span>')


def generation_html(result: GenerationAttribution, *, scale: Union[str, float] = "row",
                    titles: Optional[Sequence[Any]] = None, legend: bool = True) -> str:
    """An HTML fragment (with its own ``<style>``) of ``result``: per prompt a block (title: ``titles[i]`` or
    the method's name), one table row per generated token: the step, the token (outlined), then its context's
    tokens coloured by their scores. ``scale``: ``"row"`` (each step by its own largest absolute score),
    ``"example"`` (one scale per prompt) or a positive number (the word layer's diverging colours)."""
    if isinstance(scale, str):
        if scale not in ("row", "example"):
            raise ValueError(f"scale must be 'row', 'example' or a positive number, got {scale!r}")
    elif not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be 'row', 'example' or a positive number, got {scale!r}")
    b = int(result.scores.shape[0])
    if titles is not None and len(titles) != b:
        raise ValueError(f"{len(titles)} titles for {b} prompts")
    parts = [f"<style>{STYLE}{GENERATION_STYLE}</style>", '<div class="ta-heatmap">']
    if legend:
        parts.append(legend_html(scale, unscored=False, where="under each step's number"))
    scores = result.scores.detach().double().cpu()
    for i in range(b):
        title = titles[i] if titles is not None else f"{result.method}: prompt {i}"
        steps = [s for s in range(result.num_steps) if bool(result.generated_mask[i, s])]
        rows = []
        for s in steps:
            mask = result.context_mask(i, s).cpu()
            positions = mask.nonzero().flatten().tolist()
            rows.append((s, positions, scores[i, s, positions].tolist()))
        example_scale = max((_max_abs(v) for _, _, v in rows), default=0.0)
        parts.append(f'<div class="ta-example ta-gen"><div class="ta-header"><span class="ta-title">'
                     f"{escape(title)}</span><span>generated: <b>{escape(result.generated_text[i])}</b></span>"
                     "</div><table>")
        for s, positions, values in rows:
            if isinstance(scale, str):
                row_scale = example_scale if scale == "example" else _max_abs(values)
            else:
                row_scale = float(scale)
            shown = row_scale if row_scale > 0 else 1.0
            target = result.tokens[i][result.prompt_length + s]
            context = "".join(_token_span(result.tokens[i][p], v, shown) for p, v in zip(positions, values))
            parts.append(f'<tr><th class="ta-step">{s}<span class="ta-scale">\u00b1{escape(_fmt(row_scale))}'
                         f'</span></th><td class="ta-text">{context}<span class="ta-target" '
                         f'title="explained: {escape(repr(target))}">{escape(target)}</span></td></tr>')
        if not rows:
            parts.append('<tr><td class="ta-text"><span class="ta-empty">(nothing generated)</span></td></tr>')
        parts.append("</table></div>")
    parts.append("</div>")
    return "".join(parts)
