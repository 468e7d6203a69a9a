#!/usr/bin/env python
"""The floor under the attention-reading methods: the model's own eager attention against its fused sdpa.

    python benchmarks/eager_floor.py [--device cpu] [--seq-lens 1024 2048] [--repeats 4]

A method that reads attention probabilities runs the stock model's eager attention (sdpa never materialises
them), while ``benchmarks/methods.py``'s anchors run sdpa. On ``methods.py``'s Llama-shaped decoder (``--model-size
tiny`` for smoke tests), per sequence length, in one process (freed memory kept, as ``methods.py``'s workers
and ``evaluate.py`` run): the no-grad forward with ``sdpa``, the same forward with ``eager`` and ``rollout`` (the
cheapest attention-reading method), one warm-up each, then ``--repeats`` interleaved rounds; medians. ``eager /
sdpa`` is what any method built on the stock eager attention pays before its own work; ``rollout / eager`` is
rollout's own work.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

if __name__ == "__main__":
    # Run as a script, this file's folder is sys.path[0] and its name would shadow the ``methods`` package.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    sys.path.insert(0, os.path.dirname(_here))

from benchmarks import methods as bench  # noqa: E402 - after the path set-up above


def _forward(model, inputs, implementation: str):
    def run():
        before = model.config._attn_implementation
        model.config._attn_implementation = implementation
        try:
            with torch.no_grad():
                return model(**inputs, logits_to_keep=1).logits
        finally:
            model.config._attn_implementation = before
    return run


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model-size", choices=sorted(bench.LLAMA_SIZES), default="base")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 2048])
    p.add_argument("--repeats", type=int, default=4)
    args = p.parse_args(argv)

    from methods import build_method
    from methods.cpu_memory import retain_freed_memory

    retain_freed_memory()
    model = bench.build_model(args.model_size, args.device, "llama")
    rollout = build_method("rollout")
    rows = []
    print("| N | sdpa forward ms | eager / sdpa | rollout / sdpa | rollout / eager |")
    print("|---|---|---|---|---|")
    for n in args.seq_lens:
        inputs, targets, _ = bench.build_inputs("llama", args.model_size, 1, n, torch.Generator().manual_seed(0),
                                                args.device)
        calls = {"sdpa": _forward(model, inputs, "sdpa"), "eager": _forward(model, inputs, "eager"),
                 "rollout": lambda inputs=inputs, targets=targets: rollout(model, inputs, target=targets)}
        for call in calls.values():
            call()
        times = {name: [] for name in calls}
        for _ in range(args.repeats):
            for name, call in calls.items():
                times[name].append(bench._timed(call, args.device))
        med = {name: statistics.median(t) for name, t in times.items()}
        row = dict(seq_len=n, sdpa_ms=1000 * med["sdpa"], eager_over_sdpa=med["eager"] / med["sdpa"],
                   rollout_over_sdpa=med["rollout"] / med["sdpa"], rollout_over_eager=med["rollout"] / med["eager"])
        rows.append(row)
        print(f"| {n} | {row['sdpa_ms']:.0f} | {row['eager_over_sdpa']:.2f} | {row['rollout_over_sdpa']:.2f} | "
              f"{row['rollout_over_eager']:.2f} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
