"""The read-out-row methods compose their row block by block (``methods.rollout.ReadoutRollout`` /
``ReadoutResidual``, gradients consumed during the backward pass): in float64 on tiny random models their output
equals the full-matrix computation they replaced (every per-layer map kept, the ``N x N`` composition, then the
read-out), for a [CLS] and an average-pooled ViT, a padded BERT and padded decoders; the streamed gradients and
relevances are bit-identical to the plain ones and arrive from the last layer down."""
from __future__ import annotations

import pytest
import torch

from methods import build_method
from methods.adapters import adapter_for
from methods.attention_gradients import attention_and_gradients, stream_attention_gradients
from methods.gradient_methods import generic_update
from methods.lrp import LRPEngine
from methods.readout import identity_like, read_out, read_out_identity, set_class_token_score
from methods.rollout import ReadoutResidual, ReadoutRollout, accumulate_residual, rollout
from tests.families import _decoder_batch, _tiny_decoder, _tiny_text, _token_batch
from tests.families.hf_vision import _tiny_hf, _tiny_timm_deit

timm = pytest.importorskip("timm")
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

#: name -> options of the methods whose output is a read-out row composed over blocks
CASES = [
    ("rollout", {}),
    ("rollout", {"start_layer": 1, "row_normalize": False}),
    ("generic_attribution", {}),
    ("generic_attribution", {"start_layer": 1, "head_reduction": "mean_then_clamp"}),
    ("transformer_attribution", {}),
    ("transformer_attribution", {"start_layer": -2, "row_normalize": True, "include_padding": True}),
    ("lrp_rollout", {"start_layer": 1}),
]


def _vit(global_pool):
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=3, num_heads=2, num_classes=7,
                              global_pool=global_pool)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
        for block in model.blocks:
            block.attn.qkv.weight.mul_(4.0)
    return model.eval().double()


def _models():
    """(id, model, inputs, targets, extra method options)."""
    images = torch.randn(3, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    targets = torch.tensor([1, 4, 6])
    text = _token_batch(3, with_types=True)
    yield "vit_cls", _vit("token"), images, targets, {}
    yield "vit_cls_mean_content", _vit("token"), images, targets, {"readout": "mean_content"}
    yield "vit_avg", _vit("avg"), images, targets, {}
    yield "timm_deit_weighted", _tiny_timm_deit().eval().double(), images, torch.tensor([1, 4, 2]), {}
    yield "hf_dinov2_weighted", _tiny_hf("dinov2").eval().double(), images, torch.tensor([1, 4, 2]), {}
    yield "bert_padded", _tiny_text("bert").eval(), text, torch.tensor([0, 3, 4]), {}
    yield "bert_padded_mean_content", _tiny_text("bert").eval(), text, torch.tensor([0, 3, 4]), \
        {"readout": "mean_content"}
    yield "llama_left_padded", _tiny_decoder("llama").eval(), _decoder_batch(3, "left"), torch.tensor([5, 9, 30]), {}
    yield "gpt2_right_padded", _tiny_decoder("gpt2").eval(), _decoder_batch(3, "right"), torch.tensor([5, 9, 30]), {}


MODELS = list(_models())
IDENTITY_CASES = ["vit_cls", "vit_avg", "timm_deit_weighted", "hf_dinov2_weighted", "bert_padded", "llama_left_padded"]


def _full_matrix(name, method, adapter, batch, targets):
    """What the methods computed before streaming: every block's ``[B, N, N]`` kept, then the full product."""
    start = method.start_layer % len(adapter.blocks)
    layers = list(range(start, len(adapter.blocks)))
    if name == "rollout":
        return method.rollout_matrix(adapter, batch), "zero"
    if name == "generic_attribution":
        attns, grads, _, _ = attention_and_gradients(adapter, batch, targets, layers)
        return accumulate_residual([generic_update(a, g, method.head_reduction) for a, g in zip(attns, grads)]), "zero"
    with_grads = name == "transformer_attribution"
    res = LRPEngine(method.rules).run(adapter, batch, targets, cam_layers=layers,
                                      grad_layers=layers if with_grads else ())
    if not with_grads:
        return rollout([res.attn_cam[l].clamp(min=0).mean(dim=1) for l in layers], method.row_normalize), "zero"
    normalize = method.row_normalize
    if normalize is None:
        normalize = method.AUTO_ROW_NORMALIZE[adapter.inputs.layout(batch).reference]
    mats = [(res.attn_grad[l] * res.attn_cam[l]).clamp(min=0).mean(dim=1) for l in layers]
    return rollout(mats, normalize), "row_min"


@pytest.mark.parametrize("model_id, model, inputs, targets, extra", MODELS, ids=[m[0] for m in MODELS])
def test_streamed_rows_equal_the_full_matrix_computation(model_id, model, inputs, targets, extra):
    adapter = adapter_for(model)
    for name, options in CASES:
        if name == "rollout" and "readout" in extra and "start_layer" in options:
            continue
        method = build_method(name, **{**options, **extra})
        ours = method(model, inputs, target=targets)
        with adapter.recording.eager_attention():
            batch = adapter.inputs.prepare(inputs)
            layout = adapter.inputs.layout(batch)
            matrix, auto = _full_matrix(name, method, adapter, batch, targets)
            row = read_out(matrix, adapter, batch, method.readout, layout)
            row = set_class_token_score(row, adapter, layout, method.class_token_score, auto,
                                        getattr(method, "include_padding", False))
            expected = layout.output(row)
        assert ours.shape == expected.shape
        scale = float(expected.abs().max())
        assert scale > 0, (model_id, name, options)
        torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12 * scale, msg=f"{model_id} {name} {options}")


