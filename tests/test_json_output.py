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
