#!/usr/bin/env python
"""Cost of ``alti`` / ``alti_logit`` relative to one forward (issue 37's target: within 3x), in one run.

    python -m benchmarks.alti_cost [--length 128] [--batch 1 8] [--repeats 5] [--threads 2]

Models: randomly initialised stock ``BertForSequenceClassification`` of BERT-base's shape (width 768, 12 blocks,
12 heads, MLP 3072) for ``alti`` and ``GPT2LMHeadModel`` of GPT-2 small's (768, 12, 12, vocabulary 50257) for
``alti_logit``, float32, eval mode, CPU; ``length`` random tokens, no padding. Anchor: ``model(**inputs)`` under
``torch.no_grad()`` with the attention the model ships (sdpa). Each round times the anchor then the method
(``time.perf_counter``, or the process's CPU time with ``--clock process``), after one warm-up of each;
ratio = median(method) / median(anchor).

Peak memory (issue 37's target: at most one block's ``B x N x N x D`` float32 vectors above the forward's peak):
after the warm-ups, the anchor's then the method's peak resident-set increase over the resident size before the
call (``VmHWM`` reset through ``/proc/self/clear_refs`` after ``malloc_trim(0)``, as ``benchmarks/methods.py``
measures CPU memory; glibc's default allocator, so freed memory goes back to the system). ``extra`` = method peak
- forward peak, against ``B * N * N * D * 4`` bytes.
"""
import argparse
import statistics
import time

import torch
import transformers

from benchmarks.methods import _proc_status_kib, _reset_peak_rss
from methods import build_method

CLOCKS = {"wall": time.perf_counter, "process": time.process_time}


def peak_extra_mib(fn) -> float:
    """The increase of the process's peak resident size over its resident size before ``fn()``, MiB (``nan``
    where ``/proc`` cannot reset the peak)."""
    if not _reset_peak_rss():
        return float("nan")
    base = _proc_status_kib("VmRSS")
    fn()
    peak = _proc_status_kib("VmHWM")
    return float("nan") if base is None or peak is None else (peak - base) / 1024


def build(kind: str):
    torch.manual_seed(0)
    if kind == "bert":
        config = transformers.BertConfig(num_labels=2)
        return transformers.BertForSequenceClassification(config).eval(), config.vocab_size
    config = transformers.GPT2Config()
    return transformers.GPT2LMHeadModel(config).eval(), config.vocab_size


def measure(kind: str, name: str, batch: int, length: int, repeats: int, clock=time.perf_counter) -> dict:
    model, vocab = build(kind)
    gen = torch.Generator().manual_seed(1)
    inputs = {"input_ids": torch.randint(5, vocab, (batch, length), generator=gen),
              "attention_mask": torch.ones(batch, length, dtype=torch.long)}
    method = build_method(name)

    def anchor():
        with torch.no_grad():
            model(**inputs)

    def run():
        method(model, inputs, target=1)

    anchor(), run()
    anchor_peak, method_peak = peak_extra_mib(anchor), peak_extra_mib(run)
    times = {"anchor": [], "method": []}
    for _ in range(repeats):
        for key, fn in (("anchor", anchor), ("method", run)):
            start = clock()
            fn()
            times[key].append(clock() - start)
    a, m = statistics.median(times["anchor"]), statistics.median(times["method"])
    paired = [mm / aa for aa, mm in zip(times["anchor"], times["method"])]
    width = model.config.hidden_size
    return {"method": name, "model": kind, "batch": batch, "length": length, "anchor_s": a, "method_s": m,
            "ratio": m / a, "paired": paired, "anchor_peak_mib": anchor_peak, "method_peak_mib": method_peak,
            "bound_mib": batch * length * length * width * 4 / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", nargs="+", choices=("bert", "gpt2"), default=["bert", "gpt2"])
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("| method | model | batch | length | forward s | method s | ratio (paired) | forward peak MiB | "
          "method peak MiB | extra MiB | B N^2 D x 4 B (MiB) |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for kind, name in (("bert", "alti"), ("gpt2", "alti_logit")):
        if kind not in args.models:
            continue
        for batch in args.batch:
            r = measure(kind, name, batch, args.length, args.repeats, CLOCKS[args.clock])
            paired = ", ".join(f"{p:.2f}" for p in r["paired"])
            print(f"| `{name}` | {kind} | {batch} | {args.length} | {r['anchor_s']:.3f} | {r['method_s']:.3f} | "
                  f"{r['ratio']:.2f} ({paired}) | {r['anchor_peak_mib']:.0f} | {r['method_peak_mib']:.0f} | "
                  f"{r['method_peak_mib'] - r['anchor_peak_mib']:.0f} | {r['bound_mib']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
