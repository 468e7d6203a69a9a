"""Attribution methods on both towers of a stock ``transformers.CLIPModel`` against the authors' CLIP code.

Goldens (``../shared/golden``, ``README-bert-clip.md``): ``mm_clip_shared`` (Chefer et al. 2021b's ``interpret``:
image relevance and the text relevance's EOT row, start layers -1 / 0 / 1) and ``bi_clip`` (Beyond Intuition's
``Interpretor`` on the image side; ``CLIP.ipynb``'s ``interpret_ours`` / ``interpret_ours_c`` on the text side).
One tiny CLIP (vision 3 blocks x 3 heads, 56 px, 8 px patches; text 3 blocks x 4 heads, 16 positions), one
image, three texts (two zero-padded after the EOT token). Each reference row explains ``logits_per_image[i, i]``
of (image, text_i). Here every method runs once per golden key, batched with per-sample targets:

* image side: ``ZeroShotClassifier`` whose classes are the three texts (in a shuffled order), the image repeated,
  ``target`` = each row's text;
* text side: ``PromptScorer`` over four images (the golden image twice, two others), ``target`` = a copy of the
  golden image, different per text; the texts as the authors pass them (no ``attention_mask``: every position
  real, only the causal mask).

Comparison as the cases files define it (``mode: norm``): per-row min-max, then ``max |diff| <= tol`` over the
patch columns (image) or the EOT row's columns ``1 .. EOT-1`` (text).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from methods import build_method
from methods.adapters import ActivationRecorder, adapter_for
from methods.beyond_intuition import BeyondIntuitionToken
from tests.lrp_passes import head_relevance

transformers = pytest.importorskip("transformers")

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "golden")


def _load(name):
    path = os.path.join(GOLDEN, f"{name}.npz")
    if not os.path.exists(path):
        pytest.fail(f"golden file {path} is missing (CI and every developer have ../shared)")
    return np.load(path, allow_pickle=True)


def _tolerances(name):
    with open(os.path.join(GOLDEN, f"{name}.cases.json")) as f:
        cases = json.load(f)
    assert all(case["mode"] == "norm" for case in cases)
    return {case["golden_key"]: case["tol"] for case in cases}


def _clip(z, dtype=torch.float32):
    meta = json.loads(str(z["meta_json"]))
    model = transformers.CLIPModel(transformers.CLIPConfig(**meta["hf_config_kwargs"]))
    model.load_state_dict({k[2:]: torch.from_numpy(z[k]) for k in z.files if k.startswith("w/")}, strict=True)
    return model.to(dtype).eval()


class Golden:
    """A CLIP golden file, its stock model and the two batched set-ups (see the module docstring)."""

    #: the order of the texts as classes of the zero-shot classifier
    CLASS_ORDER = [2, 0, 1]

    def __init__(self, name, dtype=torch.float32):
        from models.clip import PromptScorer, ZeroShotClassifier

        self.z = _load(name)
        self.tol = _tolerances(name)
        self.clip = _clip(self.z, dtype)
        self.image = torch.from_numpy(self.z["image"]).to(dtype)
        self.tokens = torch.from_numpy(self.z["text_tokens"])
        self.eot = [int(e) for e in self.z["eot_index"]]
        with torch.no_grad():
            texts = self.clip.get_text_features(input_ids=self.tokens).pooler_output
        self.classifier = ZeroShotClassifier(self.clip, texts[self.CLASS_ORDER])
        self.images = self.image.repeat(3, 1, 1, 1)
        self.class_targets = torch.tensor([self.CLASS_ORDER.index(i) for i in range(3)])
        gen = torch.Generator().manual_seed(0)
        others = torch.randn(2, *self.image.shape[1:], generator=gen).to(dtype)
        self.scorer = PromptScorer(self.clip, torch.stack([others[0], self.image[0], others[1], self.image[0]]))
        self.image_targets = torch.tensor([1, 3, 1])

    def image_side(self, name, **options):
        return build_method(name, **options)(self.classifier, self.images, target=self.class_targets).double().numpy()

    def text_side(self, name, method=None, **options):
        method = method or build_method(name, **options)
        return method(self.scorer, {"input_ids": self.tokens}, target=self.image_targets).double().numpy()

    def text_rows(self, scores):
        """The EOT-row columns ``1 .. EOT-1`` the references show, one list per text."""
        return [scores[i, 1:e] for i, e in enumerate(self.eot)]


@pytest.fixture(scope="module")
def mm():
    return Golden("mm_clip_shared")


@pytest.fixture(scope="module")
def bi():
    return Golden("bi_clip")


def _norm(row):
    row = np.asarray(row, dtype=np.float64)
    return (row - row.min()) / (row.max() - row.min())


def _norm_errors(ours, gold):
    """Per row: min-max both, max |diff| (the cases' comparator)."""
    return np.array([np.abs(_norm(o) - _norm(g)).max() for o, g in zip(ours, gold)])


def _check(ours, gold, tol, key):
    errors = _norm_errors(ours, gold)
    assert len(errors) == 3 and (errors <= tol).all(), (key, errors.tolist(), tol)


# --------------------------------------------------------------------------------------------- the adapters
def test_golden_model_and_logits(mm):
    """The stock model reproduces the reference logits; both wrappers give CLIP's own logits, and the adapters'
    forward gives the wrappers' (eager and SDPA, the attention implementation restored)."""
    clip = mm.clip
    with torch.no_grad():
        out = clip(pixel_values=mm.images, input_ids=mm.tokens)
        np.testing.assert_allclose(out.logits_per_image.numpy(), mm.z["logits_per_image"], rtol=1e-5, atol=1e-5)
        logits = mm.classifier(mm.images)
        torch.testing.assert_close(logits, out.logits_per_image[:, mm.CLASS_ORDER], rtol=1e-5, atol=1e-5)
        per_text = mm.scorer(mm.tokens)
        torch.testing.assert_close(per_text[:, 1], out.logits_per_text[:, 0], rtol=1e-5, atol=1e-5)
        for model, inputs, reference in ((mm.classifier, mm.images, logits), (mm.scorer, mm.tokens, per_text)):
            adapter = adapter_for(model)
            prepared = adapter.inputs.prepare(inputs)
            torch.testing.assert_close(adapter.forward(prepared, grad_from_block=len(adapter.blocks)), reference,
                                       rtol=0, atol=0)
            before = clip.config._attn_implementation
            with adapter.recording.eager_attention():
                assert adapter.config._attn_implementation == "eager"
                other = clip.text_model if adapter.tower == "vision" else clip.vision_model
                assert other.config._attn_implementation == before
                torch.testing.assert_close(adapter.forward(prepared, grad_from_block=len(adapter.blocks)), reference,
                                           rtol=1e-5, atol=1e-5)
            assert adapter.config._attn_implementation == before != "eager"


def test_text_readout_is_the_eos_position(mm):
    """``read_out`` with the per-sample ``position`` read-out picks each text's EOS row; ``auto`` is it."""
    from methods.readout import read_out

    adapter = adapter_for(mm.scorer)
    inputs = adapter.inputs.prepare({"input_ids": mm.tokens})
    assert adapter.inputs.context(inputs).readout_positions.tolist() == mm.eot
    matrix = torch.randn(3, 4, 16, 16)
    for readout in ("auto", "position"):
        rows = read_out(matrix, adapter, inputs, readout)
        assert rows.shape == (3, 4, 16)
        for i, e in enumerate(mm.eot):
            assert torch.equal(rows[i], matrix[i, :, e])
    assert torch.equal(read_out(matrix[:, 0], adapter, inputs), matrix[torch.arange(3), 0, mm.eot])
    with pytest.raises(ValueError, match="class_token"):
        read_out(matrix, adapter, inputs, "class_token")


# --------------------------------------------------------------------------------------------- MM (Chefer 2021b)
@pytest.mark.parametrize("tag,start_layer", [("last", -1), ("s0", 0), ("s1", 1)])
def test_mm_generic_attribution_image_and_text(mm, tag, start_layer):
    """``interpret(start_layer=S, start_layer_text=S)``: image relevance ``R[:, 0, 1:]`` and the text
    relevance's EOT row; the text side with and without the padding mask (Generic Attribution takes no mean over
    the map, so padding never enters the EOT row)."""
    key = f"ga_{tag}__image_tok"
    _check(mm.image_side("generic_attribution", start_layer=start_layer), mm.z[key], mm.tol[key], key)
    key = f"ga_{tag}__text_eot_row"
    gold = mm.text_rows(mm.z[key])
    _check(mm.text_rows(mm.text_side("generic_attribution", start_layer=start_layer)), gold, mm.tol[key], key)
    mask = (torch.arange(16)[None] <= torch.tensor(mm.eot)[:, None]).long()
    masked = build_method("generic_attribution", start_layer=start_layer)(
        mm.scorer, {"input_ids": mm.tokens, "attention_mask": mask}, target=mm.image_targets).double().numpy()
    _check(mm.text_rows(masked), gold, mm.tol[key], key)
    assert (masked[mask == 0] == 0).all()


# --------------------------------------------------------------------------------------------- BI
# golden key -> (method, options); BI's num_layers=n uses the blocks with index > n: start_layer = n + 1
BI_IMAGE_CALLS = {
    **{f"ours_h_nl{n}": ("beyond_intuition_head", dict(start_layer=n + 1, steps=20)) for n in (-1, 0, 1)},
    **{f"genattr_nl{n}": ("generic_attribution", dict(start_layer=n + 1)) for n in (-1, 0, 1)},
    # the notebook's image side feeds the unscaled image at every alpha: its feedback is the alpha=1 gradient
    **{f"nb_ours_h_nl{n}__image_tok": ("beyond_intuition_head", dict(start_layer=n + 1, steps=1)) for n in (-1, 0, 1)},
    "gradcam_attn": ("gradcam", dict(minmax=True)),
    **{f"rollout_s{s}": ("rollout", dict(start_layer=s)) for s in range(3)},
    "raw_attn": ("raw_attention", {}),
}


@pytest.mark.parametrize("key", sorted(BI_IMAGE_CALLS))
def test_bi_image_side(bi, key):
    name, options = BI_IMAGE_CALLS[key]
    _check(bi.image_side(name, **options), bi.z[key], bi.tol[key], key)


@pytest.mark.parametrize("n", [-1, 0, 1])
def test_bi_tokenwise_image_side_with_clip_values(bi, n):
    """Ours-T (``Interpretor.generate_ours_c``; the notebook's image side, steps=1 as above) holds with BI's
    CLIP value quirk (``token_scale_values="post_attention"``); the default (values of the attention input, as
    BI's ViT and BERT code) differs from it."""
    for key, steps in ((f"ours_t_nl{n}", 20), (f"nb_ours_t_nl{n}__image_tok", 1)):
        method = BeyondIntuitionToken(start_layer=n + 1, steps=steps, token_scale_values="post_attention")
        ours = method(bi.classifier, bi.images, target=bi.class_targets).double().numpy()
        _check(ours, bi.z[key], bi.tol[key], key)
    default = bi.image_side("beyond_intuition_token", start_layer=n + 1, steps=1)
    key = f"nb_ours_t_nl{n}__image_tok"
    assert _norm_errors(default, bi.z[key]).max() > 100 * bi.tol[key]


@pytest.mark.parametrize("n", [-1, 0, 1])
def test_bi_text_side(bi, n):
    """``interpret_ours`` / ``interpret_ours_c`` text side: alpha scales the token embeddings, the feedback is
    the EOT row of ``relu(mean_alpha grad).mean(heads)``; head-wise weights over the whole map (the texts as
    the authors pass them: no padding mask), token-wise with BI's CLIP value quirk."""
    key = f"nb_ours_h_nl{n}__text_eot_row"
    ours = bi.text_side("beyond_intuition_head", start_layer=n + 1, steps=20)
    _check(bi.text_rows(ours), bi.text_rows(bi.z[key]), bi.tol[key], key)
    key = f"nb_ours_t_nl{n}__text_eot_row"
    ours = bi.text_side(None, BeyondIntuitionToken(start_layer=n + 1, steps=20,
                                                     token_scale_values="post_attention"))
    _check(bi.text_rows(ours), bi.text_rows(bi.z[key]), bi.tol[key], key)


def test_bi_post_attention_values_match_the_reference(bi):
    """The recorded post-attention values times ``W_o^T`` are BI's ``vproj``; the block inputs are theirs."""
    adapter = adapter_for(bi.classifier)
    inputs = adapter.inputs.prepare(bi.image)
    with ActivationRecorder() as rec, torch.no_grad(), adapter.recording.eager_attention():
        for l in range(3):
            adapter.recording.post_attention_values(rec, l, ("v", l))
            adapter.recording.block_input(rec, l, ("z", l))
        adapter.forward(inputs, grad_from_block=3)
    for l in range(3):
        vproj = rec[("v", l)][0] @ adapter.linears(l).attention.out.weight.detach().t()
        np.testing.assert_allclose(vproj.numpy(), bi.z["dbg_t0__vproj"][l], rtol=0, atol=2e-5)
        np.testing.assert_allclose(rec[("z", l)][0].numpy(), bi.z["dbg_t0__block_input"][l], rtol=0, atol=2e-5)


def test_post_attention_values_are_named_where_they_do_not_exist():
    """The CLIP value quirk is an option of the CLIP towers only: elsewhere, and for an unknown value, the error
    names it."""
    from tests.families import _tiny_bert

    model = _tiny_bert().eval()
    ids = torch.tensor([[2, 5, 6, 7, 3]])
    with pytest.raises(ValueError, match="post_attention.*BertForSequenceClassification|post_attention.*does not"):
        BeyondIntuitionToken(token_scale_values="post_attention", steps=2)(model, ids, target=0)
    with pytest.raises(ValueError, match="token_scale_values must be one of"):
        BeyondIntuitionToken(token_scale_values="ln_1")


def test_padded_texts_equal_each_text_alone(mm):
    """With the padding mask, a padded text gets the scores it gets alone; padding scores exactly 0. Float64,
    but ``CLIPAttention``'s eager softmax runs in float32 whatever the model's dtype (``softmax(...,
    dtype=torch.float32)``), so a text of 16 positions and the same text cut at its EOS agree to float32
    rounding only."""
    from models.clip import PromptScorer

    clip = _clip(mm.z, torch.float64)
    scorer = PromptScorer(clip, mm.image.double())
    mask = (torch.arange(16)[None] <= torch.tensor(mm.eot)[:, None]).long()
    batch = {"input_ids": mm.tokens, "attention_mask": mask}
    for name, options in (("beyond_intuition_head", dict(start_layer=0, steps=3)), ("gradcam", {}),
                          ("beyond_intuition_token", dict(steps=3)), ("token_ablation", {})):
        method = build_method(name, **options)
        out = method(scorer, batch, target=0)
        assert (out[mask == 0] == 0).all() and out.abs().max() > 0
        for i, e in enumerate(mm.eot):
            alone = method(scorer, mm.tokens[i:i + 1, :e + 1], target=0)
            torch.testing.assert_close(out[i:i + 1, :e + 1], alone, rtol=1e-6,
                                       atol=1e-6 * float(alone.abs().max()), msg=name)


# --------------------------------------------------------------------------------------------- LRP
def test_lrp_conserves_relevance_on_both_towers():
    """No reference exists for LRP on CLIP: with the conservative ``"ours"`` rules, the relevance entering the
    first block sums to the one-hot target (1) per sample, on both towers (float64); full LRP runs to the
    pixels (image) and to the encoder input (text, where it still sums to 1)."""
    from tests.families import _clip_classifier, _clip_images, _clip_scorer, _clip_token_batch

    for model, inputs in ((_clip_classifier().eval(), _clip_images(3)), (_clip_scorer().eval(), _clip_token_batch(3))):
        start = head_relevance(model, inputs)
        adapter, engine, topology, acts, r = start.adapter, start.engine, start.topology, start.acts, start.relevance
        torch.testing.assert_close(r.sum(dim=(1, 2)), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-6)
        for l in reversed(range(len(adapter.blocks))):
            r, cam = topology.block_relprop(engine.rules, acts, l, r, True)
            torch.testing.assert_close(r.sum(dim=(1, 2)), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-6)
        full = build_method("lrp", rules="ours", class_token_score="keep")(model, inputs, target=1)
        if adapter.tower == "vision":
            assert full.shape == (3, 16, 16) and torch.isfinite(full).all()
        else:
            torch.testing.assert_close(full.sum(dim=1), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------- the wrappers
class _WordTokenizer:
    """A stand-in for ``CLIPTokenizer`` on the tiny CLIP: one id per word, start 38, end 39, padding 0."""

    def __call__(self, texts, padding=True, truncation=True, return_tensors="pt"):
        rows = [[38] + [3 + sum(map(ord, w)) % 35 for w in text.split()] + [39] for text in texts]
        n = max(map(len, rows))
        ids = torch.tensor([r + [0] * (n - len(r)) for r in rows])
        lengths = torch.tensor([len(r) for r in rows])
        return {"input_ids": ids, "attention_mask": (torch.arange(n)[None] < lengths[:, None]).long()}


def test_zero_shot_classifier_from_prompts_follows_openais_recipe():
    from models.clip import ZeroShotClassifier, text_embeddings
    from tests.families import _clip_images, _tiny_clip

    clip = _tiny_clip().eval()
    tok = _WordTokenizer()
    names = ["red square", "blue circle", "green triangle"]
    templates = ["a photo of a {}.", "a drawing of the {c}", lambda c: f"{c} again"]
    clf = ZeroShotClassifier.from_prompts(clip, tok, names, templates)
    for c, name in enumerate(names):
        prompts = [f"a photo of a {name}.", f"a drawing of the {name}", f"{name} again"]
        assert clf.prompts[c] == prompts
        each = torch.nn.functional.normalize(text_embeddings(clip, tok, prompts), dim=-1)
        expected = torch.nn.functional.normalize(each.mean(dim=0), dim=0)
        torch.testing.assert_close(clf.class_embeddings[c], expected, rtol=1e-6, atol=1e-7)
    assert clf.classnames == names and clf.num_classes == 3
    images = _clip_images(2).float()
    # one template: CLIP's own logits_per_image against the prompts
    single = ZeroShotClassifier.from_prompts(clip, tok, names, "a photo of a {}")
    batch = tok([f"a photo of a {n}" for n in names])
    with torch.no_grad():
        reference = clip(pixel_values=images, **batch).logits_per_image
        torch.testing.assert_close(single(images), reference, rtol=1e-5, atol=1e-5)
    # a dict of per-class prompts
    prompts = {"red square": ["a red square", "red"], "blue circle": "a blue circle"}
    per_class = ZeroShotClassifier.from_prompts(clip, tok, prompts)
    assert per_class.prompts == [["a red square", "red"], ["a blue circle"]]
    with pytest.raises(ValueError, match="not both"):
        ZeroShotClassifier.from_prompts(clip, tok, prompts, templates)
    with pytest.raises(ValueError, match="needs templates"):
        ZeroShotClassifier.from_prompts(clip, tok, names)
    with pytest.raises(ValueError, match="where the class name goes"):
        ZeroShotClassifier.from_prompts(clip, tok, names, "a photo")
    with pytest.raises(ValueError, match=r"class_embeddings must be \[C, 8\]"):
        ZeroShotClassifier(clip, torch.randn(3, 5))
    with pytest.raises(TypeError, match="CLIPModel"):
        ZeroShotClassifier(torch.nn.Linear(2, 2), torch.randn(3, 8))


def test_scorer_and_input_errors_are_named():
    from models.clip import PromptScorer, ZeroShotClassifier
    from tests.families import _clip_token_batch, _tiny_clip

    clip = _tiny_clip().eval()
    method = build_method("raw_attention")
    with pytest.raises(TypeError, match="wrap it as models.clip.ZeroShotClassifier"):
        method(clip, torch.randn(1, 3, 16, 16))
    clf = ZeroShotClassifier(clip, torch.randn(4, 8))
    with pytest.raises(ValueError, match="does not match the CLIP vision tower's image_size"):
        method(clf, torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match=r"PromptScorer needs pixel_values"):
        PromptScorer(clip)
    scorer = PromptScorer(clip, torch.randn(2, 3, 16, 16))
    batch = _clip_token_batch(3)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with pytest.raises(ValueError, match=r"samples \[0\] hold no EOS token \(id 39\)"):
        method(scorer, {"input_ids": torch.where(ids == 39, 5, ids)[:1]})
    with pytest.raises(ValueError, match="right padding"):
        method(scorer, {"input_ids": ids, "attention_mask": mask.flip(1)})
    short = mask.clone()
    short[0, 8] = 0
    with pytest.raises(ValueError, match="EOS token .* is padding"):
        method(scorer, {"input_ids": ids, "attention_mask": short})
    with pytest.raises(ValueError, match="exceed the CLIP text tower's 12 positions"):
        method(scorer, torch.cat([ids, ids], dim=1))
    with pytest.raises(ValueError, match=r"target classes must lie in \[0, 2\)"):
        method_cls = build_method("gradcam")
        method_cls(scorer, batch, target=2)


# --------------------------------------------------------------------------------------------- the datamodule
def test_prompt_sets():
    """OpenAI's 1,000 class names x 80 templates (open_clip's zero-shot metadata) and BI's legacy prompts (one
    template over torchvision's tuples of lemmas)."""
    from models.clip_prompts import build_prompt_set

    openai = build_prompt_set("openai")
    assert len(openai) == 1000 and {len(p) for p in openai.prompts} == {80}
    assert openai.classnames[:2] == ["tench", "goldfish"] and openai.prompts[0][0] == "a bad photo of a tench."
    assert len(set(openai.prompts[0])) == 80
    assert {len(p) for p in build_prompt_set("simple").prompts} == {7}
    legacy = build_prompt_set("bi_legacy")
    assert legacy.prompts[0] == ["a photo of a ('tench', 'Tinca tinca')"]
    assert legacy.prompts[6] == ["a photo of a ('stingray',)"]
    custom = build_prompt_set("custom", classnames=["a", "b"], templates="{} photo")
    assert custom.prompts == [["a photo"], ["b photo"]]
    with pytest.raises(ValueError, match="use prompts='custom'"):
        build_prompt_set("openai", templates="{}")


def test_bi_subset_and_synthetic_images(tmp_path):
    """The subset index selects images of the full split in torchvision's order (class folders by wnid, files
    sorted), in the file's order; the synthetic source gives the shapes with their masks and shape prompts."""
    from PIL import Image

    from datamodules.clip_zero_shot import BI_SUBSET_FILE, CLIPZeroShotDataModule
    from models.clip import ZeroShotClassifier
    from tests.families import _tiny_clip

    wnids = ["n01440764", "n01443537", "n01484850"]                  # classes 0, 1, 2
    for wnid in wnids:
        (tmp_path / "val" / wnid).mkdir(parents=True)
        for j in range(4):
            Image.new("RGB", (40, 30), (10 * j, 50, 90)).save(tmp_path / "val" / wnid / f"img_{3 - j}.JPEG")
    np.save(tmp_path / "index.npy", np.array([5, 0, 11]))
    dm = CLIPZeroShotDataModule(root=str(tmp_path), subset_index=str(tmp_path / "index.npy"), prompts="custom",
                                classnames={"tench": "a tench"}, image_size=16, batch_size=3)
    dataset = dm.dataset()
    assert [(Path(p).parent.name, Path(p).name, y) for p, y in dataset.samples] == [
        (wnids[1], "img_1.JPEG", 1), (wnids[0], "img_0.JPEG", 0), (wnids[2], "img_3.JPEG", 2)]
    batch = next(iter(dm.test_dataloader()))
    assert batch["image"].shape == (3, 3, 16, 16) and batch["index"].tolist() == [0, 1, 2]
    np.save(tmp_path / "far.npy", np.array([3, 12]))
    with pytest.raises(ValueError, match="indexes images up to 12, but .* holds 12 images"):
        CLIPZeroShotDataModule(root=str(tmp_path), subset_index=str(tmp_path / "far.npy"), prompts="custom",
                               classnames={"x": "x"}).dataset()
    assert BI_SUBSET_FILE.is_file() and np.load(BI_SUBSET_FILE).shape == (5000,)
    assert CLIPZeroShotDataModule(root=str(tmp_path), subset_index="bi", prompts="custom",
                                  classnames={"x": "x"}).subset_index == str(BI_SUBSET_FILE)

    dm = CLIPZeroShotDataModule(images="synthetic", prompts="bi_legacy", test_size=2, image_size=16, batch_size=2)
    assert dm.classnames == ["square", "circle", "triangle", "cross"]
    assert dm.prompt_set.prompts[1] == ["a photo of a circle"]
    batch = next(iter(dm.test_dataloader()))
    assert set(batch) >= {"image", "label", "mask", "index"} and batch["image"].shape == (2, 3, 16, 16)
    clip = _tiny_clip().eval()
    clf = dm.zero_shot_classifier(clip, _WordTokenizer())
    assert isinstance(clf, ZeroShotClassifier) and clf.num_classes == 4
    assert clf(dm.normalize(batch["image"])).shape == (2, 4)


def test_datamodule_classifier_keeps_repeated_class_names():
    """OpenAI's ImageNet names repeat "missile" and "sunglasses": each repeat stays its own class (a classifier
    keyed by name would have 998 classes for 1,000 labels)."""
    from datamodules.clip_zero_shot import CLIPZeroShotDataModule
    from models.clip_prompts import openai_imagenet_classnames
    from tests.families import _tiny_clip

    names = openai_imagenet_classnames()
    assert len(names) == 1000 and len(set(names)) == 998
    dm = CLIPZeroShotDataModule(images="synthetic", prompts="custom", classnames=["missile", "sunglasses",
                                "missile", "sunglasses"], templates="a {}", image_size=16)
    clf = dm.zero_shot_classifier(_tiny_clip().eval(), _WordTokenizer())
    assert clf.num_classes == 4 and clf.classnames == ["missile", "sunglasses", "missile", "sunglasses"]
