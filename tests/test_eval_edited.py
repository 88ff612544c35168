"""``headwise eval`` sees a cache-only edit: ``eval lm`` on a folder saved with a KV policy measures through the
policy's cache (the number ``kv-policy`` itself reports), and says so; other tasks say their forward ignores it."""

from __future__ import annotations

import json

import pytest
import transformers as tf

import headwise
from headwise.cli import main
from headwise.kvcache import KVPolicy, apply_kv_policy, policy_forward, streaming
from headwise.tasks.lm import LanguageModeling
from test_kvcache_scores import saved_lm_and_text

LENGTH = "96"


@pytest.fixture
def folders(tmp_path):
    """The tiny Llama and its text; the same model saved with a policy that keeps 1 sink + 4 recent tokens on every
    KV head."""
    model, base, text = saved_lm_and_text(tmp_path)
    apply_kv_policy(model, KVPolicy.uniform(model, streaming(1, 4)))
    headwise.save_pretrained(model, tmp_path / "edited", tokenizer=tf.AutoTokenizer.from_pretrained(base))
    return base, tmp_path / "edited", text


def eval_lm(capsys, folder, text, *extra) -> dict:
    assert main(["eval", "lm", "--model", str(folder), "--data", str(text), "--max-length", LENGTH, *extra]) == 0
    return capsys.readouterr().out


def test_eval_lm_measures_through_the_policy_and_says_so(folders, capsys):
    base, edited, text = folders
    plain = json.loads(eval_lm(capsys, base, text, "--json"))
    through = json.loads(eval_lm(capsys, edited, text, "--json"))
    assert (plain["measured"], through["measured"]) == ("forward", "kv_policy")
    assert through["tokens"] == plain["tokens"]
    # 5 keys per head instead of up to 96 (a random model: near the vocabulary size either way, but not equal)
    assert through["perplexity"] != pytest.approx(plain["perplexity"], rel=1e-4)
    # the library's number: the same task, each window one prefill through the recorded policy (kv-policy's way)
    model, tokenizer = headwise.load_model(str(edited), task="lm")
    task = LanguageModeling(data=str(text), max_length=int(LENGTH))
    with policy_forward(model):
        expected = task.evaluate(model, tokenizer, progress=False)
    assert through["perplexity"] == pytest.approx(expected["perplexity"], rel=1e-6)
    assert task.evaluate(model, tokenizer, progress=False)["perplexity"] == pytest.approx(plain["perplexity"], rel=1e-6)
    assert "measured through the model's KV policy cache" in eval_lm(capsys, edited, text)
    assert "measured a full forward (the model as it computes)" in eval_lm(capsys, base, text)


def test_other_tasks_say_their_forward_ignores_the_policy(folders):
    from headwise.cli.eval import MEASURED, measured_way
    from headwise.tasks import get_task

    base, edited, text = folders
    model, _ = headwise.load_model(str(edited), task="lm")
    assert measured_way(model, get_task("classification", data=str(text))) == "kv_policy_ignored"
    assert "ignores the model's KV policy" in MEASURED["kv_policy_ignored"]
    assert measured_way(headwise.load_model(str(base), task="lm")[0], get_task("lm")) == "forward"
