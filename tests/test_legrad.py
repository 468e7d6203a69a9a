"""LeGrad (``methods/legrad.py``): the authors' package's outputs, the lens capability, the equation by hand."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from methods import MethodUndefinedError, build_method, tokens_to_map
from methods.adapters import adapter_for
from tests.families import FAMILIES, LEGRAD_ROWS, _images, _tiny_bert, _tiny_vit
from tests.test_method_contract import test_method_contract as _contract

GOLDEN = Path(__file__).resolve().parent / "data" / "legrad_golden"
#: the package's layer_index -> our ``layers``
LAYERS = {0: "all", -2: 2, -1: 1}


def _golden_classifier(model_file: str, vision_cfg: dict, classes: torch.Tensor, dtype: torch.dtype):
    """The golden's tiny open_clip CLIP (built as the generating script builds it, in today's open_clip) behind
    the package's zero-shot classifier."""
    open_clip = pytest.importorskip("open_clip")
    from models.clip import ZeroShotClassifier

    vision = dict(image_size=16, patch_size=4, width=24, layers=3, head_width=12, mlp_ratio=2.0, **vision_cfg)
    text = dict(context_length=12, vocab_size=40, width=16, heads=2, layers=1, mlp_ratio=2.0)
    clip = open_clip.model.CLIP(embed_dim=8, vision_cfg=vision, text_cfg=text)
    clip.load_state_dict(torch.load(GOLDEN / model_file))
    return ZeroShotClassifier(clip.eval(), classes).to(dtype)


def _cases():
    meta = json.loads((GOLDEN / "legrad_golden.cases.json").read_text())
    return [pytest.param(case, id=case["key"]) for case in meta["cases"]]


@pytest.mark.parametrize("case", _cases())
def test_equals_the_authors_package_batched_and_alone(case):
    """legrad-torch 1.1 with open-clip-torch 2.23 (``make_golden.py``): the pixel map of the batched call and of
    each sample alone, upsampled as the package does (bilinear by the patch size, then min-max), within float32
    1e-4 / float64 1e-6 of the largest score (1)."""
    data = np.load(GOLDEN / "legrad_golden.npz")
    dtype = torch.float64 if case["dtype"] == "torch.float64" else torch.float32
    model = _golden_classifier(case["model"], case["vision_cfg"], torch.from_numpy(data["class_embeddings"]), dtype)
    images = torch.from_numpy(data["images"]).to(dtype)
    targets = torch.from_numpy(data["targets"])
    expected = torch.from_numpy(data[case["key"]])[0]
    method = build_method("legrad", layers=LAYERS[case["layer_index"]])
    tolerance = 1e-6 if dtype == torch.float64 else 1e-4
    batched = method(model, images, target=targets)
    alone = torch.cat([method(model, images[i:i + 1], target=targets[i:i + 1]) for i in range(3)])
    for scores in (batched, alone):
        maps = tokens_to_map(scores, patch_size=4, normalize=True)
        torch.testing.assert_close(maps, expected.to(maps.dtype), rtol=0, atol=tolerance)


def test_the_equation_on_a_hand_worked_case():
    """One block, ``pool='readout'``, no min-max: ``mean_h mean_q ReLU(d s / d A)`` read at the patch columns,
    with ``d s / d A`` worked out by hand from timm's block (``s = w_c . head(norm(x + proj(A v) + mlp(...)))``)
    through autograd on the explicit formula, with gradients stopped at the block's input."""
    model = _tiny_vit("token").eval()
    x = _images(2)
    target = torch.tensor([2, 3])
    ours = build_method("legrad", layers=1, pool="readout", minmax=False)(model, x, target=target)
    block = model.blocks[-1]
    with torch.no_grad():
        hidden = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))
        for earlier in model.blocks[:-1]:
            hidden = earlier(hidden)
    attn = block.attn
    b, n, d = hidden.shape
    h = attn.num_heads
    qkv = attn.qkv(block.norm1(hidden)).reshape(b, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    probabilities = ((attn.q_norm(q) * attn.scale) @ attn.k_norm(k).transpose(-2, -1)).softmax(-1).detach()
    probabilities.requires_grad_(True)
    mixed = attn.proj((probabilities @ v.detach()).transpose(1, 2).reshape(b, n, d))
    out = hidden + block.ls1(mixed)
    out = out + block.ls2(block.mlp(block.norm2(out)))
    logits = model.head(model.norm(out)[:, 0])
    (grad,) = torch.autograd.grad(logits.gather(1, target[:, None]).sum(), probabilities)
    expected = grad.clamp(min=0).mean(dim=1).mean(dim=1)[:, 1:]
    torch.testing.assert_close(ours, expected, rtol=1e-9, atol=1e-12)


def test_gradients_stop_at_each_block():
    """Two layers give the sum of each layer's own map: the last block's gradient of the second-to-last lens
    score does not leak into it (the package differentiates ``s_l`` to ``A_l`` alone)."""
    model = _tiny_vit("token").eval()
    x = _images(2)
    target = torch.tensor([1, 0])
    both = build_method("legrad", layers=2, minmax=False)(model, x, target=target)
    last = build_method("legrad", layers=1, minmax=False)(model, x, target=target)
    blocks = model.blocks   # the model cut after its second-to-last block: its own last-layer map
    model.blocks = blocks[:len(blocks) - 1]
    try:
        second = build_method("legrad", layers=1, minmax=False)(model, x, target=target)
    finally:
        model.blocks = blocks
    torch.testing.assert_close(both, last + second, rtol=1e-9, atol=1e-12)


def test_the_lens_of_the_last_block_is_the_models_own_head():
    """``adapter.lens`` reads each position through the family's head: the [CLS] position of the last hidden states
    gives the model's logits ([CLS] read-out), and so does the mean of the patches of an average-pooled ViT."""
    for pool, positions in (("token", slice(0, 1)), ("avg", slice(1, None))):
        model = _tiny_vit(pool).eval()
        adapter = adapter_for(model)
        inputs = adapter.inputs.prepare(_images(2))
        context = adapter.inputs.context(inputs)
        with torch.no_grad():
            hidden = adapter.run_blocks(adapter.embed(inputs), context)
            lens = adapter.lens.logits(hidden[:, positions].mean(dim=1, keepdim=True), context)[:, 0]
            torch.testing.assert_close(lens, model(_images(2)), rtol=1e-9, atol=1e-12)
            assert adapter.lens.logits(hidden, context).shape == (2, hidden.shape[1], model.num_classes)


def test_options_and_refusals_are_named():
    with pytest.raises(ValueError, match="layers must be 'all' or a number"):
        build_method("legrad", layers=0)
    with pytest.raises(ValueError, match="pool must be one of"):
        build_method("legrad", pool="max")
    model = _tiny_vit("token").eval()
    with pytest.raises(ValueError, match="asks for more blocks"):
        build_method("legrad", layers=99).check(model)
    with pytest.raises(MethodUndefinedError, match="no logit lens"):
        build_method("legrad").check(_tiny_bert())


@pytest.mark.parametrize("row", ["timm_vit_reg4_dinov2", "hf_siglip_vision", "open_clip_vision", "hf_bert"])
def test_contract_on_a_few_rows(row):
    """The conformance matrix's contract in the default tier on a few rows (the whole matrix: ``-m slow``): shape,
    batched equals alone, the model unchanged; refused by name where the family has no lens."""
    family = next(f for f in FAMILIES if f.name == row)
    assert (row in LEGRAD_ROWS) == ("legrad" not in family.undefined)
    _contract(family, "legrad")
