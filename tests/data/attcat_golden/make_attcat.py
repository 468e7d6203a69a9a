"""Golden outputs of AttCAT's own code (qiangyao1988/AttCAT, ``generate_TransCAM``) on the seeded random BERT of
``../shared/golden/bi_bert.npz`` (its weights, not stored again here; its 3 examples: two full-length, one padded
11 of 16).

Not run by CI. Needs: the reference tree at ``$ATTCAT_REF`` (``git archive 441262f7a352a6abad40d575f6bccb4b1853101f``
of github.com/qiangyao1988/AttCAT), the shared golden generator's shims at ``$GOLDEN_GEN``
(``../shared/golden/bert_clip_gen/gen/common.py``: ``.cuda()`` as identity on the CPU, a gensim stub, the
transformers 3.5.1 attention-mask helpers, ``init_weights`` no-op, ``return_dict=False``), torch and transformers.

  ATTCAT_REF=.../AttCAT GOLDEN_GEN=../../../../shared/golden/bert_clip_gen/gen python make_attcat.py OUT.npz

Every call is the reference's own, at batch 1 (its generator builds a (1, C) one-hot): per example, per target
(predicted class, other class), per dtype (float32, float64): the padded example both as the reference sees it
padded (16 positions, ``padded``) and cut to its real tokens (``cut``).
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.environ["GOLDEN_GEN"])
import common as C  # noqa: E402

C.shim_cuda()
C.shim_gensim()
C.shim_transformers_351()
sys.path.insert(0, os.environ["ATTCAT_REF"])
from BERT_explainability.modules.BERT.BertForSequenceClassification import BertForSequenceClassification  # noqa: E402
from BERT_explainability.modules.BERT.ExplanationGenerator import Generator  # noqa: E402
from transformers import BertConfig  # noqa: E402

torch.set_num_threads(1)
shared = os.path.join(os.environ["GOLDEN_GEN"], "..", "..")
z = np.load(os.path.join(shared, "bi_bert.npz"), allow_pickle=True)
config = dict(vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
              max_position_embeddings=64, type_vocab_size=2, num_labels=2, hidden_act="gelu", layer_norm_eps=1e-12,
              pad_token_id=0)
weights = {k[2:]: torch.from_numpy(z[k]) for k in z.files if k.startswith("w/")}
ids, mask = torch.from_numpy(z["input_ids"]), torch.from_numpy(z["attention_mask"])
targets = np.stack([z["pred_class"], z["other_class"]], axis=1)        # [3, 2]
out = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "targets": targets}
for dtype in (torch.float32, torch.float64):
    with C.no_init_weights():
        model = BertForSequenceClassification(BertConfig(**config, return_dict=False))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert set(missing) <= {"bert.embeddings.position_ids"} and not unexpected, (missing, unexpected)
    model = model.to(dtype).eval()
    generator = Generator(model)
    tag = "f32" if dtype == torch.float32 else "f64"
    padded = np.zeros((3, 2, ids.shape[1]))
    for i in range(3):
        for j in range(2):
            cam = generator.generate_TransCAM(ids[i:i + 1], mask[i:i + 1], index=int(targets[i, j]))
            padded[i, j] = cam.detach().double().numpy()
    out[f"padded_{tag}"] = padded
    length = int(mask[2].sum())
    cut = np.zeros((2, length))
    for j in range(2):
        cam = generator.generate_TransCAM(ids[2:3, :length], mask[2:3, :length], index=int(targets[2, j]))
        cut[j] = cam.detach().double().numpy()
    out[f"cut_{tag}"] = cut
commit = subprocess.run(["git", "-C", os.environ["ATTCAT_REF"], "log", "-1", "--format=%H"], capture_output=True,
                        text=True).stdout.strip() or "441262f7a352a6abad40d575f6bccb4b1853101f (git archive)"
out["meta_json"] = np.array(json.dumps({
    "reference": "qiangyao1988/AttCAT", "commit": commit,
    "call": "Generator(model).generate_TransCAM(input_ids, attention_mask, index=target), batch 1",
    "torch": torch.__version__, "shims": sorted(C.SHIMS)}))
np.savez_compressed(sys.argv[1], **out)
print({k: v.shape for k, v in out.items() if not k.startswith("w/")})
