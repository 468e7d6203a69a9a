"""Generates atman_gpt2.npz / atman_gpt2.cases.json: AtMan as the authors' code computes it (NOT run by CI).

Reference: https://github.com/Aleph-Alpha/AtMan at commit 847f09078c6c5614ac89866d28c3a25787d4782d, its
``atman-magma/atman_magma`` package unchanged: the GPT-Neo/GPT-J fork ``gpt_neo/modeling_gpt_neo.py`` (which applies
``manipulate_attention.manipulate_attention_scores`` in every block), ``explainer.Explainer`` (the suppression
configs, conceptual suppression through ``conceptual_suppression.ConceptualSuppression``, the batched forwards) and
``logit_parsing.get_delta_cross_entropies`` (the scores). Only a stand-in for MAGMA is written here (``TinyMagma``:
``preprocess_inputs`` turns a string of token ids into the fork's word embeddings; ``lm`` is the fork, its logits
left in the model's dtype: ``WideLogits``).

The fork is built with ``rotary=False, jax=False`` and every layer global: GPT-Neo's architecture, which is stock
``GPT2LMHeadModel`` with ``scale_attn_weights=False`` (the fork does not scale the scores) and a zero query/key/value
bias; the weights are stored in GPT-2's key names and the script checks that stock GPT-2 gives the fork's logits.

Run offline in a scratch venv with transformers 4.30.2 and einops (the fork imports ``transformers.file_utils``):
    python -m venv --system-site-packages venv && venv/bin/pip install transformers==4.30.2 einops
    venv/bin/python make_golden.py /path/to/AtMan/atman-magma
"""
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

REF = Path(sys.argv[1])
sys.path.insert(0, str(REF))


def _docstring_decorator_compat():
    """The fork decorates its forwards with ``add_code_sample_docstrings(tokenizer_class=...)``, an argument
    transformers renamed ``processor_class`` (4.16); a docstring decorator only, nothing it computes."""
    import transformers.file_utils as file_utils

    original = file_utils.add_code_sample_docstrings

    def compat(*args, tokenizer_class=None, **kwargs):
        return original(*args, processor_class=tokenizer_class, **kwargs)
    file_utils.add_code_sample_docstrings = compat


_docstring_decorator_compat()
from atman_magma.explainer import Explainer  # noqa: E402
from atman_magma.gpt_neo.configuration_gpt_neo import GPTNeoConfig  # noqa: E402
from atman_magma.gpt_neo.modeling_gpt_neo import GPTNeoForCausalLM  # noqa: E402
from atman_magma.logit_parsing import get_delta_cross_entropies  # noqa: E402

OUT = Path(__file__).resolve().parent
COMMIT = "847f09078c6c5614ac89866d28c3a25787d4782d"
VOCAB, WIDTH, LAYERS, HEADS, POSITIONS = 64, 32, 2, 4, 32
PROMPTS = [[5, 17, 9, 33, 17, 41, 12], [8, 30, 22, 6, 50], [14, 3, 27, 27, 60, 19, 44, 11, 38]]
TARGETS = [11, 40, 7]
#: (name, suppression factor, conceptual threshold, scale the factor by the similarity)
SETTINGS = [("plain", 0.1, None, True), ("conceptual", 0.1, 0.2, True), ("conceptual_unscaled", 0.3, 0.2, False)]


class WideLogits(nn.Module):
    """``GPTNeoForCausalLM.forward`` as the fork writes it (the suppression attributes the ``Explainer`` sets, the
    fork's own ``get_modified_causal_attention_mask`` and ``transformer`` forward, ``lm_head``) without its last
    ``.float()``: the fork casts the logits to float32, which would cap a float64 golden at float32 precision."""

    def __init__(self, fork):
        super().__init__()
        self.fork = fork
        self.suppression_factors = None
        self.suppression_token_indices = None
        self.manipulate_attn_scores_after_scaling = False
        self.layers = None

    @property
    def transformer(self):
        return self.fork.transformer

    def forward(self, inputs_embeds):
        mask = None
        if self.suppression_token_indices is not None and self.suppression_factors is not None:
            mask = self.fork.get_modified_causal_attention_mask(
                seq_len=inputs_embeds.shape[1], suppression_token_indices=self.suppression_token_indices,
                suppression_factors=self.suppression_factors)
        hidden = self.fork.transformer(inputs_embeds=inputs_embeds, modified_causal_attention_mask=mask,
                                       manipulate_attn_scores_after_scaling=self.manipulate_attn_scores_after_scaling,
                                       manipulate_layers=self.layers)[0]
        return SimpleNamespace(logits=self.fork.lm_head(hidden))


