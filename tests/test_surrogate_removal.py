"""KernelSHAP and LIME with ``mode="removal"`` (issue 38): absent features dropped from the sequence by the family's
token removal. Against Captum 0.9.0 fed the same coalitions with a forward that cuts the absent positions out by
hand (not through the adapter's ``drop_positions``), KernelSHAP's efficiency, batched == alone with padding, and the
refusals. Float64 throughout."""
from __future__ import annotations

import pytest
import torch

from methods import MethodUndefinedError, build_method
from methods.adapters import SequenceContext
from methods.captum_bridge import captum_forward
from methods.feature_replacement import feature_positions
from tests.generic_baselines_support import (
    assert_batched_equals_alone,
    captum_surrogate,
    captum_view,
    family,
    sample_seed,
    samples,
)

captum_attr = pytest.importorskip("captum.attr")


def _cut_logits(model, sample, keep_features):
    """Logits ``[1, C]`` of ``sample`` (batch 1) with the features where ``keep_features`` (bool ``[M]``) is
    False cut out of the hidden states entering block 0 by index: the mask and position ids kept at the kept
    positions, a position read-out moved to the last kept position at or before it."""
    adapter, batch, _, layout = captum_view(model, sample)
    positions = feature_positions(adapter, batch)[0] + (layout.num_positions - layout.num_scores)
    keep = torch.ones(layout.num_positions, dtype=torch.bool)
    keep[positions[~keep_features]] = False
    index = keep.nonzero().flatten()
    context = adapter.inputs.context(batch)
    hidden = adapter.embed(batch)[:, index]
    readout = context.readout_positions
    if readout is not None:
        readout = (keep[:int(readout[0]) + 1].sum() - 1).reshape(1).to(readout)
    short = SequenceContext(None if context.attention_mask is None else context.attention_mask[:, index], readout,
                            None if context.position_ids is None else context.position_ids[:, index])
    return adapter.head(adapter.run_blocks(hidden, short), short)


