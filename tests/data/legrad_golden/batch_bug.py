"""The package with today's open_clip (not run by CI): what ``legrad-torch`` 1.1 computes once its pin is lifted.

    python -m venv --system-site-packages venv_now          # open-clip-torch 3.x from the system
    venv_now/bin/pip install --no-deps legrad-torch==1.1 einops
    venv_now/bin/python tests/data/legrad_golden/batch_bug.py

open_clip >= 2.24 runs its blocks batch-first (``[B, N, D]``); the package's hooks were written for the
sequence-first layout (``[N, B, D]``): ``feat_post_mlp.mean(dim=0)`` then averages over the **batch** instead of
the tokens, and its hooked attention takes the batch for the sequence. Prints the package's maps next to the
pinned goldens (``legrad_golden.npz``) for the golden's batch of 3 and for each image alone.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import open_clip
import torch
from legrad import LeWrapper
from open_clip.version import __version__ as open_clip_version

HERE = Path(__file__).resolve().parent


def main() -> None:
    data = np.load(HERE / "legrad_golden.npz")
    images, classes = torch.from_numpy(data["images"]).double(), torch.from_numpy(data["class_embeddings"]).double()
    targets = data["targets"].tolist()
    vision = dict(image_size=16, patch_size=4, width=24, layers=3, head_width=12, mlp_ratio=2.0, pool_type="tok")
    text = dict(context_length=12, vocab_size=40, width=16, heads=2, layers=1, mlp_ratio=2.0)
    print("open_clip", open_clip_version)
    maps = {}
    for layer_index, rows in ((li, r) for li in (0, -2) for r in ([0, 1, 2], [0], [1], [2])):
        expected = data[f"tok_layer{layer_index}_float64"][0]
        clip = open_clip.model.CLIP(embed_dim=8, vision_cfg=vision, text_cfg=text)
        clip.load_state_dict(torch.load(HERE / "open_clip_tok.pt"))
        wrapper = LeWrapper(clip.double().eval(), layer_index=layer_index)
        text_embedding = torch.nn.functional.normalize(classes, dim=-1)[[targets[r] for r in rows]]
        try:
            wrapper.encode_image(images[rows])
            heatmap = wrapper.compute_legrad_clip(text_embedding=text_embedding).detach().numpy()[0]
        except Exception as err:  # noqa: BLE001 - the point is to show what the package does
            print(f"layer_index {layer_index}, images {rows}: {type(err).__name__}: {err}")
            continue
        maps[layer_index, tuple(rows)] = heatmap
        print(f"layer_index {layer_index}, images {rows}: map shape {heatmap.shape}; "
              "max |package today - pinned golden| per image:",
              [float(np.abs(heatmap[i] - expected[r]).max()) if heatmap.shape[-2:] == expected.shape[-2:]
               else "shape differs" for i, r in enumerate(rows)])

    for layer_index in (0, -2):
        if (layer_index, (0, 1, 2)) in maps:
            print(f"layer_index {layer_index}: max |package in the batch of 3 - package alone| per image:",
                  [float(np.abs(maps[layer_index, (0, 1, 2)][i] - maps[layer_index, (i,)][0]).max())
                   for i in range(3)])


if __name__ == "__main__":
    main()
