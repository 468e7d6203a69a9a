#!/usr/bin/env python
"""The longest sequence each attribution method runs at on one device (issue 26, item 6).

    python benchmarks/max_length.py [--device cuda] [--start 2048] [--max-len 131072] [--batch 1]
                                    [--methods rollout generic_attribution ...] [--time-limit 30] [--json out.json]

Model: ``benchmarks/methods.py``'s ``--family llama`` model (a random ``LlamaForCausalLM``: 8 layers, width 512, 8
query heads and 2 key/value heads, gated MLP 1408, vocabulary 32000, float32; ``--model-size tiny`` for smoke
tests) with ``max_position_embeddings`` raised to ``--max-len`` (rotary positions: no weight depends on it).
Inputs as ``methods.py`` builds them: BOS then random ids, no padding; a random target id explained at the last
position. The anchors are ``methods.py``'s (sdpa attention as transformers ships it; the head at the last
position only).

For the two anchors and each method: one untimed warm-up call at ``--start`` positions, then one call at
``N = start, 2 start, 4 start, ...`` until a call runs out of device memory (``torch.OutOfMemoryError``; on the
CPU a ``RuntimeError`` whose message says it could not allocate) or ``--max-len`` is reached; then ``--bisect``
halvings between the last ``N`` that ran and the first that did not (multiples of 256). Each call is timed
(wall clock, CUDA synchronised) and its peak extra memory measured (CUDA: ``torch.cuda.max_memory_allocated``
increase over the memory held before the call, i.e. the model and the inputs; not measured on the CPU). A call
slower than ``--time-limit`` seconds ends the search: the method's largest ``N`` is then a lower bound (``"time
limit"``), as is one that reached ``--max-len``. Everything runs in one process, one method after the other; after
an out-of-memory error the references of the failed call are dropped and the CUDA cache emptied. The JSON file is
rewritten after every method, so a run stopped early keeps what it measured.

``token_ablation`` is left out by default: it costs one forward of ``N`` positions per token (``N^2``
positions in all), so its limit is time, not memory.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

if __name__ == "__main__":
    # Run as a script, this file's folder is sys.path[0] and its name would shadow the ``methods`` package.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    sys.path.insert(0, os.path.dirname(_here))

from benchmarks import methods as bench  # noqa: E402 - after the path set-up above

#: what each call's outcome is called in the results
RAN, OUT_OF_MEMORY, TIME_LIMIT = "ran", "out of memory", "time limit"


def is_out_of_memory(err: BaseException) -> bool:
    """A device (or host) allocation failure, as opposed to a bug in the method."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("out of memory" in text or "not enough memory" in text
                                              or "can't allocate memory" in text.lower())