def _feature_mask(model, sample):
    """Captum's feature mask at the input point (batch 1): content position / patch ``k`` -> ``k``; the special
    tokens join feature 0 with their own values as baseline (so they change nothing); and the baselines: 0 at the
    features."""
    adapter, batch, point, layout = captum_view(model, sample)
    _, x, _ = captum_forward(model, sample)
    if point == "pixels":
        rows, cols = layout.grid
        ids = torch.arange(rows * cols).reshape(rows, cols)
        ids = ids.repeat_interleave(x.shape[-2] // rows, 0).repeat_interleave(x.shape[-1] // cols, 1)
        return ids[None, None].expand_as(x).contiguous(), x, torch.zeros_like(x)
    content = layout.content_positions(batch["input_ids"])[0]
    ids = torch.zeros(content.shape[0], dtype=torch.long)
    ids[content] = torch.arange(int(content.sum()))
    start = torch.where(content[None, :, None], torch.zeros_like(x), x)
    return ids[None, :, None].expand_as(x).contiguous(), x, start


def _removing_forward(model, sample, mask):
    """A Captum forward that reads which features a perturbed input zeroed and cuts them out (:func:`_cut_logits`)."""
    adapter, batch, point, _ = captum_view(model, sample)
    features = len(feature_positions(adapter, batch)[0])
    content = None if point == "pixels" else adapter.inputs.layout(batch).content_positions(batch["input_ids"])[0]

    def forward(values, *_extra):
        rows = []
        for row in values:
            present = torch.zeros(features, dtype=torch.bool)
            for k in range(features):
                where = mask[0] == k
                if content is not None:
                    where = where & content[:, None]
                present[k] = bool(row[where].ne(0).any())
            with torch.no_grad():
                rows.append(_cut_logits(model, sample, present))
        return torch.cat(rows)
    return forward


def _close(ours, theirs, tol=1e-6):
    scale = max(1.0, float(theirs.abs().max()))
    diff = float((ours - theirs).abs().max())
    assert diff <= tol * scale, f"max abs diff {diff:.2e} (scale {scale:.2e})"


@pytest.mark.parametrize("name", ["timm_vit_cls", "hf_bert_types_special", "hf_llama_gqa_left", "hf_clip_text"])
@pytest.mark.parametrize("kind", ["kernel_shap", "lime"])
def test_removal_equals_captum_fed_the_same_coalitions_and_a_cutting_forward(name, kind):
    fam = family(name)
    model = fam.build().eval()
    sample = fam.single(fam.inputs(3), 0)
    options = {"end_weight": 1e6} if kind == "kernel_shap" else {}
    got = build_method(kind, samples=20, seed=3, mode="removal", **options)(model, sample, target=1,
                                                                           sample_ids=[7])
    mask, x, start = _feature_mask(model, sample)
    forward = _removing_forward(model, sample, mask)
    explainer = captum_surrogate(kind, forward)
    torch.manual_seed(sample_seed(model, sample, 3, kind))
    theirs = explainer.attribute(x, baselines=start, target=1, feature_mask=mask, n_samples=20,
                                 return_input_shape=False)
    adapter, batch, point, layout = captum_view(model, sample)
    ours = got[0] if point == "pixels" else got[0][layout.content_positions(batch["input_ids"])[0]]
    assert ours.abs().max() > 0
    _close(ours, theirs[0].double())
    replaced = build_method(kind, samples=20, seed=3, **options)(model, sample, target=1, sample_ids=[7])
    assert not torch.allclose(replaced, got), "removal gives the replacement mode's scores"


@pytest.mark.parametrize("name", ["timm_vit_cls", "hf_bert_types_special", "hf_llama_gqa_left"])
def test_kernel_shap_removal_efficiency(name):
    """Scores sum to y(x) - y(every feature cut out) to 1e-6, per sample of a padded batch."""
    fam = family(name)
    model = fam.build().eval()
    inputs = fam.inputs(3)
    targets = torch.tensor([1, 4, 0])
    scores = build_method("kernel_shap", samples=30, mode="removal")(model, inputs, target=targets,
                                                                     sample_ids=[1, 2, 3])
    for b in range(3):
        sample = fam.single(inputs, b)
        m = len(feature_positions(*captum_view(model, sample)[:2])[0])
        with torch.no_grad():
            full = _cut_logits(model, sample, torch.ones(m, dtype=torch.bool))[0, targets[b]]
            empty = _cut_logits(model, sample, torch.zeros(m, dtype=torch.bool))[0, targets[b]]
        change = float(full - empty)
        gap = abs(float(scores[b].sum()) - change)
        assert gap <= 1e-6 * max(1.0, abs(change)), (b, gap, change)


@pytest.mark.parametrize("name", ["hf_bert_types_special", "hf_llama_gqa_left",
                                  pytest.param("hf_deberta_v3", marks=pytest.mark.slow),
                                  pytest.param("timm_vit_cls", marks=pytest.mark.slow)])
def test_removal_batched_equals_alone_at_1_3_16(name):
    """Mixed padding (BERT right, Llama left, DeBERTa's removal by masking), padding exactly 0."""
    fam = family(name)
    model = fam.build().eval()
    pool = samples(fam)
    for method_name in ("kernel_shap", "lime"):
        method = build_method(method_name, samples=10, mode="removal", batch_size=7)
        assert_batched_equals_alone(fam, model, method, pool, method_name, id_offset=40)


@pytest.mark.parametrize("name,reason", [
    ("timm_swin", "token_ablation is not defined"),
    ("timm_vit_avgpool", "averages the content positions"),
])
def test_families_that_cannot_remove_refuse_the_mode_by_name(name, reason):
    model = family(name).build().eval()
    for kind in ("kernel_shap", "lime"):
        method = build_method(kind, samples=4, mode="removal")
        with pytest.raises(MethodUndefinedError, match=f"{kind}: mode='removal'.*{reason}"):
            method.check(model)
        method = build_method(kind, samples=4)
        method.check(model)   # replacement still runs there


def test_removal_option_errors():
    with pytest.raises(ValueError, match="kernel_shap: mode must be one of"):
        build_method("kernel_shap", mode="drop")
    with pytest.raises(ValueError, match="lime: baseline='pad' is for mode='replacement'"):
        build_method("lime", mode="removal", baseline="pad")
    fam = family("hf_siglip_vision")   # no prefix token: the coalition without features has nothing to read
    with pytest.raises(ValueError, match="every real position of sample 0 is a feature"):
        build_method("kernel_shap", samples=4, mode="removal")(fam.build().eval(), fam.inputs(1), target=0)
