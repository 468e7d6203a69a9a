#!/usr/bin/env python
"""How a method's peak memory grows with depth: whether it holds more than one layer's ``N x N`` attention at a time.

    python benchmarks/depth_memory.py [--seq-len 1024] [--depths 1 2 4 8] [--methods rollout gradcam ...]

Model: a random narrow ``LlamaForCausalLM`` (width 64, 8 query heads, 2 key/value heads, MLP 128, vocabulary 1000)
so that the attention maps dominate: one layer's probabilities ``[1, 8, N, N]`` in float32 are ``32 N^2`` bytes
(32 MiB at N = 1024), a head mean ``[1, N, N]`` 4 MiB, every other activation ``O(N * 64)``. Each (method, depth)
runs one call in a fresh process (batch 1, the next token at the last position explained, a random target); the
peak resident memory increase during the call is measured as ``benchmarks/methods.py`` does (``VmHWM`` reset).
The slope of peak memory over depth, in units of one layer's ``H N^2`` probabilities, says how many per-layer
maps a method keeps: about 0 (one layer at a time), about ``1 / H`` (a head mean per layer), about 1 or more
(each layer's full attention, e.g. saved for a backward through the eager attention).

``--glibc-malloc``: ``retain`` (default) keeps the freed memory in the process as ``evaluate.py`` does
(``methods/cpu_memory.py``): every map comes from one heap that never shrinks, so the peak also counts the heap's
fragmentation, which varies between identical runs (up to 2x here). ``default`` leaves glibc's thresholds: a
``[1, H, N, N]`` map of 32 MiB or more gets its own ``mmap`` and is unmapped when freed, so the peak is that of
the live tensors (the number of maps a method holds).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

if __name__ == "__main__":
    # Run as a script, this file's folder is sys.path[0] and its name would shadow the ``methods`` package.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    sys.path.insert(0, os.path.dirname(_here))

from benchmarks import methods as bench  # noqa: E402 - after the path set-up above

METHODS = ["raw_attention", "rollout", "gradcam", "generic_attribution", "transformer_attribution", "lrp_rollout",
           "partial_lrp", "attnlrp", "cp_lrp"]
ANCHOR = "forward+backward"
HEADS = 8


def _worker(spec: dict) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from methods.cpu_memory import retain_freed_memory

    if spec.get("glibc_malloc", "retain") == "retain":
        retain_freed_memory()
    torch.set_num_threads(int(spec["threads"]))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=int(spec["depth"]),
                         num_attention_heads=HEADS, num_key_value_heads=2, intermediate_size=128,
                         max_position_embeddings=max(8192, int(spec["seq_len"])), bos_token_id=1, eos_token_id=2,
                         pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    n = int(spec["seq_len"])
    ids = torch.randint(3, 1000, (1, n))
    ids[:, 0] = 1
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    target = torch.randint(0, 1000, (1,))
    if spec["name"] == ANCHOR:
        fn = bench._anchor_fn(ANCHOR, model, inputs, target)
    else:
        from methods import build_method

        method = build_method(spec["name"])

        def fn():
            return method(model, inputs, target=target)
    seconds, peak, note = bench._first_call_with_memory(fn, "cpu", True)
    return dict(name=spec["name"], depth=int(spec["depth"]), seq_len=n, peak_mib=peak, seconds=seconds, note=note)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--depths", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--methods", nargs="+", default=METHODS)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--glibc-malloc", choices=("retain", "default"), default="retain",
                   help="retain (default): keep freed memory in the process, as evaluate.py does; default: glibc's "
                        "thresholds (the peak of the live tensors)")
    p.add_argument("--json", default=None)
    p.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_worker-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._worker is not None:
        result = _worker(json.loads(args._worker))
        with open(args._worker_out, "w") as f:
            json.dump(result, f)
        return result
    results = []
    for name in [ANCHOR] + list(args.methods):
        for depth in args.depths:
            spec = dict(name=name, depth=depth, seq_len=args.seq_len, threads=args.threads,
                        glibc_malloc=args.glibc_malloc)
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "r.json")
                cmd = [sys.executable, os.path.abspath(__file__), "--_worker", json.dumps(spec), "--_worker-out", out]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                with open(out) as f:
                    results.append(json.load(f))
            print(f"done {name:<24} depth {depth}: {results[-1]['peak_mib']:.0f} MiB", file=sys.stderr, flush=True)
    layer_mib = 4 * HEADS * args.seq_len ** 2 / 2 ** 20
    rows = []
    for name in [ANCHOR] + list(args.methods):
        mine = sorted((r["depth"], r["peak_mib"]) for r in results if r["name"] == name)
        (d0, m0), (d1, m1) = mine[0], mine[-1]
        slope = (m1 - m0) / (d1 - d0) if d1 > d0 else float("nan")
        rows.append(dict(method=name, peaks={d: m for d, m in mine}, slope_mib_per_layer=slope,
                         slope_in_layer_maps=slope / layer_mib))
    depths = sorted(set(args.depths))
    print(f"peak extra MiB by depth, N = {args.seq_len}; one layer's [1, {HEADS}, N, N] float32 = {layer_mib:.0f} MiB; "
          f"glibc malloc: {args.glibc_malloc}")
    print("| method | " + " | ".join(f"depth {d}" for d in depths) + " | MiB / layer | layer maps / layer |")
    print("|---|" + "---|" * (len(depths) + 2))
    for r in rows:
        print(f"| {r['method']} | " + " | ".join(f"{r['peaks'].get(d, float('nan')):.0f}" for d in depths)
              + f" | {r['slope_mib_per_layer']:.1f} | {r['slope_in_layer_maps']:.2f} |")
    out = dict(seq_len=args.seq_len, layer_map_mib=layer_mib, glibc_malloc=args.glibc_malloc, rows=rows,
               results=results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
