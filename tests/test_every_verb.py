"""Every editing verb on every task, end to end, on tiny random models: stsb (BERT encoder), lm (a grouped-query
Llama), translation (Marian encoder-decoder) and classification (BERT with a classification head). Each cell runs the
verb through the command line with its default method settings, saves, reloads the saved model with
``headwise.from_pretrained`` and through the CLI's ``--model DIR`` (``headwise eval <task>``), and checks that all
three agree: the score the verb reported for its edited model, the reloaded model's score in Python and the CLI's.
``quantize`` writes a sweep, not a model: its baseline must equal the CLI's score of the unedited model."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
import transformers as tf

import headwise
from headwise.cli import main
from headwise.tasks import get_task, train_tokenizer
from tiny import VOCAB, tiny_seq2seq

WORDS = "the a cat dog sat on mat ran to house big small red blue tree sun".split()
GERMAN = "der die katze hund sass auf matte lief zum haus gross klein rot blau baum sonne".split()
TASKS = ("stsb", "lm", "translation", "classification")
VERBS = ("prune", "compress", "replace", "mix", "quantize", "plan-apply")


def sentence(i: int, words: list[str] = WORDS) -> str:
    return " ".join(words[(i * 7 + k * 3) % len(words)] for k in range(5 + i % 4))


def _tokenizer():
    texts = [sentence(i) for i in range(200)] + [sentence(i, GERMAN) for i in range(200)]
    tokenizer = train_tokenizer(texts, vocab_size=90, min_frequency=1)
    assert len(tokenizer) <= VOCAB
    return tokenizer


def _stsb(root: Path, tokenizer) -> tuple[Path, list[str]]:
    torch.manual_seed(0)
    config = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                           vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id)
    tf.BertModel(config).save_pretrained(root / "model")
    data = root / "stsb"
    data.mkdir()
    for split, n in (("train", 48), ("dev", 24)):
        rows = [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{(i * 37 % 51) / 10:.2f}\t{sentence(i)}\t{sentence(i + 3)}"
                for i in range(n)]
        (data / f"sts-{split}.tsv").write_text("\n".join(rows) + "\n")
    return root / "model", ["--data", str(data)]


def _lm(root: Path, tokenizer) -> tuple[Path, list[str]]:
    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                            head_dim=8, intermediate_size=37, vocab_size=VOCAB, max_position_embeddings=64)
    tf.LlamaForCausalLM(config).save_pretrained(root / "model")
    (root / "text.txt").write_text("\n".join(sentence(i) for i in range(80)) + "\n")
    return root / "model", ["--data", str(root / "text.txt"), "--max-length", "32"]


def _translation(root: Path, tokenizer) -> tuple[Path, list[str]]:
    model = tiny_seq2seq("marian", pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         decoder_start_token_id=tokenizer.pad_token_id)
    model.save_pretrained(root / "model")
    data = root / "parallel"
    data.mkdir()
    for split, n in (("train", 40), ("val", 12), ("test", 12)):
        for lang, words in (("de", GERMAN), ("en", WORDS)):
            with gzip.open(data / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("\n".join(sentence(i, words) for i in range(n)) + "\n")
    return root / "model", ["--data-dir", str(data), "--split", "test", "--max-new-tokens", "8", "--max-length", "32"]


def _classification(root: Path, tokenizer) -> tuple[Path, list[str]]:
    torch.manual_seed(0)
    config = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                           vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                           num_labels=2)
    tf.BertForSequenceClassification(config).save_pretrained(root / "model")
    rows = ["text,label"] + [f"{sentence(i)},{int('cat' in sentence(i))}" for i in range(60)]
    (root / "data.csv").write_text("\n".join(rows) + "\n")
    return root / "model", ["--data", str(root / "data.csv"), "--max-length", "32"]  # 64 positions: refused at 128


BUILD = {"stsb": _stsb, "lm": _lm, "translation": _translation, "classification": _classification}
# each verb's own arguments per task: the default method, small enough to run in seconds
SITE = {"stsb": "enc-self", "lm": "dec-self", "translation": "enc-self", "classification": "enc-self"}


def verb_argv(verb: str, task: str) -> list[str]:
    if verb == "prune":
        keep = {"lm": "6", "translation": "12"}.get(task, "5")  # translation: 6 sites keep one head each at least
        return ["prune", "--strategy", "importance", "--keep", keep, "--importance-examples", "8"]
    if verb == "compress":
        return ["compress", "--dk", "16", "--calibration-limit", "16", "--iterations", "2"]
    if verb == "replace":
        return ["replace", "local", "--arg", "window=4"] + (["--kinds", "enc-self"] if task == "translation" else [])
    if verb == "mix":  # grouped-query heads cannot be swapped one by one: the GQA model gets mixers, fine-tuned
        if task == "lm":
            return ["mix", "--mix-epochs", "0.2"]
        return ["mix", "--swap", f"{SITE[task]}.0:0 <-> {SITE[task]}.1:1"]
    if verb == "quantize":
        return ["quantize", "--quantizers", "log", "--bit-widths", "3,4", "--thresholds", "none", "--tolerance", "0.99",
                "--save-model"]
    raise KeyError(verb)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> dict[str, tuple[Path, list[str]]]:
    """Per task: the saved tiny model's folder and the task's data arguments."""
    root = tmp_path_factory.mktemp("every-verb")
    tokenizer = _tokenizer()
    out = {}
    for task, build in BUILD.items():
        (root / task).mkdir()
        model_dir, data = build(root / task, tokenizer)
        tokenizer.save_pretrained(model_dir)
        out[task] = (model_dir, ["--task", task, *data] if task != "stsb" else data)
    return out


def cli_json(argv: list[str], capsys) -> dict:
    capsys.readouterr()
    assert main(["--json", *argv]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def eval_argv(task: str, data: list[str]) -> list[str]:
    """``eval <task>`` with the task's data options (``--task`` is the sub-command there)."""
    options = [a for a in data if a not in ("--task", task)]
    return ["eval", task, *options]


