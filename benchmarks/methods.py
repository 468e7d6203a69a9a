#!/usr/bin/env python
"""Cost of every registered attribution method relative to the passes it fundamentally needs.

    python benchmarks/methods.py [--batch-sizes 1 16] [--methods rollout gradcam ...] [--repeats 3]
                                 [--device cpu|cuda] [--json out.json]

Model: a randomly initialised ViT-B/16-sized stock timm ``VisionTransformer`` (224 px, patch 16, dim 768, depth 12,
12 heads, 1000 classes, ``global_pool='token'``) in eval mode; ``--model-size tiny`` (64 px, patch 16, dim 64,
depth 2, 2 heads) is for smoke tests. ``--family dinov2_reg``: the shape of timm's ``vit_small_patch14_reg4_dinov2``
(ViT-S/14 at 224 px: dim 384, depth 12, 6 heads, layer scale, [CLS] + 4 register tokens, positions on the patches
only; 1000 classes) or tiny. No weights are downloaded: costs do not depend on the weights. A method that is not
defined on the model (``methods.MethodUndefinedError``, e.g. the LRP methods on layer scale) gets a row
``undefined`` with the reason.
``--family siglip``: a random ``transformers.SiglipModel`` whose vision tower has SigLIP ViT-B/16's shape (224 px,
patch 16, width 768, depth 12, 12 heads, MLP 3072, the attention-pooling head; a small text tower, never run)
as a ``models.clip.ZeroShotClassifier`` over 1000 random class embeddings: the methods explain the vision tower.

What is timed (wall clock, ``time.perf_counter``; CUDA synchronised before and after each call):

* anchor ``forward``: ``model(images)`` under ``torch.no_grad()`` with timm's fused attention as the model ships;
* anchor ``forward+backward``: ``model(x)`` with ``x = images.requires_grad_()``, then
  ``torch.autograd.grad(sum of each sample's target logit, x)`` -- the backward traverses the whole network down
  to the pixels (fused attention; parameters keep ``requires_grad=True`` as timm builds them, their ``.grad`` is
  not computed because only ``x`` is asked for);
* each method exactly as a user calls it: ``build_method(name)(model, images, target=targets)`` with registry
  defaults and a per-sample ``LongTensor`` of targets.

Each (method, batch size) runs in a fresh subprocess (``--isolation subprocess``, the default): the first call
measures peak memory (see below) and is the first warm-up, then the anchors the method is compared with get one
warm-up each, then ``--repeats`` rounds of (anchor(s), method), so CPU-frequency drift and other load hit both
alike. Reported times are medians over the rounds, per image (ms/image = median seconds / batch * 1000); anchor
rows pool every anchor sample taken at that batch size. ``ratio = median(method) / anchor`` with the anchor built
from the medians measured in the same process (PROTOCOLS.md section 7):

================================================  =====================================  ======
method                                            anchor                                 target
================================================  =====================================  ======
raw_attention, rollout                            1 forward                              <= 1.3
gradcam, generic_attribution, cdam                1 forward+backward                     <= 1.3
beyond_intuition_head / _token                    1 forward+backward + ``steps`` fwds    <= 1.3
transformer_attribution                           1 forward+backward                     <= 2.5
attnlrp, cp_lrp                                   1 forward+backward                     <= 1.3
partial_lrp, lrp, lrp_rollout                     1 forward+backward                     (report)
random                                            1 forward                              (report)
token_ablation                                    (number of patches) forwards           (report)
value_zeroing                                     (N + 1) forwards, N positions          <= 1.2
atman                                             (number of patches + 1) forwards       <= 1.2
legrad                                            1 forward+backward                     <= 1.5
saliency, input_x_gradient                        1 forward+backward                     <= 1.2
integrated_gradients                              ``steps`` x forward+backward           <= 1.1
smoothgrad, smoothgrad_squared, vargrad           ``samples`` x forward+backward         <= 1.1
occlusion                                         1 + (number of windows) forwards       <= 1.1
kernel_shap, lime                                 1 + ``samples`` forwards               (report)
================================================  =====================================  ======

Value Zeroing's count: one forward for the clean states of every block, then per block ``N`` runs of that block
alone on its own clean input (one per zeroed position, batched): ``N`` more forwards' worth of blocks, with no
embedding or head.

``--method-options '{"integrated_gradients": {"steps": 8}}'`` builds a method with other options than the registry
defaults (the anchors follow: ``steps``, ``samples``, the occlusion ``window``); a smoke run keeps minutes that way.

AttnLRP and CP-LRP also have a memory target: their peak extra memory at most 1.5x the forward+backward
anchor's at the same batch size ("peak / fwd+bwd"; a row over it is ``FAIL (memory)``).

Peak memory ("peak extra MiB"): the increase of memory over the state with the model and the inputs allocated,
during the *first* call in the process. CUDA: ``torch.cuda.max_memory_allocated() - memory_allocated()`` before
the call (tensor memory only). CPU: the process's peak resident set size (``VmHWM`` from ``/proc/self/status``,
reset with ``/proc/self/clear_refs`` and after ``malloc_trim(0)``) minus the resident size before the call, in a
fresh process so that no freed-but-cached heap hides the method's allocations; this includes one-time library
initialisation of the first call. CPU memory is not measured with ``--isolation none`` (in-process numbers would
be meaningless).

``token_ablation`` costs one forward per patch (196 sequences per image at ViT-B/16): by default it runs only at
batch size 1 (``--token-ablation-batch-sizes``; ``--skip-token-ablation`` drops it), rows skipped are listed.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional

import torch

if __name__ == "__main__":
    # Run as a script, this file's folder is sys.path[0] and its name would shadow the ``methods`` package.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    sys.path.insert(0, os.path.dirname(_here))

FORWARD = "forward"
FORWARD_BACKWARD = "forward+backward"
ANCHORS = (FORWARD, FORWARD_BACKWARD)

MODEL_SIZES = {
    "base": dict(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12, num_classes=1000),
    "tiny": dict(img_size=64, patch_size=16, embed_dim=64, depth=2, num_heads=2, num_classes=1000),
}
#: ``--family bert``: a randomly initialised ``BertForSequenceClassification`` (BERT-base's shape, or tiny)
TEXT_SIZES = {
    "base": dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512, num_labels=2),
    "tiny": dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                 max_position_embeddings=128, num_labels=2),
}
#: ``--family llama``: a randomly initialised ``LlamaForCausalLM`` (8 layers, width 512, grouped-query attention with
#: 8 query and 2 key/value heads, gated MLP 1408, vocabulary 32000), or tiny
LLAMA_SIZES = {
    "base": dict(vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                 num_key_value_heads=2, intermediate_size=1408, max_position_embeddings=8192, bos_token_id=1,
                 eos_token_id=2, pad_token_id=0),
    "tiny": dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                 pad_token_id=0),
}
#: ``--family dinov2_reg``: timm's ``vit_small_patch14_reg4_dinov2`` shape at 224 px, or tiny
DINOV2_REG_SIZES = {
    "base": dict(img_size=224, patch_size=14, embed_dim=384, depth=12, num_heads=6, num_classes=1000,
                 init_values=1e-5, reg_tokens=4, no_embed_class=True),
    "tiny": dict(img_size=56, patch_size=14, embed_dim=64, depth=2, num_heads=2, num_classes=1000,
                 init_values=1e-5, reg_tokens=4, no_embed_class=True),
}
#: the image families: their timm ``VisionTransformer`` arguments by size
IMAGE_FAMILIES = {"vit": MODEL_SIZES, "dinov2_reg": DINOV2_REG_SIZES}
#: ``--family siglip``: the vision tower (SigLIP ViT-B/16's shape, or tiny) and a small text tower (never run)
SIGLIP_SIZES = {
    "base": dict(image_size=224, patch_size=16, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                 num_attention_heads=12, num_classes=1000),
    "tiny": dict(image_size=64, patch_size=16, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=2, num_classes=1000),
}
FAMILIES = ("vit", "bert", "llama", "dinov2_reg", "siglip")
TEXT_FAMILIES = ("bert", "llama")

# method -> (kind of anchor, target ratio or None); PROTOCOLS.md section 7 and the targets
COSTS = {
    "raw_attention": ("forward", 1.3),
    "rollout": ("forward", 1.3),
    "random": ("forward", None),
    "gradcam": ("forward+backward", 1.3),
    "generic_attribution": ("forward+backward", 1.3),
    "cdam": ("forward+backward", 1.3),
    "beyond_intuition_head": ("forward+backward+steps", 1.3),
    "beyond_intuition_token": ("forward+backward+steps", 1.3),
    "transformer_attribution": ("forward+backward", 2.5),
    "partial_lrp": ("forward+backward", None),
    "lrp": ("forward+backward", None),
    "lrp_rollout": ("forward+backward", None),
    "token_ablation": ("patches", None),
    "attnlrp": ("forward+backward", 1.3),
    "cp_lrp": ("forward+backward", 1.3),
    "value_zeroing": ("positions+1", 1.2),
    "atman": ("patches+1", 1.2),
    "legrad": ("forward+backward", 1.5),
    "saliency": ("forward+backward", 1.2),
    "input_x_gradient": ("forward+backward", 1.2),
    "integrated_gradients": ("steps x forward+backward", 1.1),
    "smoothgrad": ("samples x forward+backward", 1.1),
    "smoothgrad_squared": ("samples x forward+backward", 1.1),
    "vargrad": ("samples x forward+backward", 1.1),
    "occlusion": ("occlusion forwards", 1.1),
    "kernel_shap": ("samples forwards", None),
    "lime": ("samples forwards", None),
}
#: method -> target of its peak extra memory over the forward+backward anchor's (same batch size)
MEMORY_TARGETS = {"attnlrp": 1.5, "cp_lrp": 1.5}
DEFAULT_COST = ("forward+backward", None)  # a method registered later without an entry here
TOKEN_ABLATION = "token_ablation"


# ----------------------------------------------------------------------------------------------- the worker
def build_siglip_classifier(size: str) -> torch.nn.Module:
    """A random ``SiglipModel`` (:data:`SIGLIP_SIZES`) as a zero-shot classifier over random class embeddings."""
    from transformers import SiglipConfig, SiglipModel

    from models.clip import ZeroShotClassifier

    vision = dict(SIGLIP_SIZES[size])
    classes = vision.pop("num_classes")
    text = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=64, projection_size=vision["hidden_size"])
    clip = SiglipModel(SiglipConfig(text_config=text, vision_config=vision))
    return ZeroShotClassifier(clip, torch.randn(classes, vision["hidden_size"]))


def build_model(size: str, device: str, family: str = "vit") -> torch.nn.Module:
    if family == "siglip":
        return build_siglip_classifier(size).to(device).eval()
    if family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(**LLAMA_SIZES[size])).to(device).eval()
    if family == "bert":
        from transformers import BertConfig, BertForSequenceClassification

        return BertForSequenceClassification(BertConfig(**TEXT_SIZES[size])).to(device).eval()
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(global_pool="token", **IMAGE_FAMILIES[family][size]).to(device).eval()


def build_inputs(family: str, size: str, batch: int, seq_len: int, gen: torch.Generator, device: str):
    """``(inputs, targets, tokens removed one at a time by token_ablation)``: images ``[B, 3, H, W]``; or token
    batches of ``seq_len`` positions (``[CLS]``, random word ids, ``[SEP]``; no padding) as a tokenizer returns
    them; ``llama``: BOS then random ids (no padding), the target a vocabulary id per row (the next token
    explained at the last position)."""
    if family == "llama":
        cfg = LLAMA_SIZES[size]
        ids = torch.randint(3, cfg["vocab_size"], (batch, seq_len), generator=gen)
        ids[:, 0] = cfg["bos_token_id"]
        inputs = {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}
        targets = torch.randint(0, cfg["vocab_size"], (batch,), generator=gen, dtype=torch.long).to(device)
        return inputs, targets, seq_len - 1
    if family == "bert":
        cfg = TEXT_SIZES[size]
        ids = torch.randint(200, cfg["vocab_size"], (batch, seq_len), generator=gen)   # not a special id
        ids[:, 0], ids[:, -1] = 101, 102
        inputs = {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}
        targets = torch.randint(0, cfg["num_labels"], (batch,), generator=gen, dtype=torch.long).to(device)
        return inputs, targets, seq_len - 2
    if family == "siglip":
        vision = SIGLIP_SIZES[size]
        cfg = dict(img_size=vision["image_size"], patch_size=vision["patch_size"], num_classes=vision["num_classes"])
    else:
        cfg = IMAGE_FAMILIES[family][size]
    images = torch.randn(batch, 3, cfg["img_size"], cfg["img_size"], generator=gen).to(device)
    targets = torch.randint(0, cfg["num_classes"], (batch,), generator=gen, dtype=torch.long).to(device)
    return images, targets, (cfg["img_size"] // cfg["patch_size"]) ** 2


def anchors_needed(name: str) -> List[str]:
    if name in ANCHORS:
        return []
    kind = COSTS.get(name, DEFAULT_COST)[0]
    if kind in ("forward", "patches", "positions+1", "patches+1", "occlusion forwards", "samples forwards"):
        return [FORWARD]
    if kind in ("forward+backward", "steps x forward+backward", "samples x forward+backward"):
        return [FORWARD_BACKWARD]
    return [FORWARD_BACKWARD, FORWARD]


def occlusion_windows(method, family: str, size: str, num_tokens: int) -> int:
    """The windows ``occlusion`` replaces one at a time: the windows of the method's ``window`` and ``stride`` over
    a sequence's content tokens (default one token) or over the image (default one patch)."""
    from methods.occlusion import _pair, token_windows, window_corners

    if family in TEXT_FAMILIES:
        window = _pair(method.window, (1, 1), "window")[0]
        return len(token_windows(num_tokens, window, _pair(method.stride, (window, window), "stride")[0]))

    if family == "siglip":
        img, patch = SIGLIP_SIZES[size]["image_size"], SIGLIP_SIZES[size]["patch_size"]
    else:
        img, patch = IMAGE_FAMILIES[family][size]["img_size"], IMAGE_FAMILIES[family][size]["patch_size"]
    window = _pair(method.window, (patch, patch), "window")
    return len(window_corners((img, img), window, _pair(method.stride, window, "stride")))


