"""Generates ``inseq_gpt2.npz`` / ``inseq_gpt2.json``: Inseq's ``value_zeroing`` on a seeded tiny GPT-2 (not run by CI).

Run offline in a scratch venv (``python -m venv --system-site-packages``; ``pip install inseq==0.7.1
transformers==4.56.2``: Inseq's frame-traced hooks need a GPT-2 block that returns a tuple, which transformers 5
no longer does), from this folder: ``python make_inseq_golden.py``. Inseq's stock GPT-2 config names the local
variable ``value``, which transformers 4.56 calls ``value_states``: registered through Inseq's own
``register_model_config``. Writes the model (``gpt2/``: config + safetensors, loadable by the stock class) and,
per sequence, Inseq's decoder self-scores at the final step ``[layers, rows, N]`` (rows: the positions Inseq
scores, the last ``generated`` ones; Inseq's NaN above the diagonal stored as 0).
"""
import json

import inseq
import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

SEQUENCES = [("w5 w9 w3", "w5 w9 w3 w17 w2 w8"), ("w7 w1", "w7 w1 w30 w4"),
             ("w12 w6 w9 w21", "w12 w6 w9 w21 w3 w3 w11")]

torch.manual_seed(0)
vocab = {f"w{i}": i for i in range(40)}
vocab["<eos>"] = 40
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<eos>", eos_token="<eos>", unk_token="w0",
                               pad_token="<eos>")
cfg = GPT2Config(vocab_size=41, n_positions=32, n_embd=16, n_layer=2, n_head=2, bos_token_id=40, eos_token_id=40,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = GPT2LMHeadModel(cfg).eval()
with torch.no_grad():
    for p in model.parameters():
        p.add_(0.3 * torch.randn_like(p))
model.save_pretrained("gpt2")
fast.save_pretrained("gpt2")

inseq.register_model_config("GPT2LMHeadModel", {"self_attention_module": "attn", "value_vector": "value_states"},
                            overwrite=True, allow_partial=True)
attribution_model = inseq.load_model("gpt2", "value_zeroing", model_kwargs={"dtype": torch.float64})
arrays, cases = {}, []
for k, (prompt, text) in enumerate(SEQUENCES):
    out = attribution_model.attribute(input_texts=prompt, generated_texts=text, show_progress=False)
    scores = out.sequence_attributions[0].target_attributions.double().numpy()   # [attributed, generated, L]
    ids = [vocab[w] for w in text.split()][:-1]   # the final step reads the text without its last token
    n = len(ids)
    arrays[f"scores_{k}"] = np.nan_to_num(np.transpose(scores, (2, 1, 0)))[:, :, :n]
    arrays[f"ids_{k}"] = np.array(ids)
    cases.append({"prompt": prompt, "text": text, "ids": ids, "rows": int(scores.shape[1])})
np.savez("inseq_gpt2.npz", **arrays)
json.dump({"reference": "inseq 0.7.1 (PyPI; inseq-team/inseq a269ee8fbc65f9079109856e0f995e39a6333a8b) "
                        "inseq/attr/feat/ops/value_zeroing.py",
           "environment": "torch 2.14.1, transformers 4.56.2, float64 model (Inseq casts the states to float32 "
                          "before the cosine)",
           "method": "value_zeroing, similarity_metric='cosine' (default), decoder self-scores at the final step",
           "cases": cases}, open("inseq_gpt2.json", "w"), indent=1)
