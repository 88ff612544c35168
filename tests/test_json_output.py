"""Every JSON headwise writes is valid JSON: a NaN or infinity is refused with one line naming where it sits, never
written as a bare ``NaN``/``Infinity`` token; a model that computes a non-finite metric is refused too."""

import json
import math

import pytest
import torch
import transformers as tf

from headwise.cli import main
from headwise.cli.output import write_json
from headwise.errors import HeadwiseError
from headwise.io.json_text import json_text, non_finite
from headwise.tasks import LanguageModeling, train_tokenizer
from tiny import VOCAB

WORDS = "the a cat dog sat on mat ran to house big small red blue tree sun".split()


def sentence(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(6 + i % 3))


def test_json_text_refuses_non_finite_numbers_with_their_path(tmp_path):
    value = {"a": [1, 2.5, {"b": "x"}], "points": [{"measured": {"score": 1.0}}, {"measured": {"score": -math.inf}}]}
    assert non_finite(value) == ("points[1].measured.score", -math.inf)
    with pytest.raises(HeadwiseError, match=r"summary.json: points\[1\]\.measured\.score is -inf, not a finite"):
        json_text(value, "summary.json")
    good = {"a": [1, 2.5, None, True], "b": {"c": "nan"}}
    assert json.loads(json_text(good, "x", indent=1)) == good
    with pytest.raises(HeadwiseError, match="nan"):
        write_json(tmp_path / "s.json", {"spearman": float("nan")})
    assert not (tmp_path / "s.json").exists()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("json-llama")
    tokenizer = train_tokenizer([sentence(i) for i in range(100)], vocab_size=60, min_frequency=1)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(tf.LlamaConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, intermediate_size=37,
        vocab_size=VOCAB, max_position_embeddings=64))
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    (root / "text.txt").write_text("\n".join(sentence(i) for i in range(40)) + "\n")
    return root, model, tokenizer


def test_a_nan_model_gives_no_perplexity(llama):
    root, model, tokenizer = llama
    task = LanguageModeling(data=str(root / "text.txt"), max_length=16)
    assert math.isfinite(task.evaluate(model, tokenizer, progress=False)["perplexity"])
    with torch.no_grad():
        model.model.norm.weight[0] = float("nan")
    try:
        with pytest.raises(HeadwiseError, match="perplexity came out nan"):
            task.evaluate(model, tokenizer, progress=False)
    finally:
        with torch.no_grad():
            model.model.norm.weight[0] = 1.0


def test_eval_json_refuses_a_nan_metric_and_prints_no_nan_token(llama, capsys, monkeypatch):
    root = llama[0]
    monkeypatch.setattr(LanguageModeling, "evaluate", lambda self, model, tokenizer, progress=None:
                        {"perplexity": float("nan"), "tokens": 3})
    argv = ["eval", "lm", "--model", str(root / "model"), "--data", str(root / "text.txt"), "--max-length", "16",
            "--json"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "NaN" not in out and "--json output: perplexity is nan" in err and len(err.strip().splitlines()) == 1


def test_a_nan_translation_model_gives_no_bleu(tmp_path):
    from headwise.tasks import SyntheticGrammar, Translation, write_corpus
    from tiny import tiny_seq2seq

    grammar = SyntheticGrammar(seed=1, nouns=20, adjectives=5, verbs=5)
    write_corpus(tmp_path, {"train": grammar.corpus("train", 20), "val": grammar.corpus("val", 4)})
    tokenizer = train_tokenizer([*grammar.corpus("train", 20).source, *grammar.corpus("train", 20).target],
                                vocab_size=60, min_frequency=1)
    model = tiny_seq2seq("marian", pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         decoder_start_token_id=tokenizer.pad_token_id).eval()
    task = Translation(data_dir=str(tmp_path), src="src", tgt="tgt", split="val", max_new_tokens=4, max_length=32)
    assert math.isfinite(task.evaluate(model, tokenizer, progress=False)["bleu"])
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if n.endswith("layer_norm.weight"))[0] = float("nan")
    with pytest.raises(HeadwiseError, match="translation: the model's outputs hold NaN"):
        task.evaluate(model, tokenizer, progress=False)
