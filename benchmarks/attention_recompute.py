#!/usr/bin/env python
"""Time and memory of recomputing each block's attention in the backward, against keeping it (issue 26, item 6).

    python benchmarks/attention_recompute.py [--device cuda] [--seq-lens 1024 2048] [--batch-sizes 1 8]
                                             [--methods generic_attribution transformer_attribution] [--repeats 5]

On ``benchmarks/methods.py``'s Llama-shaped decoder (``--family llama``; ``--model-size tiny`` for smoke tests),
per sequence length and batch size, in one process: each method with ``recompute_attention=True`` (the default:
the forward saves no block's probabilities, the backward recomputes them) and ``False`` (the forward's eager
attention keeps them for the backward), and the forward+backward anchor of ``methods.py``. Each gets one untimed
call that also measures its peak extra memory (CUDA: ``max_memory_allocated`` increase; not measured on the CPU),
then ``--repeats`` rounds of (anchor, recompute, keep), interleaved so that drift hits all three alike; medians.
The two variants' scores are checked to be equal bit for bit on every call's first round. The process keeps the
memory it frees (``methods.cpu_memory.retain_freed_memory``), as ``methods.py``'s workers and ``evaluate.py`` do.
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

VARIANTS = {"recompute": True, "keep": False}


def _call(method, model, inputs, targets):
    return lambda: method(model, inputs, target=targets)


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model-size", choices=sorted(bench.LLAMA_SIZES), default="base")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 2048])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--methods", nargs="+", default=["generic_attribution", "transformer_attribution"])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)

    from methods import build_method
    from methods.cpu_memory import retain_freed_memory

    retain_freed_memory()   # as methods.py's workers, evaluate.py and train.py run (CPU: no fresh pages per map)
    model = bench.build_model(args.model_size, args.device, "llama")
    rows = []
    print("| method | N | batch | fwd+bwd ms | recompute: ratio | keep: ratio | recompute: peak / fwd+bwd's | "
          "keep: peak / fwd+bwd's |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.seq_lens:
        for batch in args.batch_sizes:
            gen = torch.Generator().manual_seed(0)
            inputs, targets, _ = bench.build_inputs("llama", args.model_size, batch, n, gen, args.device)
            anchor = bench._anchor_fn(bench.FORWARD_BACKWARD, model, inputs, targets)
            _, anchor_peak, _ = bench._first_call_with_memory(anchor, args.device, False)
            for name in args.methods:
                calls = {v: _call(build_method(name, recompute_attention=flag), model, inputs, targets)
                         for v, flag in VARIANTS.items()}
                peaks = {v: bench._first_call_with_memory(fn, args.device, False)[1] for v, fn in calls.items()}
                if not torch.equal(calls["recompute"](), calls["keep"]()):
                    raise AssertionError(f"{name}: recompute_attention=True and False differ at N={n}")
                times = {v: [] for v in ["anchor", *calls]}
                for _ in range(args.repeats):
                    times["anchor"].append(bench._timed(anchor, args.device))
                    for v, fn in calls.items():
                        times[v].append(bench._timed(fn, args.device))
                med = {v: statistics.median(t) for v, t in times.items()}
                row = dict(method=name, seq_len=n, batch=batch, anchor_ms=1000 * med["anchor"],
                           ratio={v: med[v] / med["anchor"] for v in calls},
                           peak_mib=peaks, anchor_peak_mib=anchor_peak)
                rows.append(row)
                mem = {v: "-" if anchor_peak is None or peaks[v] is None else f"{peaks[v] / anchor_peak:.2f}"
                       for v in calls}
                print(f"| {name} | {n} | {batch} | {row['anchor_ms']:.1f} | {row['ratio']['recompute']:.2f} | "
                      f"{row['ratio']['keep']:.2f} | {mem['recompute']} | {mem['keep']} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
