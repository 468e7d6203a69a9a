"""AttCAT, Transition Attention Maps and Grad-SAM (issue 37) against their authors' code and their equations.

Goldens (``tests/data/attcat_golden``, ``tests/data/transition_attention_golden``: the reference's commit, the
generating script and its shims are in each folder): the authors' own generators at batch 1 on the seeded random
BERT / ViT of ``../shared/golden`` (``bi_bert.npz``, ``te_vit.npz``). Our calls are batched: the three examples
twice (predicted class, then the other class), per-sample targets, the padded example included. Grad-SAM has no
authors' code: its equation is re-derived here from the attention maps and their gradients.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from methods import MethodUndefinedError, build_method
from methods.adapters import adapter_for
from methods.attention_gradients import attention_and_gradients
from tests.generic_baselines_support import batch_of, family, length_of, samples, unpadded_row

transformers = pytest.importorskip("transformers")
timm_vit = pytest.importorskip("timm.models.vision_transformer")

DATA = os.path.join(os.path.dirname(__file__), "data")
SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "golden")
BERT_CONFIG = dict(vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
                   max_position_embeddings=64, type_vocab_size=2, num_labels=2, hidden_act="gelu",
                   layer_norm_eps=1e-12, pad_token_id=0)
#: float64: measured 2e-15 (AttCAT), 1.1e-7 (TAM: the reference sums its step gradients in a float32 buffer,
#: ``torch.zeros(b, h, s, s)``, so its float64 run is float32-accurate there); float32: the issue's 1e-4
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4}


def _rel(ours: np.ndarray, gold: np.ndarray) -> float:
    return float(np.abs(ours - gold).max() / np.abs(gold).max())


# ------------------------------------------------------------------------------------------------ AttCAT
@pytest.fixture(scope="module")
def attcat_golden():
    return np.load(os.path.join(DATA, "attcat_golden", "attcat_bert.npz"))


def _golden_bert(dtype):
    """The seeded BERT of ``../shared/golden/bi_bert.npz`` (the model the AttCAT golden was made on)."""
    weights = np.load(os.path.join(SHARED, "bi_bert.npz"))
    model = transformers.BertForSequenceClassification(transformers.BertConfig(**BERT_CONFIG))
    model.load_state_dict({k[2:]: torch.from_numpy(weights[k]) for k in weights.files if k.startswith("w/")},
                          strict=True)
    return model.to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_attcat_equals_the_authors_code_batched_with_padding(attcat_golden, dtype):
    z = attcat_golden
    assert json.loads(str(z["meta_json"]))["commit"].startswith("441262f7a352a6abad40d575f6bccb4b1853101f")
    model = _golden_bert(dtype)
    ids, mask = torch.from_numpy(z["input_ids"]), torch.from_numpy(z["attention_mask"])
    batch = {"input_ids": ids.repeat(2, 1), "attention_mask": mask.repeat(2, 1)}
    targets = torch.from_numpy(z["targets"]).t().flatten()               # [pred x 3, other x 3]
    tag = "f64" if dtype == torch.float64 else "f32"
    real = build_method("attcat")(model, batch, target=targets).double().numpy().reshape(2, 3, -1).transpose(1, 0, 2)
    every_row = build_method("attcat", query_rows="all")(model, batch, target=targets).double().numpy()
    every_row = every_row.reshape(2, 3, -1).transpose(1, 0, 2)
    padded, cut = z[f"padded_{tag}"], z[f"cut_{tag}"]
    tol = TOLERANCE[dtype]
    # full-length examples: both conventions are the reference's
    assert _rel(real[:2], padded[:2]) <= tol and _rel(every_row[:2], padded[:2]) <= tol
    # the padded example: the default equals the reference on the real tokens alone (cut), ``all`` its padded run
    length = int(mask[2].sum())
    assert _rel(real[2, :, :length], cut) <= tol
    assert (real[2, :, length:] == 0).all()
    assert _rel(every_row[2, :, :length], padded[2, :, :length]) <= tol
    # and the two conventions differ there (the test can tell them apart)
    assert _rel(real[2, :, :length], padded[2, :, :length]) > 100 * tol


# ------------------------------------------------------------------------------------ Transition Attention Maps
TAM_CALLS = {"default": {}, "s0": dict(start_layer=0), "s1_steps5": dict(start_layer=1, steps=5),
             "s0_no_integral": dict(start_layer=0, integrated=False), "s0_first_state": dict(start_layer=0,
                                                                                             first_state=True)}


#: the 20-step calls cost about 10 s each here: slow tier; the 5-step and gradient-only calls run by default
TAM_CASES = [pytest.param(key, dtype, id=f"{key}-{str(dtype)[6:]}",
                          marks=() if key in ("s1_steps5", "s0_no_integral") else pytest.mark.slow)
             for key in TAM_CALLS for dtype in (torch.float64, torch.float32)]


@pytest.fixture(scope="module")
def tam_golden():
    z = np.load(os.path.join(DATA, "transition_attention_golden", "transition_attention_vit.npz"))
    assert json.loads(str(z["meta_json"]))["commit"] == "8329327179f6dcf76df29e03ae519cd594595678"
    vit = np.load(os.path.join(SHARED, "te_vit.npz"))
    model = timm_vit.VisionTransformer(img_size=224, embed_dim=192, depth=4, num_heads=3, mlp_ratio=4, qkv_bias=True,
                                       num_classes=1000)
    model.load_state_dict({k[2:]: torch.from_numpy(vit[k]) for k in vit.files if k.startswith("w/")}, strict=True)
    return z, model.eval(), torch.from_numpy(vit["images"])


@pytest.mark.parametrize("key,dtype", TAM_CASES)
def test_transition_attention_equals_the_authors_code(tam_golden, key, dtype):
    z, model, images = tam_golden
    model = model.to(dtype)
    images = images.to(dtype).repeat(2, 1, 1, 1)
    targets = torch.from_numpy(z["targets"]).t().flatten()
    tag = "f64" if dtype == torch.float64 else "f32"
    options = TAM_CALLS[key]
    ours = build_method("transition_attention", **options)(model, images, target=targets).double().numpy()
    error = _rel(ours.reshape(2, 3, -1).transpose(1, 0, 2), z[f"{key}_{tag}"])
    assert error <= TOLERANCE[dtype], (key, error)
    if dtype == torch.float64 and not options.get("integrated", True):
        assert error <= 1e-12, (key, error)          # no float32 step buffer in the reference there


def test_transition_attention_refuses_blocks_below_a_token_merge():
    fam = family("timm_swin")
    model = fam.build().eval()
    with pytest.raises(MethodUndefinedError, match="another token space"):
        build_method("transition_attention", start_layer=0)(model, fam.inputs(1))


# ------------------------------------------------------------------------------------------------ Grad-SAM
@pytest.mark.parametrize("name", ["timm_vit_cls", "hf_bert_types_special", "hf_gpt2_left"])
def test_grad_sam_is_its_equation(name):
    """``mean_l mean_i mean_h (A ⊙ ReLU(∇A))_ij`` over the real query rows ``i``, from the recorded maps and
    gradients of the target's logit."""
    fam = family(name)
    model = fam.build().eval().double()
    inputs = fam.inputs(3)
    targets = torch.tensor([0, 2, 1])
    ours = build_method("grad_sam")(model, inputs, target=targets)
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare(inputs)
    with adapter.recording.eager_attention():
        attns, grads, _, _ = attention_and_gradients(adapter, batch, targets, range(len(adapter.blocks)))
    layout = adapter.inputs.layout(batch)
    rows = layout.real_positions(torch.empty(3, layout.num_positions)).double()
    per_layer = []
    for a, g in zip(attns, grads):
        m = (a * g.clamp(min=0)).mean(dim=1)                             # [B, N, N]
        per_layer.append((m * rows[:, :, None]).sum(dim=1) / rows.sum(dim=1, keepdim=True))
    expected = layout.output(torch.stack(per_layer).mean(dim=0))
    torch.testing.assert_close(ours.double(), expected, rtol=0, atol=1e-12 * float(expected.abs().max()))