def _anchor_fn(name: str, model, images, targets) -> Callable[[], object]:
    """Images: ``model(x)``, and the gradient w.r.t. the pixels. Token batches: ``model(**inputs).logits``, and
    the gradient w.r.t. the word embeddings (``inputs_embeds``: the backward runs through the whole encoder and
    the embedding sum and LayerNorm). Attention as the model ships (timm's fused attention, Hugging Face's sdpa).
    A causal LM computes its head at the last position only (``logits_to_keep=1``, as the adapter reads one
    position; the full ``[B, N, vocab]`` head would dominate the anchor)."""
    text = isinstance(images, dict)
    lm = text and hasattr(model, "lm_head")
    extra = {"logits_to_keep": 1} if lm else {}

    def last(logits):
        return logits[:, -1] if lm else logits

    if name == FORWARD:
        def forward():
            with torch.no_grad():
                return last(model(**images, **extra).logits) if text else model(images)
        return forward

    def forward_backward():
        if text:
            x = model.get_input_embeddings()(images["input_ids"]).detach().requires_grad_(True)
            logits = last(model(inputs_embeds=x, attention_mask=images["attention_mask"], **extra).logits)
        else:
            x = images.detach().requires_grad_(True)
            logits = model(x)
        (grad,) = torch.autograd.grad(logits.gather(1, targets[:, None]).sum(), x)
        return grad
    return forward_backward


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


