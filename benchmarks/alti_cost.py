#!/usr/bin/env python
"""Cost of ``alti`` / ``alti_logit`` relative to one forward (issue 37's target: within 3x), in one run.

    python -m benchmarks.alti_cost [--length 128] [--batch 1 8] [--repeats 5] [--threads 2]

Models: randomly initialised stock ``BertForSequenceClassification`` of BERT-base's shape (width 768, 12 blocks,
12 heads, MLP 3072) for ``alti`` and ``GPT2LMHeadModel`` of GPT-2 small's (768, 12, 12, vocabulary 50257) for
``alti_logit``, float32, eval mode, CPU; ``length`` random tokens, no padding. Anchor: ``model(**inputs)`` under
``torch.no_grad()`` with the attention the model ships (sdpa). Each round times the anchor then the method
(``time.perf_counter``), after one warm-up of each; ratio = median(method) / median(anchor). Peak memory is not
measured here (CPU): the method holds one block's ``[B, N, N, D]`` vectors at a time (``methods/alti.py``).
"""
import argparse
import statistics
import time

import torch
import transformers

from methods import build_method


def build(kind: str):
    torch.manual_seed(0)
    if kind == "bert":
        config = transformers.BertConfig(num_labels=2)
        return transformers.BertForSequenceClassification(config).eval(), config.vocab_size
    config = transformers.GPT2Config()
    return transformers.GPT2LMHeadModel(config).eval(), config.vocab_size


def measure(kind: str, name: str, batch: int, length: int, repeats: int) -> dict:
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
    times = {"anchor": [], "method": []}
    for _ in range(repeats):
        for key, fn in (("anchor", anchor), ("method", run)):
            start = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - start)
    a, m = statistics.median(times["anchor"]), statistics.median(times["method"])
    return {"method": name, "model": kind, "batch": batch, "length": length, "anchor_s": a, "method_s": m,
            "ratio": m / a}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("| method | model | batch | length | forward s | method s | ratio |\n|---|---|---|---|---|---|---|")
    for kind, name in (("bert", "alti"), ("gpt2", "alti_logit")):
        for batch in args.batch:
            r = measure(kind, name, batch, args.length, args.repeats)
            print(f"| `{name}` | {kind} | {batch} | {args.length} | {r['anchor_s']:.3f} | {r['method_s']:.3f} | "
                  f"{r['ratio']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