# ------------------------------------------------------------------------------ batched == alone, every method
@pytest.mark.parametrize("name", ["timm_vit_cls", "hf_bert_types_special", "hf_gpt2_left", "hf_qwen3_right",
                                  "hf_clip_text"])
def test_batched_equals_alone_at_1_and_3(name):
    fam = family(name)
    model = fam.build().eval().double()
    pool = samples(fam)
    methods = {"attcat": {}, "grad_sam": {}, "transition_attention": dict(start_layer=0, steps=3)}
    for method_name, options in methods.items():
        method = build_method(method_name, **options)
        alone = [method(model, s, target=i % 5) for i, s in enumerate(pool)]
        for size in (1, 3):
            rows = [(i * 2 + size) % len(pool) for i in range(size)]
            batch = batch_of(fam, [pool[r] for r in rows])
            out = method(model, batch, target=torch.tensor([r % 5 for r in rows]))
            for i, r in enumerate(rows):
                row = unpadded_row(fam, batch, out, i, length_of(pool[r]))
                torch.testing.assert_close(row, alone[r], rtol=0, atol=1e-6 * max(1e-30, float(alone[r].abs().max())),
                                           msg=f"{method_name} row {i}")
            padding = fam.padding(batch) if not isinstance(batch, torch.Tensor) else None
            if padding is not None and padding.any():
                assert (out[padding] == 0).all(), method_name


def test_options_are_checked():
    with pytest.raises(ValueError, match="query_rows"):
        build_method("attcat", query_rows="padding")
    with pytest.raises(ValueError, match="query_rows"):
        build_method("grad_sam", query_rows="some")
    fam = family("timm_vit_cls")
    with pytest.raises(ValueError, match="start_layer=9"):
        build_method("attcat", start_layer=9)(fam.build().eval(), fam.inputs(1))