class TinyMagma(nn.Module):
    """What ``Explainer`` reads of a MAGMA model: ``lm`` and ``preprocess_inputs`` (text only)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = WideLogits(lm)

    @property
    def device(self):
        return next(self.parameters()).device

    def preprocess_inputs(self, inputs, embed=True):
        ids = torch.tensor([[int(t) for t in inputs[0].split()]])
        return self.lm.transformer.wte(ids) if embed else [ids]


def fork_model():
    config = GPTNeoConfig(vocab_size=VOCAB, max_position_embeddings=POSITIONS, hidden_size=WIDTH, num_layers=LAYERS,
                          attention_types=[[["global"], LAYERS]], num_heads=HEADS, rotary=False, jax=False,
                          model_device="cpu", model_dtype="fp32", activation_function="gelu_new")
    torch.manual_seed(0)
    model = GPTNeoForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name != "lm_head.weight":
                p.add_(0.3 * torch.randn_like(p))
    return model


def gpt2_weights(fork):
    """The fork's weights in stock ``GPT2LMHeadModel`` key names (Conv1D weights stored ``[in, out]``)."""
    sd = {k: v.detach().double() for k, v in fork.state_dict().items()}
    out = {f"transformer.{k}": sd[f"transformer.{k}"] for k in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias")}
    for i in range(LAYERS):
        h = f"transformer.h.{i}."
        a = h + "attn.attention."
        qkv = torch.cat([sd[a + "q_proj.weight"], sd[a + "k_proj.weight"], sd[a + "v_proj.weight"]], dim=0)
        out[h + "attn.c_attn.weight"] = qkv.T.contiguous()
        out[h + "attn.c_attn.bias"] = torch.zeros(3 * WIDTH, dtype=torch.float64)
        out[h + "attn.c_proj.weight"] = sd[a + "out_proj.weight"].T.contiguous()
        out[h + "attn.c_proj.bias"] = sd[a + "out_proj.bias"]
        for norm in ("ln_1", "ln_2"):
            out[h + norm + ".weight"], out[h + norm + ".bias"] = sd[h + norm + ".weight"], sd[h + norm + ".bias"]
        for linear in ("c_fc", "c_proj"):      # nn.Linear [out, in] -> Conv1D [in, out]
            out[h + f"mlp.{linear}.weight"] = sd[h + f"mlp.{linear}.weight"].T.contiguous()
            out[h + f"mlp.{linear}.bias"] = sd[h + f"mlp.{linear}.bias"]
    return out


GPT2_CONFIG = dict(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS,
                   activation_function="gelu_new", scale_attn_weights=False, resid_pdrop=0.0, embd_pdrop=0.0,
                   attn_pdrop=0.0, layer_norm_epsilon=1e-5, tie_word_embeddings=True)


def check_stock_gpt2(fork, weights, dtype):
    from transformers import GPT2Config, GPT2LMHeadModel

    stock = GPT2LMHeadModel(GPT2Config(**GPT2_CONFIG)).eval()
    missing, unexpected = stock.load_state_dict({k: v for k, v in weights.items()}, strict=False)
    assert not unexpected and all(k.endswith(("attn.bias", "masked_bias", "lm_head.weight")) for k in missing), missing
    stock.to(dtype)
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        ours, theirs = stock(ids).logits, WideLogits(fork)(fork.transformer.wte(ids)).logits
    err = float((ours - theirs).abs().max() / theirs.abs().max())
    print(f"stock GPT-2 vs the fork ({dtype}): max |logit difference| / max |logit| {err:.3g}, "
          f"max |logit| {float(theirs.abs().max()):.3g}")
    assert err < (1e-12 if dtype == torch.float64 else 1e-5)


def main():
    fork = fork_model()
    weights = gpt2_weights(fork)
    arrays = {f"weight/{k}": v.numpy() for k, v in weights.items()}
    cases = []
    for dtype_name, dtype in (("float64", torch.float64), ("float32", torch.float32)):
        fork.to(dtype)
        check_stock_gpt2(fork, weights, dtype)
        for setting, factor, threshold, scaled in SETTINGS:
            explainer = Explainer(model=TinyMagma(fork), device="cpu", tokenizer=None, suppression_factor=factor,
                                  conceptual_suppression_threshold=threshold,
                                  modify_suppression_factor_based_on_cossim=scaled)
            for i, (prompt, target) in enumerate(zip(PROMPTS, TARGETS)):
                logits = explainer.collect_logits_by_manipulating_attention(
                    prompt=[" ".join(map(str, prompt))], target=str(target), max_batch_size=3)
                result = get_delta_cross_entropies(output=logits)
                values = [e["value"] for e in result.data[0]["explanation"]]
                assert len(values) == len(prompt)
                key = f"{dtype_name}/{setting}/{i}"
                arrays[key] = np.array(values, dtype=np.float64)
                cases.append({"key": key, "dtype": dtype_name, "prompt": prompt, "target": target,
                              "suppression": factor, "conceptual_threshold": threshold, "conceptual_scaled": scaled})
    np.savez_compressed(OUT / "atman_gpt2.npz", **arrays)
    meta = {"reference": "https://github.com/Aleph-Alpha/AtMan", "commit": COMMIT,
            "reference_call": "Explainer(...).collect_logits_by_manipulating_attention(prompt, target, "
                              "max_batch_size=3) then logit_parsing.get_delta_cross_entropies(...).data[0]",
            "score": "CE(clean) - CE(suppressed) of the target token, per prompt position",
            "gpt2_config": GPT2_CONFIG, "cases": cases}
    (OUT / "atman_gpt2.cases.json").write_text(json.dumps(meta, indent=1))
    print(f"wrote {len(cases)} cases")


if __name__ == "__main__":
    main()