#: the clock of :func:`_timed` (``--clock``): wall time, or the process's CPU time (every thread's, CPU only)
CLOCKS = {"wall": time.perf_counter, "process": time.process_time}
_clock = CLOCKS["wall"]


def _timed(fn: Callable[[], object], device: str) -> float:
    _sync(device)
    start = _clock()
    out = fn()
    _sync(device)
    elapsed = _clock() - start
    del out
    return elapsed


def _proc_status_kib(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _first_call_with_memory(fn, device: str, cpu_memory: bool):
    """Run ``fn`` once; return (seconds, peak extra MiB or None, what was measured)."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        seconds = _timed(fn, device)
        return seconds, (torch.cuda.max_memory_allocated() - base) / 2**20, "cuda max_memory_allocated increase"
    if not cpu_memory:
        return _timed(fn, device), None, "not measured (CPU, in-process)"
    if _reset_peak_rss():
        base = _proc_status_kib("VmRSS")
        seconds = _timed(fn, device)
        peak = _proc_status_kib("VmHWM")
        if base is not None and peak is not None:
            return seconds, (peak - base) / 1024, "peak RSS increase (VmHWM reset), fresh process, first call"
    import resource

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds = _timed(fn, device)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return seconds, (peak - base) / 1024, "lower bound: ru_maxrss increase (peak could not be reset)"


def run_worker(spec: dict) -> dict:
    """Time one method (or anchor) at one batch size; ``spec`` holds name, batch, model_size, device, repeats,
    warmup, threads, seed, cpu_memory."""
    device = spec["device"]
    global _clock
    _clock = CLOCKS[spec.get("clock", "wall")]
    if spec.get("retain_freed_memory", True):
        from methods.cpu_memory import retain_freed_memory

        retain_freed_memory()
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    torch.manual_seed(spec["seed"])
    family = spec.get("family", "vit")
    model = build_model(spec["model_size"], device, family)
    batch = int(spec["batch"])
    gen = torch.Generator().manual_seed(spec["seed"])
    images, targets, num_tokens = build_inputs(family, spec["model_size"], batch, int(spec.get("seq_len", 256)),
                                               gen, device)

    name = spec["name"]
    info = {}
    if name in ANCHORS:
        fn = _anchor_fn(name, model, images, targets)
    else:
        from methods import build_method

        options = dict(spec.get("method_options", {}).get(name, {}))
        method = build_method(name, **options)
        from methods.adapters import adapter_for

        depth = len(adapter_for(model).blocks)
        start_layer = getattr(method, "start_layer", None)
        if start_layer is None and hasattr(method, "default_start_layers"):
            start_layer = method.default_start_layers["vit"]  # the image default (None: per layout)
        if isinstance(start_layer, int) and not -depth <= start_layer < depth:
            # only on the tiny smoke-test model: a default start_layer beyond its depth becomes its last block
            method = build_method(name, **{**options, "start_layer": depth - 1})
            info["adjusted"] = f"start_layer {start_layer} -> {depth - 1} (model has {depth} blocks)"
        info["method_repr"] = repr(method)
        if getattr(method, "steps", None) is not None:
            info["steps"] = int(method.steps)
        if COSTS.get(name, DEFAULT_COST)[0] == "positions+1":
            info["num_positions"] = adapter_for(model).inputs.layout(images).num_positions
        if getattr(method, "samples", None) is not None:
            info["method_samples"] = int(method.samples)
        if name == "occlusion":
            info["forwards"] = 1 + occlusion_windows(method, family, spec["model_size"], num_tokens)

        def fn():
            return method(model, images, target=targets)

    anchor_fns = {a: _anchor_fn(a, model, images, targets) for a in anchors_needed(name)}

    from methods import MethodUndefinedError

    try:
        first_s, peak_mib, memory_note = _first_call_with_memory(fn, device, spec["cpu_memory"])
    except MethodUndefinedError as err:   # not defined on this model: a row saying why, no timing
        return dict(name=name, batch=batch, undefined=str(err))
    for _ in range(max(0, int(spec["warmup"]) - 1)):
        fn()
    for afn in anchor_fns.values():
        afn()
    samples: Dict[str, List[float]] = {name: []}
    samples.update({a: [] for a in anchor_fns})
    rounds = int(spec["repeats"])
    if int(spec["warmup"]) == 0:   # the first call is the first timed round (its anchors timed after it)
        samples[name].append(first_s)
        for a, afn in anchor_fns.items():
            samples[a].append(_timed(afn, device))
        rounds -= 1
    for _ in range(rounds):
        for a, afn in anchor_fns.items():
            samples[a].append(_timed(afn, device))
        samples[name].append(_timed(fn, device))
    return dict(name=name, batch=batch, first_call_s=first_s, peak_extra_mib=peak_mib, memory_note=memory_note,
                samples=samples, num_patches=int(num_tokens), threads=torch.get_num_threads(),
                **info)


def _run_isolated(spec: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--_worker", json.dumps(spec), "--_worker-out", out]
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RuntimeError(f"benchmark worker for {spec['name']!r} at batch {spec['batch']} failed "
                               f"(exit {proc.returncode}); its stderr is above")
        with open(out) as f:
            return json.load(f)


# ----------------------------------------------------------------------------------------------- the report
def _anchor_seconds(kind: str, result: dict) -> Optional[float]:
    med = {a: statistics.median(v) for a, v in result["samples"].items() if a in ANCHORS and v}
    if kind == "forward":
        return med.get(FORWARD)
    if kind == "forward+backward":
        return med.get(FORWARD_BACKWARD)
    if kind == "forward+backward+steps":
        return med[FORWARD_BACKWARD] + result.get("steps", 0) * med[FORWARD]
    if kind == "patches":
        return result["num_patches"] * med[FORWARD]
    if kind == "positions+1":
        return (result["num_positions"] + 1) * med[FORWARD]
    if kind == "patches+1":
        return (result["num_patches"] + 1) * med[FORWARD]
    if kind == "steps x forward+backward":
        return result["steps"] * med[FORWARD_BACKWARD]
    if kind == "samples x forward+backward":
        return result["method_samples"] * med[FORWARD_BACKWARD]
    if kind == "occlusion forwards":
        return result["forwards"] * med[FORWARD]
    if kind == "samples forwards":
        return (1 + result["method_samples"]) * med[FORWARD]
    raise ValueError(kind)


def _anchor_label(kind: str, result: dict) -> str:
    if kind == "forward+backward+steps":
        return f"fwd+bwd + {result.get('steps', 0)} fwd"
    if kind in ("patches", "patches+1"):
        return f"{result['num_patches'] + (kind == 'patches+1')} fwd"
    if kind == "positions+1":
        return f"{result['num_positions'] + 1} fwd"
    if kind == "steps x forward+backward":
        return f"{result['steps']} x fwd+bwd"
    if kind == "samples x forward+backward":
        return f"{result['method_samples']} x fwd+bwd"
    if kind == "occlusion forwards":
        return f"{result['forwards']} fwd"
    if kind == "samples forwards":
        return f"{1 + result['method_samples']} fwd"
    return {"forward": "1 fwd", "forward+backward": "1 fwd+bwd"}[kind]


def make_rows(results: List[dict], skipped: List[dict]) -> List[dict]:
    rows = []
    pooled: Dict[int, Dict[str, List[float]]] = {}
    for r in results:
        for a, values in r["samples"].items():
            if a in ANCHORS:
                pooled.setdefault(r["batch"], {}).setdefault(a, []).extend(values)
    for r in results:
        if r["name"] not in ANCHORS:
            continue
        values = pooled[r["batch"]][r["name"]]
        rows.append(dict(method=r["name"], kind="anchor", batch=r["batch"],
                         ms_per_image=1000 * statistics.median(values) / r["batch"], samples=len(values),
                         anchor=None, anchor_ms_per_image=None, ratio=None, target=None, status="anchor",
                         peak_extra_mib=r["peak_extra_mib"], memory_note=r["memory_note"]))
    anchor_peaks = {(r["batch"], r["name"]): r["peak_extra_mib"] for r in results if r["name"] in ANCHORS}
    for r in results:
        if r["name"] in ANCHORS:
            continue
        kind, target = COSTS.get(r["name"], DEFAULT_COST)
        anchor_peak = anchor_peaks.get((r["batch"], FORWARD_BACKWARD))
        memory_ratio = (r["peak_extra_mib"] / anchor_peak if r["peak_extra_mib"] is not None and anchor_peak
                        else None)
        memory_target = MEMORY_TARGETS.get(r["name"])
        seconds = statistics.median(r["samples"][r["name"]])
        anchor_s = _anchor_seconds(kind, r)
        ratio = seconds / anchor_s
        paired = []
        for i, s in enumerate(r["samples"][r["name"]]):
            one = dict(r, samples={a: [v[i]] for a, v in r["samples"].items()})
            paired.append(s / _anchor_seconds(kind, one))
        status = "report" if target is None else ("pass" if ratio <= target else "FAIL")
        if memory_target is not None and memory_ratio is not None and memory_ratio > memory_target:
            status = "FAIL (memory)"
        rows.append(dict(method=r["name"], kind="method", batch=r["batch"], ms_per_image=1000 * seconds / r["batch"],
                         samples=len(r["samples"][r["name"]]), anchor=_anchor_label(kind, r),
                         anchor_ms_per_image=1000 * anchor_s / r["batch"], ratio=ratio, paired_ratios=paired,
                         target=target, status=status, peak_extra_mib=r["peak_extra_mib"],
                         memory_note=r["memory_note"], memory_ratio=memory_ratio, memory_target=memory_target,
                         first_call_ms_per_image=1000 * r["first_call_s"] / r["batch"],
                         method_repr=r.get("method_repr"), adjusted=r.get("adjusted")))
    for s in skipped:
        rows.append(dict(method=s["name"], kind="method", batch=s["batch"], ms_per_image=None, samples=0, anchor=None,
                         anchor_ms_per_image=None, ratio=None, target=COSTS.get(s["name"], DEFAULT_COST)[1],
                         status=s.get("status", "skipped"), peak_extra_mib=None, memory_note=s["why"]))
    return rows


def format_table(rows: List[dict]) -> str:
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    header = ("method", "batch", "ms/image", "anchor", "anchor ms/img", "ratio", "target", "result", "peak extra MiB",
              "peak / fwd+bwd")
    lines = []
    body = []
    for row in rows:
        body.append((row["method"] if row["kind"] == "method" else f"[{row['method']}]", str(row["batch"]),
                     fmt(row["ms_per_image"], ".1f"), row["anchor"] or "-", fmt(row["anchor_ms_per_image"], ".1f"),
                     fmt(row["ratio"], ".2f"), "-" if row["target"] is None else f"<={row['target']}",
                     row["status"], fmt(row["peak_extra_mib"], ".0f"),
                     fmt(row.get("memory_ratio"), ".2f") + (f" (<={row['memory_target']})" if row.get("memory_target")
                                                            else "")))
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    lines.append("  ".join(h.ljust(w) if i in (0, 3, 7) else h.rjust(w)
                           for i, (h, w) in enumerate(zip(header, widths))))
    lines.append("  ".join("-" * w for w in widths))
    for b in body:
        lines.append("  ".join(c.ljust(w) if i in (0, 3, 7) else c.rjust(w) for i, (c, w) in enumerate(zip(b, widths))))
    return "\n".join(lines)


def _notes(args, results) -> List[str]:
    memory_notes = sorted({r["memory_note"] for r in results})
    adjusted = sorted({f"{r['name']}: {r['adjusted']}" for r in results if r.get("adjusted")})
    return ([f"options changed from the defaults to fit the model: {'; '.join(adjusted)}"] if adjusted else []) + [
        f"ms/image: median over the repeats of one call's {'CPU' if args.clock == 'process' else 'wall'} time "
        "divided by the batch size; ratio = method "
        "median / anchor built from the anchor medians taken in the same process, interleaved with the method.",
        ("[forward]: model(**tokens).logits under torch.no_grad(), sdpa attention as transformers ships it. "
         "[forward+backward]: model(inputs_embeds=x, attention_mask=...) then torch.autograd.grad(sum of the target "
         "logits, x) with x = the word embeddings of the ids: the backward runs through the whole encoder. "
         + ("The causal LM's head is computed at the last position only (logits_to_keep=1), the position the "
            "methods explain. " if args.family == "llama" else "")
         if args.family in TEXT_FAMILIES else
         "[forward]: model(images) under torch.no_grad(), fused attention as timm ships it. [forward+backward]: "
         "model(x) then torch.autograd.grad(sum of the target logits, x) with x = images.requires_grad_(): the "
         "backward runs through the whole network (fused attention"
         + ("; transformers' sdpa in the SigLIP blocks, its pooling head's nn.MultiheadAttention as it ships"
            if args.family == "siglip" else "") + "). ")
        + "Methods that read attention switch to eager attention themselves (that overhead is part of their "
        "ratio); attnlrp and cp_lrp keep the model's fused attention.",
        "beyond_intuition_*: anchor = 1 fwd+bwd + `steps` forwards (steps from the method's defaults). "
        "token_ablation: anchor = (number of patches, or of content tokens) forwards of the full sequence.",
        "atman: anchor = (number of patches, or of content tokens) + 1 forwards: one clean and one suppressed copy "
        "per token (the copies batched `chunk` rows at a time, eager attention; the anchor's attention is fused).",
        f"token_ablation runs one forward per patch: timed only at batch sizes {args.token_ablation_batch_sizes} "
        "(--token-ablation-batch-sizes)"
        f"{'; skipped entirely (--skip-token-ablation)' if args.skip_token_ablation else ''}.",
        "peak extra MiB: " + "; ".join(memory_notes) + ". Measured on the first call (which is also the first "
        "warm-up); CPU numbers include one-time library initialisation; relative to the model and inputs "
        "already allocated.",
        "Targets: PROTOCOLS.md section 7 / the issue: <=1.3 for raw_attention, rollout, gradcam, "
        "generic_attribution, cdam, beyond_intuition_*, attnlrp, cp_lrp; <=2.5 for transformer_attribution; "
        "attnlrp and cp_lrp: peak extra memory <=1.5x the forward+backward's; <=1.2 for saliency and "
        "input_x_gradient (1 fwd+bwd); <=1.1 for integrated_gradients (steps x fwd+bwd), smoothgrad* / vargrad "
        "(samples x fwd+bwd) and occlusion (1 + windows forwards); 'report' rows have no target.",
    ]


# ----------------------------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    p.add_argument("--methods", nargs="+", default=None, help="default: every method in methods.available_methods()")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (median taken); default 3")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed calls of the method before the rounds (the first also measures memory); default 1; "
                        "0: the first call (cold) is the first timed round, for methods whose one call takes minutes")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                   help="wall (default): time.perf_counter; process: the process's CPU time (time.process_time, "
                        "every thread), which other processes on a loaded machine shift far less (use --threads 1 "
                        "so that no thread spins waiting)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads; default: the number of CPU cores available to this process")
    p.add_argument("--model-size", choices=sorted(MODEL_SIZES), default="base")
    p.add_argument("--family", choices=FAMILIES, default="vit",
                   help="vit (default): a timm ViT on images; dinov2_reg: a ViT-S/14 with 4 registers and layer scale "
                        "(DINOv2-reg's shape) on images; bert: a BertForSequenceClassification on token batches; "
                        "llama: a LlamaForCausalLM on token batches (the next token at the last position explained); "
                        "siglip: a SiglipModel's vision tower as a zero-shot classifier on images")
    p.add_argument("--seq-len", type=int, default=256,
                   help="--family bert / llama: positions per sequence (default 256)")
    p.add_argument("--skip-anchor-rows", action="store_true",
                   help="no processes of the anchors alone (their rows): each method's ratio uses the anchors timed "
                        "in its own process anyway")
    p.add_argument("--token-ablation-batch-sizes", type=int, nargs="+", default=[1])
    p.add_argument("--skip-token-ablation", action="store_true")
    p.add_argument("--isolation", choices=("subprocess", "none"), default="subprocess",
                   help="subprocess (default): a fresh process per (method, batch), needed for CPU memory; none: "
                        "everything in this process (CPU memory not measured)")
    p.add_argument("--glibc-malloc", choices=("retain", "default"), default="retain",
                   help="retain (default): every process keeps the memory it frees (methods/cpu_memory.py, as "
                        "evaluate.py and train.py do); default: glibc's mmap and trim thresholds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--method-options", type=json.loads, default={},
                   help='JSON: options per method, e.g. \'{"integrated_gradients": {"steps": 8}, "smoothgrad": '
                        '{"samples": 8}}\' (default: the registry defaults)')
    p.add_argument("--json", default=None, help="also write the rows, notes and configuration here")
    p.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_worker-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.threads is None:
        args.threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args._worker is not None:
        result = run_worker(json.loads(args._worker))
        with open(args._worker_out, "w") as f:
            json.dump(result, f)
        return result

    from methods import available_methods

    names = list(args.methods) if args.methods else available_methods()
    unknown = [n for n in names if n not in available_methods()]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; available: {', '.join(available_methods())}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda but CUDA is not available")

    threads_before = torch.get_num_threads()
    isolated = args.isolation == "subprocess"
    results, skipped = [], []
    started = time.perf_counter()
    try:
        for batch in args.batch_sizes:
            for name in ([] if args.skip_anchor_rows else list(ANCHORS)) + names:
                ablation_off = args.skip_token_ablation or batch not in args.token_ablation_batch_sizes
                if name == TOKEN_ABLATION and ablation_off:
                    why = ("--skip-token-ablation" if args.skip_token_ablation else
                           f"token_ablation timed only at batch sizes {args.token_ablation_batch_sizes}")
                    skipped.append(dict(name=name, batch=batch, why=why))
                    print(f"skip  {name:<24} batch {batch:>3}: {why}", file=sys.stderr, flush=True)
                    continue
                spec = dict(name=name, batch=batch, model_size=args.model_size, family=args.family,
                            seq_len=args.seq_len, device=args.device, method_options=args.method_options,
                            repeats=args.repeats, warmup=args.warmup, threads=args.threads, seed=args.seed,
                            clock=args.clock,
                            cpu_memory=isolated, retain_freed_memory=args.glibc_malloc == "retain")
                t0 = time.perf_counter()
                result = _run_isolated(spec) if isolated else run_worker(spec)
                if result.get("undefined"):
                    skipped.append(dict(name=name, batch=batch, why=result["undefined"], status="undefined"))
                    print(f"undef {name:<24} batch {batch:>3}: {result['undefined']}", file=sys.stderr, flush=True)
                    continue
                results.append(result)
                own = statistics.median(result["samples"][name])
                print(f"done  {name:<24} batch {batch:>3}: {1000 * own / batch:9.1f} ms/image "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    finally:
        torch.set_num_threads(threads_before)
    wall_s = time.perf_counter() - started

    rows = make_rows(results, skipped)
    notes = _notes(args, results)
    undefined = {s["name"]: s["why"] for s in skipped if s.get("status") == "undefined"}
    notes += [f"{name}: not defined on this model ({why})" for name, why in undefined.items()]
    model_cfg = {"bert": TEXT_SIZES, "llama": LLAMA_SIZES, "siglip": SIGLIP_SIZES,
                 **IMAGE_FAMILIES}[args.family][args.model_size]
    config = dict(model_size=args.model_size, family=args.family, model=model_cfg,
                  seq_len=args.seq_len if args.family in TEXT_FAMILIES else None,
                  global_pool="token" if args.family in IMAGE_FAMILIES else None,
                  device=args.device, threads=args.threads, batch_sizes=args.batch_sizes, repeats=args.repeats,
                  warmup=args.warmup, isolation=args.isolation, seed=args.seed, method_options=args.method_options,
                  clock=args.clock, torch=torch.__version__,
                  python=platform.python_version(), platform=platform.platform(),
                  cpu=platform.processor() or platform.machine(), wall_s=wall_s)
    try:
        import timm

        config["timm"] = timm.__version__
    except ImportError:  # pragma: no cover
        pass
    if args.device.startswith("cuda"):
        config["gpu"] = torch.cuda.get_device_name()

    table = format_table(rows)
    what = {"bert": f"BERT, {args.seq_len} positions", "llama": f"Llama, {args.seq_len} positions",
            "dinov2_reg": "DINOv2-reg ViT", "siglip": "SigLIP vision tower (attention-pooling head)"}.get(args.family,
                                                                                                        "ViT")
    print(f"attribution method cost: {args.model_size} {what} ({model_cfg}), device {args.device}, "
          f"{args.threads} threads, torch {torch.__version__}, {args.repeats} repeats, warm-up {args.warmup}, "
          f"clock {args.clock}")
    print(table)
    print()
    for note in notes:
        print("* " + note)
    print(f"wall time: {wall_s:.0f} s")
    out = dict(config=config, rows=rows, notes=notes, table=table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
