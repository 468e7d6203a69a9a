"""Generation attributions (``evaluation/words/generation.py``) on tiny random decoders (Llama with grouped-query
attention, GPT-2) and an offline word-level tokenizer: greedy ids equal ``model.generate(do_sample=False)``, the
``[B, T, N]`` scores are 0 where they must be, a batched prompt gets the scores it gets alone, EOS ends a row,
and the HTML view escapes the tokens."""
from __future__ import annotations

import pytest
import torch

from evaluation.words import GenerationAttribution, explain_generation
from methods import build_method
from tests.families import _tiny_decoder

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

PROMPTS = ["the cat <script>", "a dog w3 w4 w5 w6", "w7"]
STEPS = 5


@pytest.fixture(scope="module")
def tokenizer():
    """A word-level tokenizer over the tiny decoders' 40 ids ([PAD] 0, BOS <s> 1 prepended, EOS </s> 2), built
    here: no download."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = ["[PAD]", "<s>", "</s>", "[UNK]", "<script>", "&", "the", "a", "cat", "dog"] + [f"w{i}" for i in range(30)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                pad_token="[PAD]", unk_token="[UNK]")


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model(request):
    return _tiny_decoder(request.param).eval()


def _alone_ids(tokenizer, prompt):
    return torch.tensor([tokenizer(prompt)["input_ids"]])


@torch.no_grad()
def test_greedy_ids_equal_generate(model, tokenizer):
    """Each row's generated ids equal ``model.generate(do_sample=False)`` on the prompt alone, and batched (left
    padded) for GPT-2 in float64 and every model in float32 (the stock float64 RoPE models give NaN logits with
    left padding: see tests/test_hf_decoder.py)."""
    result = explain_generation("rollout", model, tokenizer, PROMPTS, max_new_tokens=STEPS)
    for i, prompt in enumerate(PROMPTS):
        ids = _alone_ids(tokenizer, prompt)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=STEPS, do_sample=False,
                             pad_token_id=0)
        ours = result.generated_ids[i][result.generated_mask[i]]
        assert ours.tolist() == out[0, ids.shape[1]:].tolist()
    p = result.prompt_length
    for dtype in (torch.float64, torch.float32):
        if dtype == torch.float64 and model.config.model_type != "gpt2":
            continue
        ours = result if dtype == torch.float64 else explain_generation("rollout", model.to(dtype), tokenizer,
                                                                         PROMPTS, max_new_tokens=STEPS)
        out = model.generate(ours.input_ids[:, :p], attention_mask=ours.attention_mask[:, :p],
                             max_new_tokens=STEPS, do_sample=False, pad_token_id=0)
        assert torch.equal(out, ours.input_ids), dtype
    model.double()


@pytest.mark.parametrize("name", ["attnlrp", "rollout"])
def test_shapes_zeros_and_batched_equals_alone(model, tokenizer, name):
    result = explain_generation(name, model, tokenizer, PROMPTS, max_new_tokens=STEPS)
    b, p = len(PROMPTS), result.prompt_length
    lengths = [len(tokenizer(x)["input_ids"]) for x in PROMPTS]
    assert p == max(lengths) and result.generated_mask.all()
    assert result.scores.shape == (b, STEPS, p + STEPS) and result.scores.dtype == torch.float64
    assert result.generated_ids.shape == (b, STEPS) and result.input_ids.shape == (b, p + STEPS)
    assert [len(t) for t in result.tokens] == [p + STEPS] * b
    assert [len(t) for t in result.generated_tokens] == [STEPS] * b
    assert result.tokens[0][p - 1] == "<script>" and result.tokens[2][:p - 2] == [""] * (p - 2)
    for t in range(STEPS):
        assert (result.scores[:, t, p + t:] == 0).all()                  # the token itself and what follows
        assert (result.scores[:, t][result.attention_mask == 0] == 0).all()   # the prompts' padding
        assert (result.scores[:, t, :p + t].abs().sum(dim=1) > 0).all()
    for i, prompt in enumerate(PROMPTS):
        alone = explain_generation(name, model, tokenizer, [prompt], max_new_tokens=STEPS)
        assert torch.equal(alone.generated_ids[0], result.generated_ids[i])
        assert alone.generated_tokens[0] == result.generated_tokens[i]
        pad = p - lengths[i]
        assert (result.scores[i, :, :pad] == 0).all()
        ours = result.scores[i, :, pad:]
        scale = float(alone.scores.abs().max())
        torch.testing.assert_close(ours, alone.scores[0], rtol=0, atol=1e-9 * scale)
        for t in range(STEPS):
            torch.testing.assert_close(result.context_scores(i, t), alone.context_scores(0, t), rtol=0,
                                       atol=1e-9 * scale)


def test_explained_logit_is_the_generated_token_at_the_context_end(tokenizer):
    """Step t explains the logit of generated token t read at the last position of its context: AttnLRP's
    relevance report on the context with that target gives the same map."""
    model = _tiny_decoder("llama").eval()
    method = build_method("attnlrp")
    result = explain_generation(method, model, tokenizer, PROMPTS[:2], max_new_tokens=3)
    p = result.prompt_length
    t = 2
    batch = {"input_ids": result.input_ids[:, :p + t], "attention_mask": result.attention_mask[:, :p + t]}
    target = result.input_ids[:, p + t]
    torch.testing.assert_close(result.scores[:, t, :p + t], method(model, batch, target=target), rtol=0, atol=0)
    report = method.relevance_by_layer(model, batch, target=target)
    with torch.no_grad():
        logits = model(**batch, position_ids=(batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)).logits[:, -1]
    torch.testing.assert_close(report["logit"], logits.gather(1, target[:, None])[:, 0], rtol=0, atol=1e-9)
    assert torch.equal(logits.argmax(-1), target)                        # and it is the greedy token


def test_eos_ends_a_row(tokenizer):
    """A row that generates an EOS id stops there (the EOS explained); its later steps are masked and 0, the other
    rows go on; right-padded tokenizer batches are accepted (moved to the left)."""
    model = _tiny_decoder("llama").eval()
    free = explain_generation("rollout", model, tokenizer, PROMPTS, max_new_tokens=STEPS, eos_token_id=[])
    row0 = free.generated_ids[0].tolist()
    stop = next(s for s in range(1, STEPS) if row0[s] not in row0[:s])   # a token row 0 first makes at step s
    others = [i for i in range(1, len(PROMPTS)) if row0[stop] not in free.generated_ids[i].tolist()]
    assert others
    tokenizer.padding_side = "right"
    try:
        batch = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = "left"
    assert (batch["attention_mask"][:, 0] == 1).all()
    result = explain_generation("rollout", model, tokenizer, dict(batch), max_new_tokens=STEPS,
                                eos_token_id=row0[stop])
    assert result.generated_mask[0].tolist() == [True] * (stop + 1) + [False] * (STEPS - stop - 1)
    assert result.generated_tokens[0] == free.generated_tokens[0][:stop + 1]
    after = result.prompt_length + stop + 1
    assert (result.scores[0, stop + 1:] == 0).all() and (result.input_ids[0, after:] == 0).all()
    assert (result.attention_mask[0, after:] == 0).all()
    for i in others:
        assert result.generated_mask[i].all()
        torch.testing.assert_close(result.scores[i], free.scores[i], rtol=0, atol=1e-12)


def test_html_escapes_the_tokens(tokenizer, tmp_path):
    model = _tiny_decoder("gpt2").eval()
    result = explain_generation("attnlrp", model, tokenizer, PROMPTS[:1], max_new_tokens=2)
    assert isinstance(result, GenerationAttribution)
    html = result._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert html.count('class="ta-target"') == 2 and html.count("<tr>") == 2
    page = result.save(tmp_path / "gen.html", titles=["<b>prompt</b>"])
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "&lt;b&gt;prompt&lt;/b&gt;" in text and "<script>" not in text
    with pytest.raises(ValueError, match="scale"):
        result.html(scale=-1)


def test_refused_arguments(tokenizer):
    model = _tiny_decoder("llama").eval()
    with pytest.raises(ValueError, match="max_new_tokens"):
        explain_generation("rollout", model, tokenizer, PROMPTS, max_new_tokens=0)
    with pytest.raises(TypeError, match="options"):
        explain_generation(build_method("rollout"), model, tokenizer, PROMPTS, start_layer=0)
    with pytest.raises(ValueError, match="decoder language model"):
        explain_generation("rollout", _tiny_decoder("llama", head="seq_cls").eval(), tokenizer, PROMPTS)
