"""Generates ``authors_bert.npz`` / ``authors_bert.json`` and ``bert/``: the authors' Value Zeroing (not run by CI).

hmohebbi/ValueZeroing at 57d448daf9541e88062883f8374341566e4c06ee: its BERT fork
(``modeling/customized_modeling_bert.py``, ``BertLayer(..., zero_value_index=t)``) driven by the loop of its
``scoring/value_zeroing.py`` (batch 1: each block run on the previous block's original output with token ``t``'s
values zeroed, scikit-learn's ``cosine_distances``, rows divided by their sums; ``compute_joint_attention(res=False)``
for the rollout; that script reads its data and arguments at import, so its loop is restated here). Run offline
in a scratch venv (``python -m venv --system-site-packages``; ``pip install transformers==4.30.2``: the fork
imports ``apply_chunking_to_forward`` from ``transformers.modeling_utils``, gone in later releases) with the
repository on ``sys.path``: ``python make_authors_golden.py /path/to/ValueZeroing``. The seeded tiny model is
saved with ``save_pretrained`` (``bert/``, loadable by the stock ``BertForSequenceClassification``).
"""
import json
import sys

import numpy as np
import torch
from sklearn.metrics.pairwise import cosine_distances

sys.path.insert(0, sys.argv[1])
from modeling.customized_modeling_bert import BertForSequenceClassification  # noqa: E402
from transformers import BertConfig  # noqa: E402

SEQUENCES = [[1, 7, 12, 5, 30, 9, 2], [1, 22, 4, 2], [1, 3, 18, 27, 11, 6, 14, 8, 2]]

torch.manual_seed(0)
config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=32,
                    max_position_embeddings=32, num_labels=3, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
model = BertForSequenceClassification(config).eval()
with torch.no_grad():
    for p in model.parameters():
        p.add_(0.3 * torch.randn_like(p))
model.save_pretrained("bert", safe_serialization=True)
model = model.double()


def compute_joint_attention(att_mat):      # their compute_joint_attention(att_mat, res=False)
    joint = np.zeros(att_mat.shape)
    joint[0] = att_mat[0]
    for i in np.arange(1, att_mat.shape[0]):
        joint[i] = att_mat[i].dot(joint[i - 1])
    return joint


arrays = {}
for k, ids in enumerate(SEQUENCES):
    input_ids = torch.tensor([ids])
    mask = torch.ones_like(input_ids)
    with torch.no_grad():
        outputs = model(input_ids, attention_mask=mask, output_hidden_states=True, output_attentions=False)
    org_hidden_states = torch.stack(outputs["hidden_states"]).squeeze(1)
    seq_length = len(ids)
    score_matrix = np.zeros((config.num_hidden_layers, seq_length, seq_length))
    for l, layer_module in enumerate(model.bert.encoder.layer):
        for t in range(seq_length):
            extended = model.bert.get_extended_attention_mask(mask, input_ids.size(), input_ids.device)
            with torch.no_grad():
                layer_outputs = layer_module(org_hidden_states[l].unsqueeze(0), attention_mask=extended,
                                             output_attentions=False, zero_value_index=t)
            x = layer_outputs[0].squeeze().detach().cpu().numpy()
            y = org_hidden_states[l + 1].detach().cpu().numpy()
            score_matrix[l, :, t] = cosine_distances(x, y).diagonal()
    score_matrix = score_matrix / np.sum(score_matrix, axis=-1, keepdims=True)
    arrays[f"scores_{k}"] = score_matrix
    arrays[f"rollout_{k}"] = compute_joint_attention(score_matrix)
    arrays[f"ids_{k}"] = np.array(ids)
np.savez("authors_bert.npz", **arrays)
json.dump({"reference": "hmohebbi/ValueZeroing 57d448daf9541e88062883f8374341566e4c06ee "
                        "(modeling/customized_modeling_bert.py, the loop of scoring/value_zeroing.py)",
           "environment": "torch 2.14.1, transformers 4.30.2, scikit-learn cosine_distances, float64",
           "cases": [{"ids": ids} for ids in SEQUENCES]}, open("authors_bert.json", "w"), indent=1)
