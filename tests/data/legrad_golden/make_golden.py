"""Generate ``legrad_golden.npz``: LeGrad as the authors' package computes it (not run by CI).

Reference: ``legrad-torch`` 1.1 (PyPI; its ``legrad/`` equals github.com/WalBouss/LeGrad at commit
a9edb031422d5f5829d9e6238a1e21feb1972c92) with its pinned ``open-clip-torch==2.23.0`` (sequence-first blocks,
the layout the package was written for), offline, in a scratch venv::

    python -m venv --system-site-packages venv
    venv/bin/pip install legrad-torch==1.1 "open-clip-torch==2.23.0"
    venv/bin/python tests/data/legrad_golden/make_golden.py

Models: tiny seeded ``open_clip.model.CLIP`` (16x16 images, 4x4 patches, width 24, 3 blocks, 2 heads, 8-d joint
space), their state dicts saved beside the goldens (they load into the current stock class). For each case the
images' embeddings are computed once (``encode_image`` of a batch of 3 different images) and
``compute_legrad_clip`` explains row i against the normalised class embedding of target i (the package's own
per-prompt diagonal), in float32 and float64. The output is the package's pixel map ``[1, B, 16, 16]``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import open_clip
import torch
from legrad import LeWrapper

HERE = Path(__file__).resolve().parent
TARGETS = [1, 4, 0]
MODELS = {
    "tok": dict(pool_type="tok"),
    "avg_ls": dict(pool_type="avg", ls_init_value=0.5),
}
CASES = [("tok", 0), ("tok", -2), ("avg_ls", 0), ("avg_ls", -1)]


def tiny_clip(seed: int, **vision_options) -> torch.nn.Module:
    torch.manual_seed(seed)
    vision = dict(image_size=16, patch_size=4, width=24, layers=3, head_width=12, mlp_ratio=2.0, **vision_options)
    text = dict(context_length=12, vocab_size=40, width=16, heads=2, layers=1, mlp_ratio=2.0)
    model = open_clip.model.CLIP(embed_dim=8, vision_cfg=vision, text_cfg=text)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("in_proj_weight"):
                p[:2 * p.shape[1]].add_(2.0 * torch.randn_like(p[:2 * p.shape[1]]))
                p[2 * p.shape[1]:].add_(0.3 * torch.randn_like(p[2 * p.shape[1]:]))
            elif name.endswith("gamma"):
                p.add_(0.5 + 0.3 * torch.randn_like(p))
            elif name != "logit_scale":
                p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def main() -> None:
    images = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    classes = torch.randn(5, 8, generator=torch.Generator().manual_seed(6))
    out = {"images": images.numpy(), "class_embeddings": classes.numpy(), "targets": np.array(TARGETS)}
    cases = []
    for seed, (name, options) in enumerate(MODELS.items()):
        model = tiny_clip(seed, **options)
        torch.save(model.state_dict(), HERE / f"open_clip_{name}.pt")
    for name, layer_index in CASES:
        for dtype in (torch.float32, torch.float64):
            model = tiny_clip(list(MODELS).index(name), **MODELS[name])
            model.load_state_dict(torch.load(HERE / f"open_clip_{name}.pt"))
            model = model.to(dtype)
            wrapper = LeWrapper(model, layer_index=layer_index)
            text = torch.nn.functional.normalize(classes.to(dtype), dim=-1)[TARGETS]
            wrapper.encode_image(images.to(dtype))
            heatmap = wrapper.compute_legrad_clip(text_embedding=text)
            key = f"{name}_layer{layer_index}_{str(dtype).split('.')[-1]}"
            out[key] = heatmap.detach().numpy()
            cases.append({"key": key, "model": f"open_clip_{name}.pt", "vision_cfg": MODELS[name],
                          "layer_index": layer_index, "dtype": str(dtype), "targets": TARGETS,
                          "call": "LeWrapper(model, layer_index).encode_image(images); "
                                  "compute_legrad_clip(text_embedding=normalize(class_embeddings)[targets])"})
    np.savez(HERE / "legrad_golden.npz", **out)
    meta = {"reference": "legrad-torch 1.1 (PyPI) = github.com/WalBouss/LeGrad@"
                         "a9edb031422d5f5829d9e6238a1e21feb1972c92",
            "open_clip": "open-clip-torch 2.23.0", "torch": torch.__version__, "cases": cases}
    (HERE / "legrad_golden.cases.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
