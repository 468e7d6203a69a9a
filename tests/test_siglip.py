"""SigLIP (``transformers.SiglipModel``) through the CLIP wrappers: sigmoid zero-shot logits, SigLIP's own tokenizer
(a tiny SentencePiece model trained offline) padded to ``max_length``, the attention-pooling read-out, LRP
conservation through the pooling head, the AttnLRP / CP-LRP rules on its ``nn.MultiheadAttention``, and ``hf:``
folders resolved by architecture. The conformance rows are in ``tests/families/siglip.py``."""
from __future__ import annotations

import io

import pytest
import torch

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

from methods import build_method  # noqa: E402
from methods.adapters import adapter_for  # noqa: E402
from models.clip import PromptScorer, ZeroShotClassifier, tokenize_texts  # noqa: E402
from tests.families import _tiny_vit  # noqa: E402
from tests.families.siglip import (  # noqa: E402
    SIGLIP_TEXT_LENGTH,
    _siglip_classifier,
    _siglip_images,
    _siglip_scorer,
    _siglip_token_batch,
    _tiny_siglip,
)
from tests.lrp_passes import head_relevance  # noqa: E402

CORPUS = ["a photo of a cat", "a photo of a dog", "a drawing of a red circle", "a blue square on white",
          "a green triangle", "this is a photo of a bird"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """``transformers.SiglipTokenizer`` over a 40-piece SentencePiece model trained here (``</s>`` = 1 pads and ends
    every text, as SigLIP's), ``model_max_length`` the tiny model's 12 positions."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS * 5), model_writer=model, vocab_size=40,
                                   model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   hard_vocab_limit=False, minloglevel=2)
    path = tmp_path_factory.mktemp("siglip_tokenizer") / "spiece.model"
    path.write_bytes(model.getvalue())
    tok = transformers.SiglipTokenizer(str(path), model_max_length=SIGLIP_TEXT_LENGTH)
    assert tok.pad_token_id == tok.eos_token_id == 1 and len(tok) <= 40
    return tok


def test_zero_shot_classifier_gives_siglips_own_sigmoid_logits(tokenizer):
    """``from_prompts`` with SigLIP's tokenizer pads every prompt to ``max_length`` and passes no mask (as SigLIP
    was trained): the classifier's logits are the model's ``logits_per_image`` (``logit_scale.exp() * cos +
    logit_bias``) against those prompts; padded to the longest prompt instead, the last position is another token
    and the logits differ."""
    model = _tiny_siglip().double().eval()
    classes = ["cat", "dog", "bird"]
    clf = ZeroShotClassifier.from_prompts(model, tokenizer, classes, "a {}")
    images = _siglip_images(2)
    batch = tokenize_texts(model, tokenizer, [f"a {c}" for c in classes])
    assert set(batch) == {"input_ids"} and batch["input_ids"].shape == (3, SIGLIP_TEXT_LENGTH)
    assert (batch["input_ids"][:, -1] == tokenizer.pad_token_id).all()
    with torch.no_grad():
        ours = clf(images)
        theirs = model(input_ids=batch["input_ids"], pixel_values=images).logits_per_image
        longest = tokenizer([f"a {c}" for c in classes], padding=True, return_tensors="pt")
        assert longest["input_ids"].shape[1] < SIGLIP_TEXT_LENGTH
        other = model(input_ids=longest["input_ids"], pixel_values=images).logits_per_image
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(other, theirs, atol=1e-3)


def test_prompt_scorer_gives_logits_per_text_with_and_without_mask(tokenizer):
    """The text side: ``PromptScorer`` and its adapter give the model's ``logits_per_text`` for the tokenizer's
    batch, without the mask (SigLIP's training) and with the ``attention_mask`` transformers 5's tokenizer
    returns (padded keys masked; the last position, padding, is still the read-out)."""
    model = _tiny_siglip().double().eval()
    images = _siglip_images(3)
    scorer = PromptScorer(model, pixel_values=images).eval()
    batch = tokenizer(["a photo of a cat", "a blue square"], padding="max_length", truncation=True,
                      return_tensors="pt")
    adapter = adapter_for(scorer)
    for inputs in ({"input_ids": batch["input_ids"]}, dict(batch)):
        with torch.no_grad():
            theirs = model(pixel_values=images, **inputs).logits_per_text
            torch.testing.assert_close(scorer(inputs), theirs, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(adapter.forward(adapter.inputs.prepare(inputs)), theirs, rtol=1e-10,
                                       atol=1e-10)
    layout = adapter.inputs.layout(dict(batch))
    assert not layout.content_mask[:, -1].any()        # the read-out: </s> padding, not content
    maps = build_method("rollout")(scorer, dict(batch), target=0)
    assert (maps[batch["attention_mask"] == 0] == 0).all() and (maps[batch["attention_mask"] == 1] != 0).any()


def test_readout_weights_are_the_pooling_heads_attention():
    """The vision read-out is the pooling head's probe attention (head mean) over the patches, summing to 1 per
    image; ``raw_attention`` reads the last block's head-mean attention rows weighted by it."""
    clf = _siglip_classifier().eval()
    images = _siglip_images(3)
    adapter = adapter_for(clf)
    inputs = adapter.inputs.prepare(images)
    layout = adapter.inputs.layout(inputs)
    weights = adapter.readout.weights(inputs, layout)
    assert adapter.readout.weights(inputs, layout) is weights                  # kept for the batch
    vision = clf.clip.vision_model
    vision.set_attn_implementation("eager")
    with torch.no_grad():
        out = vision(pixel_values=images, output_attentions=True)
        head = vision.head
        probe = head.probe.repeat(3, 1, 1)
        _, pooling = head.attention(probe, out.last_hidden_state, out.last_hidden_state)
    torch.testing.assert_close(weights, pooling[:, 0], rtol=0, atol=1e-12)
    torch.testing.assert_close(weights.sum(dim=1), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-12)
    last = out.attentions[-1].mean(dim=1)                                # [B, N, N]
    expected = torch.einsum("bn,bnm->bm", weights, last)
    torch.testing.assert_close(build_method("raw_attention")(clf, images), expected, rtol=1e-10, atol=1e-12)
    mean = build_method("raw_attention", readout="mean_content")(clf, images)
    torch.testing.assert_close(mean, last.mean(dim=1), rtol=1e-10, atol=1e-12)


def test_readout_choices_are_checked():
    clf = _siglip_classifier().eval()
    with pytest.raises(ValueError, match="needs a model with a class token"):
        build_method("rollout", readout="class_token")(clf, _siglip_images(1))
    with pytest.raises(ValueError, match="readout='attention_pool' needs a model read out by an attention pooling"):
        build_method("rollout", readout="attention_pool")(_tiny_vit("token").eval(), torch.randn(1, 3, 32, 32,
                                                                                          dtype=torch.float64))
    with pytest.raises(ValueError, match="image_size 16x16"):
        build_method("rollout")(clf, torch.randn(1, 3, 32, 32, dtype=torch.float64))
    with pytest.raises(TypeError, match="wrap it as models.clip.ZeroShotClassifier"):
        adapter_for(clf.clip)
    config = clf.clip.config
    config.vision_config.vision_use_head = False
    headless = ZeroShotClassifier(transformers.SiglipModel(config), torch.randn(2, 24))
    with pytest.raises(TypeError, match="no pooling head"):
        adapter_for(headless)


def test_lrp_conserves_relevance_through_the_pooling_head():
    """With the conservative ``"ours"`` rules the relevance at the last hidden states plus the probe's share
    (a parameter, no input) sums to the one-hot target per image, and every block conserves it; on the text
    tower the relevance entering the first block sums to 1 (read at the last position). Full LRP reaches the
    pixels / the encoder input (where, with an attention mask, the read-out's own share is a padded position's,
    reported as 0)."""
    for model, inputs in ((_siglip_classifier().eval(), _siglip_images(3)),
                          (_siglip_scorer().eval(), _siglip_token_batch(3, with_mask=True)),
                          (_siglip_scorer().eval(), _siglip_token_batch(3))):
        start = head_relevance(model, inputs)
        adapter, engine, topology, acts, r = start.adapter, start.engine, start.topology, start.acts, start.relevance
        total = r.sum(dim=(1, 2))
        if adapter.tower == "vision":
            probe = acts["probe_relevance"].sum(dim=(1, 2))
            assert (probe.abs() > 1e-3).all()
            total = total + probe
        else:
            assert (r[:, :-1] == 0).all()
        torch.testing.assert_close(total, torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-6)
        before = r.sum(dim=(1, 2))
        for l in reversed(range(len(adapter.blocks))):
            r, _ = topology.block_relprop(engine.rules, acts, l, r, True)
            torch.testing.assert_close(r.sum(dim=(1, 2)), before, rtol=0, atol=1e-6)
        full = build_method("lrp", rules="ours")(model, inputs, target=1)
        assert torch.isfinite(full).all()
        if adapter.tower == "vision":
            assert full.shape == (3, 16, 16)
        elif "attention_mask" not in inputs:   # with a mask the read-out's own share lies on a padded position
            torch.testing.assert_close(full.sum(dim=1), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-6)
        else:
            assert (full[inputs["attention_mask"] == 0] == 0).all() and (full.sum(dim=1) < 1 - 1e-3).any()


def _bias_free(wrapper):
    with torch.no_grad():
        for name, p in wrapper.named_parameters():
            if name.endswith("bias") or "position_embedding" in name:
                p.zero_()
    return wrapper.eval()


@pytest.mark.parametrize("tower", ["vision", "text"])
def test_cp_lrp_conserves_exactly_and_attnlrp_keeps_the_logits(tower):
    """CP-LRP on a bias-free SigLIP (``logit_bias``, the pooling head's ``in_proj_bias`` included): the relevance
    entering every block, and the input scores' sum, equal the explained logit (the pooling head's keys detached
    through its ``nn.MultiheadAttention`` pre-hook; without it the attention would carry relevance). AttnLRP's
    logits inside the call are the model's own, bit for bit, and no hook is left."""
    model = _bias_free(_siglip_classifier() if tower == "vision" else _siglip_scorer())
    inputs = _siglip_images(3) if tower == "vision" else _siglip_token_batch(3)
    target = torch.tensor([1, 4, 0])
    report = build_method("cp_lrp").relevance_by_layer(model, inputs, target=target)
    logit = report["logit"]
    scale = logit.abs().max()
    for layer, sums in enumerate(report["blocks"]):
        torch.testing.assert_close(sums, logit, rtol=0, atol=1e-9 * scale, msg=f"block {layer}")
    torch.testing.assert_close(report["input"], logit, rtol=0, atol=1e-9 * scale)
    for p in model.parameters():   # the stock forward as the methods run it: autograd on, weights frozen (torch
        p.requires_grad_(False)    # picks the pooling head's kernels by requires_grad: no-grad differs in last bits)
    with torch.enable_grad():
        stock = model(inputs.clone().requires_grad_(True) if tower == "vision" else inputs)
    stock = stock.detach().gather(1, target[:, None])[:, 0]
    attn = build_method("attnlrp").relevance_by_layer(model, inputs, target=target)
    assert torch.equal(attn["logit"], stock) and torch.equal(logit, stock)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_attnlrp_applies_the_uniform_rule_in_the_pooling_head():
    """The pooling head's keys and values get AttnLRP's factors (1/4, 1/2): its gradient differs from plain
    Gradient x Input through the head, and CP-LRP's (keys detached) differs from both."""
    from methods.attnlrp import relevance_rules

    clf = _siglip_classifier().eval()
    adapter = adapter_for(clf)
    hidden = torch.randn(2, 16, 24, dtype=torch.float64, requires_grad=True)
    grads = {}
    for variant in (None, "attnlrp", "cp_lrp"):
        rules = relevance_rules(adapter, variant) if variant else torch.enable_grad()
        with rules:
            out = adapter.pooling_head()(hidden)
        grads[variant] = torch.autograd.grad(out.sum(), hidden)[0]
    assert not torch.allclose(grads[None], grads["attnlrp"]) and not torch.allclose(grads["attnlrp"],
                                                                                     grads["cp_lrp"])


def test_hf_folder_resolves_siglip_by_its_architecture(tmp_path, tokenizer):
    """``hf:<folder>`` of a saved SiglipModel (``architectures: ["SiglipModel"]``) loads as its zero-shot
    classifier with SigLIP's tokenizer, as ``clip:<folder>`` does; random weights with ``pretrained=False``."""
    from models.sources import load_model

    model = _tiny_siglip().eval()
    model.save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    kwargs = {"prompts": "custom", "classnames": ["cat", "dog"], "templates": ["a photo of a {}"]}
    clf = load_model(f"hf:{tmp_path}", model_kwargs=kwargs)
    assert isinstance(clf, ZeroShotClassifier) and isinstance(clf.clip, transformers.SiglipModel)
    assert clf.pretrained_cfg["mean"] == (0.5, 0.5, 0.5) and clf.pretrained_cfg["crop_mode"] == "squash"
    same = load_model(f"clip:{tmp_path}", model_kwargs=kwargs)
    images = _siglip_images(2).float()
    with torch.no_grad():
        torch.testing.assert_close(clf(images), same(images))
        batch = tokenize_texts(model, tokenizer, ["a photo of a cat", "a photo of a dog"])
        torch.testing.assert_close(clf(images), model(pixel_values=images, **batch).logits_per_image)
    assert isinstance(load_model(f"hf:{tmp_path}", pretrained=False, model_kwargs=kwargs).clip,
                      transformers.SiglipModel)


def test_synthetic_siglip_trains_on_first_use_and_loads_as_a_zero_shot_classifier(tmp_path, monkeypatch):
    """``clip:trained:configs/train/synthetic_siglip.yaml+<tiny overrides>``: the sigmoid-loss module trains a
    SiglipModel (one tiny epoch), exports it with SigLIP's image processor, and loads as a zero-shot classifier
    whose logits are the model's own against its prompts padded to ``max_length``; the methods explain it."""
    import yaml

    import training  # noqa: F401  (registers the trained: source)
    from models.clip import load_zero_shot_classifier

    monkeypatch.setenv("TOKEN_ATTRIBUTIONS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    tiny = {
        "trainer": {"max_epochs": 1, "logger": False, "log_every_n_steps": 1},
        "model": {"init_args": {"vision": {"image_size": 32, "patch_size": 8, "hidden_size": 32,
                                           "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2},
                                "text": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                         "num_attention_heads": 2, "max_position_embeddings": 24}}},
        "data": {"init_args": {"image_size": 32, "train_size": 64, "val_size": 32, "test_size": 16,
                               "batch_size": 32, "cache_train": False}},
    }
    overrides = tmp_path / "tiny.yaml"
    overrides.write_text(yaml.safe_dump(tiny))
    clf = load_zero_shot_classifier(f"clip:trained:configs/train/synthetic_siglip.yaml+{overrides}")
    model = clf.clip
    assert isinstance(model, transformers.SiglipModel) and clf.num_classes == 4
    assert clf.pretrained_cfg["crop_mode"] == "squash" and clf.pretrained_cfg["input_size"] == (3, 32, 32)
    assert float(model.logit_bias.detach()) != -10.0
    assert float(model.logit_scale.detach()) != pytest.approx(2.302585, abs=1e-7)
    prompts = [p[0] for p in clf.prompts]
    one = ZeroShotClassifier.from_prompts(model, clf.tokenizer, {c: [p] for c, p in zip(clf.classnames, prompts)})
    images = torch.randn(3, 3, 32, 32)
    batch = tokenize_texts(model, clf.tokenizer, prompts)
    assert batch["input_ids"].shape == (4, 24) and (batch["input_ids"][:, -1] == clf.tokenizer.pad_token_id).all()
    with torch.no_grad():
        torch.testing.assert_close(one(images), model(pixel_values=images, **batch).logits_per_image)
    assert build_method("rollout")(clf, images).shape == (3, 16)
