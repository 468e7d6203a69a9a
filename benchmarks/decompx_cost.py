#!/usr/bin/env python
"""Cost of one ``decompx`` call relative to one forward, time and peak memory, in one run.

    python -m benchmarks.decompx_cost [--length 128] [--batch 4] [--threads 1]

Model: a randomly initialised stock ``BertForSequenceClassification`` of BERT-base's shape (width 768, 12 blocks,
12 heads, MLP 3072), float32, eval mode, CPU; ``length`` random tokens, no padding. Anchor: ``model(**inputs)``
under ``torch.no_grad()`` (sdpa attention, as the model ships). Time: one warm-up forward, then one timed forward
and one timed ``decompx`` call (``time.perf_counter``; a call lasts minutes, so one of each). Peak memory of each
(the forward after its warm-up): the rise of the process's resident high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs`` before each) over the resident size before it (``VmRSS``), as ``benchmarks/methods.py``
measures the CPU; set against one block's ``[B, N, N, D]`` float32 vectors (printed). glibc's defaults are kept
(no ``retain_freed_memory``), so freed tensors leave the process.
"""
import argparse
import ctypes
import time

import torch
import transformers

from methods import build_method


def status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measured(fn) -> tuple:
    """``(seconds, peak MiB above the resident size before)`` of one call of ``fn``."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                                  # reset VmHWM to the current VmRSS
    base = status_mb("VmRSS")
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    return seconds, status_mb("VmHWM") - base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = transformers.BertConfig(num_labels=2)
    model = transformers.BertForSequenceClassification(config).eval()
    gen = torch.Generator().manual_seed(1)
    inputs = {"input_ids": torch.randint(5, config.vocab_size, (args.batch, args.length), generator=gen),
              "attention_mask": torch.ones(args.batch, args.length, dtype=torch.long)}
    def forward():
        with torch.no_grad():
            model(**inputs)

    forward()
    forward_s, forward_mb = measured(forward)
    method_s, method_mb = measured(lambda: build_method("decompx")(model, inputs, target=1))
    block_mb = args.batch * args.length ** 2 * config.hidden_size * 4 / 2 ** 20
    print("| batch | length | threads | forward s | decompx s | ratio | forward peak MiB | decompx peak MiB |"
          " one block's [B, N, N, D] MiB |\n|---|---|---|---|---|---|---|---|---|")
    print(f"| {args.batch} | {args.length} | {args.threads} | {forward_s:.3f} | {method_s:.1f} | "
          f"{method_s / forward_s:.0f} | {forward_mb:.0f} | {method_mb:.0f} | {block_mb:.0f} |", flush=True)


if __name__ == "__main__":
    main()
