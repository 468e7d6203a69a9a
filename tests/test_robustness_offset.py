"""The embedding offset carried by the inputs (methods/adapters/embedding_offset.py, ``ModelInputs.embedding_offset``):
every method on a text encoder, a decoder LM and CLIP's text tower gives, under an offset that is a function of
the token id, exactly the map of a model whose input embedding adds that shift itself (the test's own hook, by id),
whatever rows the method regroups; the row helpers carry it; a baseline the method builds has none; two identical
texts with different offsets in one batch each get their own, equal to each alone (the robustness test's
re-explanations)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from callbacks.robustness import RobustnessTest
from lightning_modules.evaluation import AttributionEvaluationModule
from methods import available_methods, build_method
from methods.adapters import MethodUndefinedError, adapter_for
from methods.adapters.base import scaled_copies
from methods.input_baselines import baseline_inputs
from methods.input_points import repeat_inputs, select_rows
from tests.families import FAMILIES, method_options
from tests.families.base import _token_batch
from tests.families.text import _tiny_bert

torch.set_num_threads(1)


def _shift_by_id(model, adapter):
    """A float64 shift ``[V, D]`` per token id, zero for the ids a method may build rows from (0-4 and the config's
    special tokens), and the hook that adds it to the input embedding's output by the ids it is called with."""
    embedding = adapter.rule_map.input_embedding()
    shift = 0.3 * torch.randn(embedding.weight.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    config = getattr(getattr(model, "config", None), "__dict__", {})
    special = {0, 1, 2, 3, 4} | {v for k, v in config.items() if k.endswith("token_id") and isinstance(v, int)}
    shift[sorted(i for i in special if i < len(shift))] = 0

    def hook(_module, args, output):
        return (output.double() + shift[args[0]]).to(output.dtype)
    return shift, embedding, hook


@pytest.mark.parametrize("family", ["hf_bert", "hf_llama_gqa_left", "hf_clip_text"])
def test_every_method_sees_the_offset_of_its_rows(family):
    fam = next(f for f in FAMILIES if f.name == family)
    torch.manual_seed(0)
    model = fam.build()
    adapter = adapter_for(model)
    inputs = fam.inputs(3)
    shift, embedding, hook = _shift_by_id(model, adapter)
    offset = shift[adapter.inputs.prepare(inputs)["input_ids"]]
    targets, ids = torch.tensor([1, 4, 0]), torch.tensor([10, 11, 12])
    checked = []
    for name in available_methods():
        method = build_method(name, **method_options(fam, name))
        try:
            plain = method(model, inputs, target=targets, sample_ids=ids)
        except MethodUndefinedError:
            continue
        ours = method(model, inputs, target=targets, sample_ids=ids, embedding_offset=offset)
        handle = embedding.register_forward_hook(hook)
        try:
            expected = method(model, inputs, target=targets, sample_ids=ids)
        finally:
            handle.remove()
        assert torch.equal(ours, expected), (name, float((ours - expected).abs().max()))
        assert name == "random" or not torch.equal(expected, plain), name      # the shift moves every other map
        checked.append(name)
    assert {"atman", "integrated_gradients", "attnlrp", "occlusion", "beyond_intuition_token"} <= set(checked)


def test_row_helpers_carry_the_offset_and_a_built_baseline_has_none():
    model = _tiny_bert().eval()
    adapter = adapter_for(model)
    batch = adapter.inputs.prepare(_token_batch(3, True, True))
    offset = torch.randn(3, batch["input_ids"].shape[1], 16, dtype=torch.float64)
    shifted = batch.offset_by(offset)
    rows = torch.tensor([2, 0, 2, 1])
    assert torch.equal(select_rows(shifted, rows).embedding_offset, offset[rows])
    assert torch.equal(repeat_inputs(shifted, 2).embedding_offset, offset.repeat(2, 1, 1))
    assert torch.equal(scaled_copies(shifted, torch.tensor([0.5, 1.0]), "scale").embedding_offset,
                       offset.repeat(2, 1, 1))
    assert torch.equal(adapter.inputs.interpolate(shifted, torch.tensor([0.5, 1.0])).embedding_offset,
                       offset.repeat(2, 1, 1))
    assert torch.equal(shifted.with_tensors(attention_mask=batch["attention_mask"]).embedding_offset, offset)
    assert baseline_inputs(adapter, shifted, "pad", "test").embedding_offset is None
    with pytest.raises(ValueError, match="name the row each stems from"):
        shifted.with_tensors(input_ids=batch["input_ids"][:2])
    with pytest.raises(ValueError, match=r"\[B, N, D\]"):
        batch.offset_by(offset[:2])
    with pytest.raises(ValueError, match="floating tensor"):
        batch.offset_by(offset.long())
    with pytest.raises(ValueError, match="returned"):
        adapter.embed(replace(batch, embedding_offset=offset[..., :4]))
    # a method's call: the offset shifts the embedding by exactly itself, in float64, rounded once
    with torch.no_grad():
        clean, moved = adapter.embed(batch), adapter.embed(shifted)
    embedding = adapter.rule_map.input_embedding()
    handle = embedding.register_forward_hook(lambda _m, _a, out: out + offset)
    try:
        with torch.no_grad():
            by_hand = adapter.embed(batch)
    finally:
        handle.remove()
    assert torch.equal(moved, by_hand) and not torch.equal(moved, clean)


def test_identical_texts_with_different_offsets_in_one_batch_each_get_their_own(tmp_path):
    folder = tmp_path / "bert"
    _tiny_bert().save_pretrained(folder)
    module = AttributionEvaluationModule(classifier=f"hf:{folder}", methods=["atman", "input_x_gradient"])
    module.model.double()
    one = _token_batch(3, True, True)
    same = {k: v[[0, 0, 1]] for k, v in one.items()}                     # texts 0 and 1 identical
    batch = dict(same, label=torch.tensor([0, 0, 1]), index=torch.tensor([4, 5, 6]))
    inputs = module.model_inputs(batch)
    offset = 0.5 * torch.randn(3, same["input_ids"].shape[1], 16, generator=torch.Generator().manual_seed(1),
                               dtype=torch.float64)
    target = torch.tensor([1, 1, 0])
    for name in ("atman", "input_x_gradient"):
        together = module.explain(name, inputs, target, batch["index"], embedding_offset=offset)
        assert not torch.allclose(together[0], together[1])
        for i in range(3):
            alone = module.explain(name, {k: v[i:i + 1] for k, v in inputs.items()}, target[i:i + 1],
                                   batch["index"][i:i + 1], embedding_offset=offset[i:i + 1])
            torch.testing.assert_close(together[i:i + 1], alone, rtol=1e-9, atol=1e-12)
    # the robustness test on that batch: each duplicate's score equals its own run alone
    with torch.enable_grad():
        outputs = module.test_step(dict(batch), 0)
    cb = RobustnessTest(infidelity_runs=2, sensitivity_runs=2)
    cb.update(outputs, batch)
    cb.compute()
    full = cb.per_sample_scores()
    for i in (0, 1):
        alone = {k: v[i:i + 1] for k, v in batch.items()}
        with torch.enable_grad():
            out_alone = module.test_step(dict(alone), 0)
        single = RobustnessTest(infidelity_runs=2, sensitivity_runs=2)
        single.update(out_alone, alone)
        single.compute()
        for key, (_index, values) in single.per_sample_scores().items():
            row = int((full[key][0] == int(batch["index"][i])).nonzero())
            assert abs(float(values[0]) - float(full[key][1][row])) <= 1e-9 * max(1.0, abs(float(values[0]))), key
    sens = full["robustness/atman/predicted/max_sensitivity"][1]
    assert float(sens[0]) != float(sens[1])                               # same text, own draws
