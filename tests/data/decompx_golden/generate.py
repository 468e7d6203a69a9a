"""Generates the DecompX goldens from the authors' code (not run by CI).

Reference: mohsenfayyaz/DecompX @ b6bddf0b185f729c029b08d0f37108a5fcc85a4c (``src/modeling_bert.py``,
``src/modeling_roberta.py``, ``src/decompx_utils.py``: the authors' forks of transformers 4.17's BERT and RoBERTa
classifiers), run as they are, batch 1 (each sentence alone), float64, offline. The map of a sentence is the
reference's ``classifier`` output ``[N, C]`` (each input token's contribution to each logit), as its Colab demo
reads it (``decompx_last_layer_outputs.classifier``).

Two steps, two environments:
    python generate.py models                   # the project's Python: tiny seeded stock models -> models/
    /venv-with-transformers-4.18/bin/python generate.py goldens /path/to/DecompX   # the reference -> goldens.pt
(the second venv: ``python -m venv --system-site-packages``, then ``pip install --no-deps transformers==4.18.0``,
the version the reference's Colab demo installs). The weights are read from ``models/`` by key into the reference's
classes.
"""
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
COMMIT = "b6bddf0b185f729c029b08d0f37108a5fcc85a4c"
#: real lengths of the sentences (each run alone by the reference)
LENGTHS = (7, 5, 9)
SIZES = dict(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
             num_labels=3, hidden_act="gelu")
#: the reference's configurations: its Colab demo's (``default``) and three of its options
CONFIGS = {
    "default": dict(include_biases=True, bias_decomp_type="absdot", FFN_approx_type="GeLU_ZO", tanh_approx_type="ZO"),
    "linear": dict(include_biases=True, bias_decomp_type="absdot", FFN_approx_type="GeLU_LA", tanh_approx_type="LA"),
    "norm_relu": dict(include_biases=True, bias_decomp_type="norm", FFN_approx_type="ReLU", tanh_approx_type="ZO"),
    "no_biases": dict(include_biases=False, bias_decomp_type="absdot", FFN_approx_type="GeLU_ZO",
                      tanh_approx_type="ZO"),
}


def configs(transformers):
    return {
        "bert": transformers.BertConfig(max_position_embeddings=32, type_vocab_size=2, pad_token_id=0, **SIZES),
        "roberta": transformers.RobertaConfig(max_position_embeddings=40, type_vocab_size=1, pad_token_id=1,
                                              bos_token_id=0, eos_token_id=2, **SIZES),
    }


def sentences(seed, first, last):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in LENGTHS:
        ids = torch.randint(3, 50, (n,), generator=gen)
        ids[0], ids[-1] = first, last
        out.append(ids.tolist())
    return out


def make_models():
    """Tiny seeded stock classifiers (float64), the attention projections scaled up so that the attention is far
    from uniform."""
    import transformers
    classes = {"bert": transformers.BertForSequenceClassification,
               "roberta": transformers.RobertaForSequenceClassification}
    for seed, (kind, config) in enumerate(configs(transformers).items()):
        torch.manual_seed(seed)
        model = classes[kind](config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.add_((1.0 if (".query." in name or ".key." in name) else 0.2) * torch.randn_like(p))
        model.double().eval().save_pretrained(HERE / "models" / kind)


def make_goldens(repo):
    # transformers 4.18 (the reference's Colab pin; 4.17 lacks ``transformers.utils.ModelOutput`` that its
    # modelling files import) checks for tokenizers < 0.13, which has no wheel for this Python; no tokenizer is used
    # here, so tokenizers is hidden from it
    sys.modules["tokenizers"] = None
    import transformers
    from safetensors.torch import load_file
    sys.path.insert(0, str(Path(repo).resolve()))
    from src.decompx_utils import DecompXConfig
    from src.modeling_bert import BertForSequenceClassification
    from src.modeling_roberta import RobertaForSequenceClassification
    torch.set_default_dtype(torch.float64)     # the reference's own tensors (eye, zeros) in float64
    classes = {"bert": BertForSequenceClassification, "roberta": RobertaForSequenceClassification}
    ids = {"bert": sentences(10, 1, 2), "roberta": sentences(11, 0, 2)}
    goldens = {f"{kind}_ids": ids[kind] for kind in classes}
    for kind, config in configs(transformers).items():
        model = classes[kind](config).double().eval()
        state = load_file(str(HERE / "models" / kind / "model.safetensors"))
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected and all("position_ids" in k for k in missing), (missing, unexpected)
        for name, options in CONFIGS.items():
            decompx = DecompXConfig(aggregation="vector", include_classifier_w_pooler=True, output_all_layers=False,
                                    output_classifier=True, **options)
            maps, logits = [], []
            for sentence in ids[kind]:
                batch = {"input_ids": torch.tensor([sentence]),
                         "attention_mask": torch.ones(1, len(sentence), dtype=torch.long)}
                with torch.no_grad():
                    out = model(**batch, return_dict=False, decompx_config=decompx)
                logits.append(out[0][0].clone())
                maps.append(out[-1].classifier[0].clone())        # [N, C]
            goldens[f"{kind}_{name}"] = maps
            goldens[f"{kind}_logits"] = logits
    torch.save(goldens, HERE / "goldens.pt")
    (HERE / "REFERENCE.json").write_text(json.dumps({
        "repository": "mohsenfayyaz/DecompX", "commit": COMMIT, "reference_transformers": transformers.__version__,
        "torch": torch.__version__, "dtype": "float64", "configs": CONFIGS,
        "cases": {k: len(v) for k, v in goldens.items() if not k.endswith("_ids")},
    }, indent=2) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "models":
        make_models()
    else:
        make_goldens(sys.argv[2])
