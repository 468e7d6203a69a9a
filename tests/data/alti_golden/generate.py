"""Generates the ALTI / ALTI-Logit goldens from the authors' code (not run by CI).

References (read from a checkout of each repository at the commit below, run as they are, batch 1, offline):
* ALTI: mt-upc/transformer-contributions @ 4f89039821c95fe618fa0f63beb783ba72b49485
  (``src/contributions.py`` ModelWrapper.get_contributions, ``src/utils_contributions.py`` normalize_contributions
  ``min_sum`` with the L1 resultant norm, compute_joint_attention; the read-out row 0 of the last layer, as
  ``attributions.py`` contribution_relevancies_sst2);
* ALTI-Logit: mt-upc/logit-explanations @ fadf415fd4303d6b251cf921a8ff608362a6d5b1
  (``src/contributions.py`` get_logit_contributions, ``src/utils_contributions.py`` compute_alti,
  ``extract_explanations.py`` track2input_tokens with ``aff_x_j``, summed over layers; the ALTI row of the last
  position, ``compute_alti(...)[-1][-1]``).

Usage (a venv with the project's torch / transformers and ``pyaml_env``, ``ipywidgets``, ``python-dotenv``):
    python generate.py /path/to/transformer-contributions /path/to/logit-explanations
writes ``models/`` (tiny seeded stock models, float64) and ``goldens.pt`` beside this file.
"""
import importlib
import json
import os
import sys
import types
from pathlib import Path

import torch
import transformers

HERE = Path(__file__).resolve().parent
ALTI_COMMIT = "4f89039821c95fe618fa0f63beb783ba72b49485"
LOGIT_COMMIT = "fadf415fd4303d6b251cf921a8ff608362a6d5b1"
#: real lengths of the sentences (each run alone by the references)
LENGTHS = (7, 5, 9)


def tiny_bert():
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=32, type_vocab_size=2,
                                     num_labels=3, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_((1.0 if (".query." in name or ".key." in name) else 0.2) * torch.randn_like(p))
    return model.double().eval()


def tiny_gpt2():
    config = transformers.GPT2Config(vocab_size=50, n_positions=32, n_embd=32, n_layer=3, n_head=4,
                                     bos_token_id=49, eos_token_id=49)
    torch.manual_seed(1)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model.double().eval()


def sentences(seed, bos=None):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in LENGTHS:
        ids = torch.randint(3, 50, (n,), generator=gen)
        if bos is not None:
            ids[0] = bos
        else:
            ids[0], ids[-1] = 1, 2            # [CLS] ... [SEP]
        out.append(ids.tolist())
    return out


def clear_modules():
    for name in [m for m in sys.modules if m == "src" or m.startswith("src.") or m in ("extract_explanations",
                                                                                     "lm_saliency")]:
        del sys.modules[name]


def run_alti(repo, model, ids_list):
    os.chdir(repo)
    sys.path.insert(0, str(repo))
    clear_modules()
    from src.contributions import ModelWrapper
    from src.utils_contributions import compute_joint_attention, normalize_contributions
    wrapped = ModelWrapper(model)
    rows = []
    for ids in ids_list:
        batch = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        _, _, _, data = wrapped(batch)
        resultant_norm = torch.norm(torch.squeeze(data["resultants"]), p=1, dim=-1)
        normalized = normalize_contributions(data["contributions"], scaling="min_sum", resultant_norm=resultant_norm)
        rows.append(compute_joint_attention(normalized)[-1][0].clone())
    sys.path.remove(str(repo))
    return rows


def run_alti_logit(repo, model, ids_list, targets, foils):
    os.chdir(repo)
    sys.path.insert(0, str(repo))
    clear_modules()
    # lm_saliency (the gradient baselines, star-imported by extract_explanations) downloads the "gpt2" config when
    # imported; nothing of it is used here, so an empty module stands in for it (offline)
    sys.modules["lm_saliency"] = types.ModuleType("lm_saliency")
    # src.utils_contributions first: it imports extract_explanations itself (a cycle that holds in this order)
    utils_contributions = importlib.import_module("src.utils_contributions")
    extract_explanations = importlib.import_module("extract_explanations")
    ModelWrapper = importlib.import_module("src.contributions").ModelWrapper
    wrapped = ModelWrapper(model)
    alti_rows, target_rows, contrast_rows = [], [], []
    for ids, target, foil in zip(ids_list, targets, foils):
        batch = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        _, hidden_states, attentions = wrapped(batch)
        logit_dict, _, alti_data = wrapped.get_logit_contributions(hidden_states, attentions, [target, foil])
        mix = utils_contributions.compute_alti(alti_data)
        tracked = extract_explanations.track2input_tokens(logit_dict, ["aff_x_j"], mix, [target, foil])
        per_token = tracked["logit_aff_x_j_alti"]
        alti_rows.append(mix[-1][-1].clone())
        target_rows.append(per_token[0].sum(0).clone())
        contrast_rows.append((per_token[0] - per_token[1]).sum(0).clone())
    sys.path.remove(str(repo))
    return alti_rows, target_rows, contrast_rows


def main(alti_repo, logit_repo):
    alti_repo, logit_repo = Path(alti_repo).resolve(), Path(logit_repo).resolve()
    torch.set_default_dtype(torch.float64)    # the references' float32 buffers (normalize_contributions) in float64
    bert, gpt2 = tiny_bert(), tiny_gpt2()
    for model in (bert, gpt2):
        model.config._attn_implementation = "eager"     # output_attentions
    bert.save_pretrained(HERE / "models" / "bert")
    gpt2.save_pretrained(HERE / "models" / "gpt2")
    bert_ids, gpt2_ids = sentences(10), sentences(11, bos=49)
    with torch.no_grad():
        predicted = [int(gpt2(torch.tensor([ids])).logits[0, -1].argmax()) for ids in gpt2_ids]
    foils = [(t + 7) % 50 for t in predicted]
    goldens = {
        "bert_ids": bert_ids, "gpt2_ids": gpt2_ids, "gpt2_targets": predicted, "gpt2_foils": foils,
        "alti_bert": run_alti(Path(alti_repo).resolve(), bert, bert_ids),
    }
    alti_rows, target_rows, contrast_rows = run_alti_logit(Path(logit_repo).resolve(), gpt2, gpt2_ids, predicted, foils)
    goldens.update(alti_gpt2=alti_rows, alti_logit_gpt2=target_rows, alti_logit_gpt2_contrast=contrast_rows)
    torch.save(goldens, HERE / "goldens.pt")
    (HERE / "REFERENCE.json").write_text(json.dumps({
        "alti": {"repository": "mt-upc/transformer-contributions", "commit": ALTI_COMMIT},
        "alti_logit": {"repository": "mt-upc/logit-explanations", "commit": LOGIT_COMMIT},
        "transformers": transformers.__version__, "torch": torch.__version__, "dtype": "float64",
        "cases": {k: len(v) for k, v in goldens.items() if k.startswith("alti")},
    }, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
