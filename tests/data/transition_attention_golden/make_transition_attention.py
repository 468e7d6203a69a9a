"""Golden outputs of the Transition Attention Maps authors' code (XianrenYty/Transition_Attention_Maps,
``baselines/ViT/interpret_methods.py::InterpretTransformer.transition_attention_maps`` on its ``ViT_new.py``
VisionTransformer) on the seeded random ViT of ``../shared/golden/te_vit.npz`` (timm key names: its weights load
into the reference's class as they are; its 3 images, its predicted and other classes).

Not run by CI. Needs the reference tree at ``$TAM_REF`` (the files of commit
8329327179f6dcf76df29e03ae519cd594595678; ``git archive`` fails on two absent blobs of the mirror, images and a
notebook, so extract file by file), ``einops`` (a scratch venv), torch. One shim: ``torch.Tensor.cuda`` is the
identity (the code calls ``.cuda()``; CPU run).

  TAM_REF=.../TAM SHARED=../../../../shared python make_transition_attention.py OUT.npz
"""
import json
import os
import sys
from functools import partial

import numpy as np
import torch

torch.Tensor.cuda = lambda self, *a, **k: self          # the one shim: their code calls .cuda() on CPU tensors
sys.path.insert(0, os.environ["TAM_REF"])
from baselines.ViT.interpret_methods import InterpretTransformer  # noqa: E402
from baselines.ViT.ViT_new import VisionTransformer  # noqa: E402

torch.set_num_threads(1)
z = np.load(os.path.join(os.environ["SHARED"], "golden", "te_vit.npz"))
weights = {k[2:]: torch.from_numpy(z[k]) for k in z.files if k.startswith("w/")}
images = torch.from_numpy(z["images"])
targets = np.stack([z["pred_class"], z["other_class"]], axis=1)        # [3, 2]
CALLS = {   # key -> the reference's keyword arguments
    "default": dict(),                                                  # start_layer=4, steps=20, with_integral
    "s0": dict(start_layer=0),
    "s1_steps5": dict(start_layer=1, steps=5),
    "s0_no_integral": dict(start_layer=0, with_integral=False),
    "s0_first_state": dict(start_layer=0, first_state=True),
}
out = {"targets": targets}
for dtype in (torch.float32, torch.float64):
    model = VisionTransformer(img_size=224, patch_size=16, embed_dim=192, depth=4, num_heads=3, qkv_bias=True,
                              num_classes=1000, norm_layer=partial(torch.nn.LayerNorm, eps=1e-6))  # as its vit_base
    model.load_state_dict(weights, strict=True)
    model = model.to(dtype).eval()
    explainer = InterpretTransformer(model)
    tag = "f32" if dtype == torch.float32 else "f64"
    for key, kwargs in CALLS.items():
        maps = np.zeros((3, 2, 196))
        for i in range(3):
            for j in range(2):
                cam = explainer.transition_attention_maps(images[i:i + 1].to(dtype), index=int(targets[i, j]),
                                                          **kwargs)
                maps[i, j] = cam.detach().double().numpy()[0]
        out[f"{key}_{tag}"] = maps
out["meta_json"] = np.array(json.dumps({
    "reference": "XianrenYty/Transition_Attention_Maps", "commit": "8329327179f6dcf76df29e03ae519cd594595678",
    "call": "InterpretTransformer(model).transition_attention_maps(image, index=target, **kwargs), batch 1",
    "calls": CALLS,
    "model": "te_vit.npz weights (depth 4, width 192, 3 heads, 224 px, patch 16, qkv bias, LayerNorm eps 1e-6 "
             "as the reference's vit_base_patch16_224)",
    "torch": torch.__version__, "shims": ["torch.Tensor.cuda = identity"]}))
np.savez_compressed(sys.argv[1], **out)
print({k: v.shape for k, v in out.items()})
