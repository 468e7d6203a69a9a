"""Occlusion over windows of content tokens (``window`` / ``stride`` on sequences, issue 38's cost rows at BERT-base
256): equal to Captum 0.9.0's ``Occlusion`` run over the content tokens' embeddings (the special tokens held
fixed), batched == alone with padding, and the default window of one token unchanged. Float64."""
from __future__ import annotations

import pytest
import torch

from methods import build_method
from methods.adapters import adapter_for
from methods.captum_bridge import captum_forward
from methods.input_baselines import baseline_values
from methods.input_points import resolve_point
from methods.occlusion import token_windows
from tests.generic_baselines_support import (
    assert_batched_equals_alone,
    family,
    samples,
)

captum_attr = pytest.importorskip("captum.attr")


def test_token_windows_follow_captums_count():
    windows = token_windows(7, 3, 2)
    assert windows.int().tolist() == [[1, 1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1, 1]]
    assert token_windows(8, 3, 3).int().tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1, 0, 0],
                                                     [0, 0, 0, 0, 0, 0, 1, 1]]   # the last window cut at the end
    assert token_windows(7, 2, 3).sum(dim=0).tolist() == [1, 1, 0, 1, 1, 0, 1]   # a stride over the window: gaps
    assert token_windows(2, 5, 5).tolist() == [[True, True]]                           # shorter than the window
    assert token_windows(0, 3, 1).shape == (0, 0)


@pytest.mark.parametrize("name", ["hf_bert_types_special", "hf_llama_gqa_left"])
@pytest.mark.parametrize("window,stride", [(3, 2), (4, None)])
def test_token_window_occlusion_equals_captum_over_the_content_tokens(name, window, stride):
    fam = family(name)
    model = fam.build().eval()
    sample = fam.single(fam.inputs(3), 0)
    ours = build_method("occlusion", window=window, stride=stride, baseline="pad")(model, sample, target=2)
    forward, x, extra = captum_forward(model, sample)
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare(sample)
    content = adapter.inputs.layout(batch).content_positions(batch["input_ids"])[0]
    start = baseline_values(adapter, batch, resolve_point(adapter, "auto", "t"), "pad", "t", x)

    def content_forward(rows, *args):
        full = x.expand(rows.shape[0], -1, -1).clone()
        full[:, content] = rows
        return forward(full, *args)

    width = x.shape[-1]
    with torch.no_grad():
        theirs = captum_attr.Occlusion(content_forward).attribute(
            x[:, content], sliding_window_shapes=(window, width), strides=(stride or window, width),
            baselines=start[:, content], target=2, additional_forward_args=extra)
    assert torch.equal(theirs[..., 0:1].expand_as(theirs), theirs)
    assert theirs.abs().max() > 0
    torch.testing.assert_close(ours[0, content], theirs[0, :, 0].double(), rtol=0,
                               atol=1e-6 * float(theirs.abs().max()))
    assert (ours[0, ~content] == 0).all()


def test_token_window_occlusion_batched_equals_alone_and_window_1_is_the_default():
    fam = family("hf_bert_types_special")
    model = fam.build().eval()
    pool = samples(fam)
    method = build_method("occlusion", window=3, stride=2, batch_size=5)
    assert_batched_equals_alone(fam, model, method, pool, "occlusion")
    inputs = fam.inputs(3)
    torch.testing.assert_close(build_method("occlusion", window=1)(model, inputs, target=1),
                               build_method("occlusion")(model, inputs, target=1), rtol=0, atol=0)


def test_a_pair_window_on_a_sequence_is_refused():
    model = family("hf_bert_types_special").build().eval()
    with pytest.raises(ValueError, match="on a sequence window counts content tokens"):
        build_method("occlusion", window=(2, 2)).check(model)
