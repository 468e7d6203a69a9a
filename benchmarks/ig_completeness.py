#!/usr/bin/env python
"""How many integration steps Integrated Gradients needs on a real LM: its completeness gap against the step count,
and the straight-line path's profile that explains it.

    python benchmarks/ig_completeness.py                                   # gguf:smollm2, float64, 16 ... 8000 steps
    python benchmarks/ig_completeness.py --steps 16 50 200 --method riemann_trapezoid
    python benchmarks/ig_completeness.py --model hf:/path/to/causal-lm --prompt "The capital of France is"

The model is loaded in float32 and computed in float64 (``.double()``), so the gap is the quadrature's, not the
arithmetic's. Integrated gradients (``methods.integrated_gradients``, default baseline ``auto``: the ``pad`` id on an
RMSNorm decoder) explains the predicted next token of the prompt; per step count it prints ``sum_t a_t``, the
baseline's gap ``y(x) - y(x')`` (``x'``: every token replaced by the pad id, as the baseline does for a prompt
without special tokens) and the relative gap ``(sum - (y(x) - y(x'))) / (y(x) - y(x'))`` (Sundararajan et al. 2017,
Prop. 1). Then the path: ``y(x' + a (x - x'))`` on ``--grid`` points of ``[0, 1]`` (forwards only) and the largest
changes of ``y`` between neighbouring points, which is where a quadrature with too few nodes misses mass.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional

import torch

if __name__ == "__main__":
    # Run as a script, this file's folder is sys.path[0] and its name would shadow the ``methods`` package.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    sys.path.insert(0, os.path.dirname(_here))

import models  # noqa: E402,F401 - registers the model sources
from methods import build_method  # noqa: E402
from models.sources import load_model, load_tokenizer  # noqa: E402

STEPS = (16, 50, 200, 800, 2000, 4000, 8000)


def path_profile(model: torch.nn.Module, ids: torch.Tensor, pad_id: int, target: int, grid: int,
                 chunk: int = 250) -> torch.Tensor:
    """``y(x' + a (x - x'))`` of the ``target`` logit at the last position for ``grid`` points ``a`` of ``[0, 1]``."""
    table = model.get_input_embeddings().weight
    x, start = table[ids[0]], table[torch.full_like(ids[0], pad_id)]
    alphas = torch.linspace(0, 1, grid, dtype=torch.float64)
    values = []
    with torch.no_grad():
        for i in range(0, grid, chunk):
            a = alphas[i:i + chunk, None, None].to(x.dtype)
            values.append(model(inputs_embeds=start[None] + a * (x - start)[None]).logits[:, -1, target])
    return torch.cat(values)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gguf:smollm2")
    parser.add_argument("--prompt", default="The capital of France is")
    parser.add_argument("--steps", type=int, nargs="+", default=list(STEPS))
    parser.add_argument("--method", default="gausslegendre")
    parser.add_argument("--grid", type=int, default=2001)
    parser.add_argument("--internal-batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model = load_model(args.model, model_kwargs={"dtype": torch.float32}).double().eval()
    tokenizer = load_tokenizer(args.model)
    ids = tokenizer([args.prompt], return_tensors="pt")["input_ids"]
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    pad_id = int(model.config.pad_token_id)
    with torch.no_grad():
        logits = model(**inputs).logits[0, -1]
        target = int(logits.argmax())
        y = float(logits[target])
        start = model(input_ids=torch.full_like(ids, pad_id), attention_mask=inputs["attention_mask"])
        y0 = float(start.logits[0, -1, target])
    gap = y - y0
    print(f"{args.model}, prompt {args.prompt!r} ({ids.shape[1]} tokens), target {tokenizer.decode([target])!r}: "
          f"y(x) {y:.4f}, y(x') {y0:.4f}, y(x) - y(x') {gap:.4f}\n")
    print(f"| {args.method} steps | sum of the scores | relative gap | scores | seconds |\n|---|---|---|---|---|")
    for steps in args.steps:
        began = time.time()
        method = build_method("integrated_gradients", steps=steps, method=args.method,
                              internal_batch_size=args.internal_batch_size)
        scores = method(model, inputs, target=torch.tensor([target]))[0]
        total = float(scores.sum())
        print(f"| {steps} | {total:.4f} | {(total - gap) / gap:+.2e} | {[round(v, 3) for v in scores.tolist()]} | "
              f"{time.time() - began:.0f} |", flush=True)
    profile = path_profile(model, ids, pad_id, target, args.grid)
    changes = profile.diff()
    top = changes.abs().topk(min(6, len(changes))).indices.tolist()
    spacing = 1.0 / (args.grid - 1)
    print(f"\npath on {args.grid} points (spacing {spacing:.1e}): y from {float(profile[0]):.3f} to "
          f"{float(profile[-1]):.3f}, range {float(profile.min()):.3f} .. {float(profile.max()):.3f}; largest changes "
          "between neighbours (a, dy): " + ", ".join(f"({i * spacing:.4f}, {float(changes[i]):+.3f})" for i in top))


if __name__ == "__main__":
    main()