@pytest.mark.parametrize("model_id, model, inputs, targets, extra",
                         [m for m in MODELS if m[0] in IDENTITY_CASES], ids=IDENTITY_CASES)
def test_read_out_identity_is_the_read_out_of_the_identity(model_id, model, inputs, targets, extra):
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare(inputs)
    layout = adapter.inputs.layout(batch)
    like = torch.zeros(batch.batch_size, layout.num_positions, dtype=torch.float64)
    readouts = ["auto", "mean_content"] + (["class_token"] if adapter.readout.class_token else [])
    for readout in readouts:
        eye = identity_like(batch.batch_size, layout.num_positions, like)
        assert torch.equal(read_out_identity(adapter, batch, readout, layout, like),
                           read_out(eye, adapter, batch, readout, layout)), readout


def test_row_compositions_equal_the_full_products():
    torch.manual_seed(3)
    mats = [torch.rand(2, 6, 6, dtype=torch.float64) for _ in range(4)]
    weights = torch.rand(2, 6, dtype=torch.float64)
    for read in (lambda m: m[:, 0], lambda m: (m * weights[:, :, None]).sum(dim=1)):
        for normalize in (False, True):
            composed = ReadoutRollout(normalize, read)
            for m in reversed(mats):
                composed.add(m.clone(), overwrite=True)
            torch.testing.assert_close(composed.row(), read(rollout(mats, normalize)), rtol=1e-12, atol=0)
        residual = ReadoutResidual(read(identity_like(2, 6, mats[0])))
        for m in reversed(mats):
            residual.add(m)
        torch.testing.assert_close(residual.row(), read(accumulate_residual(mats)), rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="at least one block"):
        ReadoutRollout(True, read).row()
    with pytest.raises(ValueError, match="at least one block"):
        ReadoutResidual(weights).row()


def test_a_samples_row_does_not_depend_on_its_batch_or_the_threads():
    """float32 blocks: the row a composer gives a sample is the same to the bit alone, in a batch, and at 1 or 2
    threads (so an evaluation's maps cannot depend on how its data is split over processes through them)."""
    generator = torch.Generator().manual_seed(5)
    mats = [torch.rand(3, 129, 129, generator=generator).tril_() / 129 for _ in range(3)]
    start = torch.rand(3, 129, generator=generator)
    threads = torch.get_num_threads()

    def rows(samples, num_threads):
        torch.set_num_threads(num_threads)
        residual, rolled = ReadoutResidual(start[samples]), ReadoutRollout(True, lambda m: m[:, 0])
        for m in reversed(mats):
            residual.add(m[samples])
            rolled.add(m[samples].clone(), overwrite=True)
        return residual.row(), rolled.row()

    try:
        batched = rows(slice(None), 2)
        for samples, num_threads in ((slice(None), 1), (slice(1, 2), 1), (slice(1, 2), 2), (slice(0, 2), 1)):
            for row, reference in zip(rows(samples, num_threads), batched):
                assert torch.equal(row, reference[samples]), (samples, num_threads)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("model_id", ["vit_cls", "llama_left_padded"])
def test_streamed_gradients_arrive_top_down_and_equal_the_plain_ones(model_id):
    _, model, inputs, targets, _ = next(m for m in MODELS if m[0] == model_id)
    adapter = adapter_for(model)
    seen = []
    with adapter.recording.eager_attention():
        batch = adapter.inputs.prepare(inputs)
        attns, grads, logits, _ = attention_and_gradients(adapter, batch, targets, [0, 1, 2])

        def consume(layer, attn, grad):
            seen.append(layer)
            assert torch.equal(attn, attns[layer]) and torch.equal(grad, grads[layer])

        streamed_logits, _ = stream_attention_gradients(adapter, batch, targets, [2, 0, 1], consume)
    assert seen == [2, 1, 0]
    assert torch.equal(streamed_logits, logits)


def test_engine_relevance_is_the_same_inside_the_backward_pass():
    """With ``grad_layers`` the relevance pass runs inside the backward; ``R_A`` is bit-identical to the pass
    without gradients and the gradients to a plain ``autograd.grad``."""
    model, images, targets = _vit("token"), MODELS[0][2], MODELS[0][3]
    adapter = adapter_for(model)
    with adapter.recording.eager_attention():
        batch = adapter.inputs.prepare(images)
        plain = LRPEngine("ours").run(adapter, batch, targets, cam_layers=[0, 1, 2])
        streamed = LRPEngine("ours").run(adapter, batch, targets, cam_layers=[0, 1, 2], grad_layers=[0, 1, 2])
        _, grads, _, _ = attention_and_gradients(adapter, batch, targets, [0, 1, 2])
    for layer in range(3):
        assert torch.equal(streamed.attn_cam[layer], plain.attn_cam[layer])
        assert torch.equal(streamed.attn_grad[layer], grads[layer])


@pytest.mark.parametrize("model_id", ["vit_cls", "llama_left_padded"])
def test_frozen_models_stream_the_same_rows(model_id):
    """Frozen parameters: the lowest recorded map is then a leaf of the graph (its gradient is the one
    ``autograd.grad`` returns, not a hook's); the rows are the same and no parameter gets a ``.grad``."""
    _, model, inputs, targets, _ = next(m for m in MODELS if m[0] == model_id)
    for name, options in (("generic_attribution", {}), ("transformer_attribution", {}),
                          ("generic_attribution", {"start_layer": -1})):
        method = build_method(name, **options)
        trained = method(model, inputs, target=targets)
        for p in model.parameters():
            p.requires_grad_(False)
        try:
            frozen = method(model, inputs, target=targets)
        finally:
            for p in model.parameters():
                p.requires_grad_(True)
        assert torch.equal(frozen, trained), (name, options)
        assert all(p.grad is None for p in model.parameters())