def score_of(task: str, result: dict) -> float:
    return float(result["spearman"] if task == "stsb" else result[get_task(task, **_dummy(task)).metric])


def _dummy(task: str) -> dict:
    return {"data": "x.csv"} if task == "classification" else {}


def python_score(task: str, model_dir: Path, data: list[str]) -> float:
    """The reloaded model's score computed in Python: ``headwise.from_pretrained`` + the task's ``evaluate``."""
    model = headwise.from_pretrained(model_dir)
    tokenizer = tf.AutoTokenizer.from_pretrained(model_dir)
    flags = dict(zip(data[::2], data[1::2]))
    options = {k.lstrip("-").replace("-", "_"): v for k, v in flags.items() if k != "--task"}
    for name in ("max_length", "max_new_tokens"):
        if name in options:
            options[name] = int(options[name])
    return float(get_task(task, **options).evaluate(model, tokenizer, progress=False)[
        get_task(task, **options).metric])


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("task", TASKS)
def test_verb_saves_a_model_that_reloads_and_evaluates_with_the_same_task(tasks, task, verb, tmp_path, capsys):
    model_dir, data = tasks[task]
    base = score_of(task, cli_json([*eval_argv(task, data), "--model", str(model_dir)], capsys))
    out = tmp_path / "edited"
    if verb == "plan-apply":
        planned = cli_json(["plan", "--budget", "heads=0.75", "--model", str(model_dir), *data, "--limit", "12",
                            "--importance-examples", "8", "--calibration-limit", "8", "--repeats", "1", "--top-k", "1",
                            "--out", str(tmp_path / "plan")], capsys)
        assert planned["recommended"], planned
        summary = cli_json(["apply", str(tmp_path / "plan" / "plan.json"), "--out", str(out)], capsys)
        reported = None  # apply scores on the plan's own --limit 12 subset, not the data the eval below reads
    else:
        summary = cli_json([*verb_argv(verb, task), "--model", str(model_dir), *data, "--out", str(out)], capsys)
        recovered = summary.get("metric_recovered")
        reported = recovered if recovered is not None else summary.get("metric_edited")
    if verb == "quantize":  # the sweep's baseline is the unedited model; the saved setting is one within tolerance
        sign = 1 if get_task(task, **_dummy(task)).higher_is_better else -1  # the sweep maximises ±metric
        assert sign * summary["baseline"] == pytest.approx(base, abs=1e-6) == summary["metric_before"]
        assert summary["saved_setting"] in [r["label"] for r in summary["rows"] if r["within"]]
    edited = out / "model"
    assert (edited / "config.json").is_file()
    cli = score_of(task, cli_json([*eval_argv(task, data), "--model", str(edited)], capsys))
    python = python_score(task, edited, data)
    assert cli == pytest.approx(python, rel=1e-5, abs=1e-6)  # the CLI's --model DIR and from_pretrained agree
    if reported is not None:  # what the verb measured on its edited model is what the saved model scores
        assert cli == pytest.approx(float(reported), abs=0.011)