def _release(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def measure_call(fn: Callable[[], object], device: str) -> Dict[str, object]:
    """One call: ``{"outcome", "seconds", "peak_extra_mib"}`` (``outcome`` :data:`RAN` or :data:`OUT_OF_MEMORY`)."""
    _release(device)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    try:
        out = fn()
        if cuda:
            torch.cuda.synchronize()
    except Exception as err:   # noqa: BLE001 - only allocation failures are an outcome; anything else re-raised
        if not is_out_of_memory(err):
            raise
        message = str(err).splitlines()[0][:200]
        del err
        _release(device)
        return dict(outcome=OUT_OF_MEMORY, seconds=time.perf_counter() - start, peak_extra_mib=None, error=message)
    seconds = time.perf_counter() - start
    del out
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else None
    return dict(outcome=RAN, seconds=seconds, peak_extra_mib=peak)


def search(call_at: Callable[[int], Dict[str, object]], start: int, max_len: int, bisect: int,
           time_limit: float) -> Dict[str, object]:
    """Doubling from ``start`` then ``bisect`` halvings (multiples of 256): the calls made and the largest ``N`` that
    ran, with ``bound`` saying whether it is exact (``"exact"``: the next size ran out of memory) or a lower bound
    (``"max-len"``, ``"time limit"``)."""
    calls: List[Dict[str, object]] = []

    def run(n: int) -> Dict[str, object]:
        result = dict(call_at(n), n=n)
        calls.append(result)
        print(f"    N = {n:>7}: {result['outcome']:<13} {result['seconds']:7.2f} s"
              + (f"  {result['peak_extra_mib']:9.0f} MiB" if result.get("peak_extra_mib") is not None else ""),
              file=sys.stderr, flush=True)
        return result

    good: Optional[Dict[str, object]] = None
    bad: Optional[int] = None
    bound = "max-len"
    n = start
    while n <= max_len:
        result = run(n)
        if result["outcome"] != RAN:
            bad = n
            bound = "exact"
            break
        good = result
        if float(result["seconds"]) > time_limit:
            bound = TIME_LIMIT
            break
        n *= 2
    if bad is not None and good is not None:
        low, high = int(good["n"]), bad
        for _ in range(bisect):
            mid = (low + high) // 2 // 256 * 256
            if mid <= low or mid >= high:
                break
            result = run(mid)
            if result["outcome"] == RAN:
                good, low = result, mid
                if float(result["seconds"]) > time_limit:
                    bound = TIME_LIMIT
                    break
            else:
                high = mid
        bad = high
    return dict(largest=None if good is None else good["n"], bound=bound if good is not None else "none ran",
                first_failed=bad, at_largest=good, calls=calls)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model-size", choices=sorted(bench.LLAMA_SIZES), default="base")
    p.add_argument("--methods", nargs="+", default=None,
                   help="default: every registered method but token_ablation")
    p.add_argument("--start", type=int, default=2048)
    p.add_argument("--max-len", type=int, default=131072)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--bisect", type=int, default=2, help="halvings between the last N that ran and the first that "
                                                        "did not (default 2)")
    p.add_argument("--time-limit", type=float, default=30.0,
                   help="seconds: a call slower than this ends the method's search (default 30)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from transformers import LlamaConfig, LlamaForCausalLM

    from methods import available_methods, build_method

    names = list(args.methods) if args.methods else [m for m in available_methods() if m != "token_ablation"]
    unknown = [n for n in names if n not in available_methods()]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; available: {', '.join(available_methods())}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda but CUDA is not available")
    cfg = dict(bench.LLAMA_SIZES[args.model_size], max_position_embeddings=args.max_len)
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).to(args.device).eval()

    def inputs_at(n: int):
        gen = torch.Generator().manual_seed(args.seed)
        return bench.build_inputs("llama", args.model_size, args.batch, n, gen, args.device)[:2]

    def call_for(name: str) -> Callable[[int], Dict[str, object]]:
        method = None if name in bench.ANCHORS else build_method(name)

        def call_at(n: int) -> Dict[str, object]:
            inputs, targets = inputs_at(n)
            if method is None:
                fn = bench._anchor_fn(name, model, inputs, targets)
            else:
                def fn():
                    return method(model, inputs, target=targets)
            return measure_call(fn, args.device)
        return call_at

    config = dict(model=cfg, device=args.device, batch=args.batch, start=args.start, max_len=args.max_len,
                  bisect=args.bisect, time_limit=args.time_limit, torch=torch.__version__,
                  python=platform.python_version())
    if args.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        config.update(gpu=props.name, gpu_memory_mib=props.total_memory / 2**20)
    try:
        import transformers

        config["transformers"] = transformers.__version__
    except ImportError:   # pragma: no cover
        pass
    results: Dict[str, object] = {}
    started = time.perf_counter()
    for name in list(bench.ANCHORS) + names:
        print(f"{name}", file=sys.stderr, flush=True)
        call_at = call_for(name)
        warm = call_at(args.start)        # warm-up: kernels, allocator, library initialisation
        if warm["outcome"] != RAN:
            results[name] = dict(largest=None, bound="none ran", first_failed=args.start, at_largest=None,
                                 calls=[dict(warm, n=args.start)])
        else:
            results[name] = search(call_at, args.start, args.max_len, args.bisect, args.time_limit)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(config=config, results=results, wall_s=time.perf_counter() - started), f, indent=2)
    wall_s = time.perf_counter() - started

    print(f"largest N per method, batch {args.batch}, device {config.get('gpu', args.device)}, "
          f"{args.model_size} Llama; wall {wall_s:.0f} s")
    print("| method | largest N | bound | first N that failed | seconds at largest | peak extra MiB at largest |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        at = r.get("at_largest") or {}
        peak = at.get("peak_extra_mib")
        print(f"| {name} | {r['largest'] if r['largest'] is not None else '-'} | {r['bound']} | "
              f"{r['first_failed'] or '-'} | {at.get('seconds', float('nan')):.2f} | "
              f"{'-' if peak is None else format(peak, '.0f')} |")
    out = dict(config=config, results=results, wall_s=wall_s)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
