"""Edited folders where users take them next: transformers' Auto classes and pipelines (``trust_remote_code=True``
through ``headwise.clients.auto``; without it a refusal naming the folder's custom code) and lm-eval's ``headwise``
model type (``headwise.clients.lm_eval``) on a pruned folder and on a KV-policy folder, with a tiny local task."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import transformers as tf

import headwise
from headwise.tasks.corpus import train_tokenizer
from test_kvcache import causal_lm, mixed_policy

WORDS = "the cat sat on mat dog tree one two three four five red green blue".split()
DOCS = [{"question": "the cat sat on the mat the dog sat on", "choices": [" the", " red", " five"], "answer": 0},
        {"question": "one two three four five one two three", "choices": [" four", " cat", " mat"], "answer": 0},
        {"question": "red green blue red green blue red green", "choices": [" blue", " one", " tree"], "answer": 0}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A pruned tiny Llama (one key/value group of layer 0 removed) with its plain/ export, and one with a KV policy
    (sink 2 + window 3 on most heads: contexts longer than that see less), each saved with a tokenizer."""
    root = tmp_path_factory.mktemp("clients")
    tokenizer = train_tokenizer([" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 5, vocab_size=90,
                                min_frequency=1)
    pruned = headwise.prune_heads(causal_lm("llama"), {"dec-self.0": [0, 1]})
    headwise.save_pretrained(pruned, root / "pruned", tokenizer=tokenizer)
    headwise.io.export_plain(pruned, root / "plain", tokenizer=tokenizer)
    policy = causal_lm("llama", seed=1)
    headwise.apply_kv_policy(policy, mixed_policy(policy))
    headwise.save_pretrained(policy, root / "kv", tokenizer=tokenizer)
    (root / "tiny.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    return root


IDS = torch.tensor([[5, 9, 12, 7, 30, 8, 11, 4, 19, 22, 6, 14]])


def test_plain_transformers_refuses_a_sealed_folder_naming_its_code_and_loads_it_when_trusted(folders):
    with pytest.raises(ValueError, match=f"{folders / 'pruned'} contains custom code"):
        tf.AutoModelForCausalLM.from_pretrained(folders / "pruned", trust_remote_code=False)
    assert "headwise.from_pretrained(folder)" in (folders / "pruned" / "load_with_headwise.py").read_text()
    ours = headwise.from_pretrained(folders / "pruned")
    loaded = tf.AutoModelForCausalLM.from_pretrained(folders / "pruned", trust_remote_code=True)
    assert type(loaded).__name__ == "LlamaForCausalLM" and tf.AutoConfig.from_pretrained(
        folders / "pruned", trust_remote_code=True).model_type == "llama"
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, ours(IDS).logits, atol=0, rtol=0)


def test_a_kv_policy_folder_generates_through_its_policy_in_plain_transformers_and_pipelines(folders):
    ours = headwise.from_pretrained(folders / "kv")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = tf.AutoModelForCausalLM.from_pretrained(folders / "kv", trust_remote_code=True,
                                                         dtype=torch.float32)
    assert any("carries a KV policy, which acts in generate()'s cache" in str(w.message) for w in caught)
    greedy = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    expected = ours.generate(IDS, **greedy)
    assert torch.equal(loaded.generate(IDS, **greedy), expected)
    full = headwise.remove_kv_policy(headwise.from_pretrained(folders / "kv"))
    assert not torch.equal(full.generate(IDS, **greedy), expected)  # the policy changes these tokens
    pipe = tf.pipeline("text-generation", model=str(folders / "kv"), trust_remote_code=True)
    prompt = "the cat sat on the mat the dog sat on the tree one two"
    tokenizer = pipe.tokenizer
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    text = pipe(prompt, max_new_tokens=8, do_sample=False, return_full_text=False)[0]["generated_text"]
    assert text == tokenizer.decode(ours.generate(ids, **greedy)[0, ids.shape[1]:], skip_special_tokens=True)


def tiny_task(folders) -> dict:
    return {"task": "headwise_tiny", "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": str(folders / "tiny.jsonl")}}, "test_split": "test",
            "output_type": "multiple_choice", "doc_to_text": "{{question}}", "doc_to_choice": "{{choices}}",
            "doc_to_target": "{{answer}}", "metric_list": [{"metric": "acc"}]}


def loglikelihoods(folders, model, **model_args) -> list[float]:
    """Each (document, choice)'s log-likelihood under lm-eval ``model`` (a type name or an ``LM``)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(model=model, model_args=model_args or None, tasks=[tiny_task(folders)],
                                  task_manager=TaskManager(include_defaults=False), device="cpu", log_samples=True)
    return [choice[0][0] for sample in out["samples"]["headwise_tiny"] for choice in sample["resps"]]


def test_lm_eval_headwise_model_on_a_pruned_folder_scores_as_its_plain_export(folders):
    import headwise.clients.lm_eval  # noqa: F401  (registers the model type "headwise")

    ours = loglikelihoods(folders, "headwise", pretrained=str(folders / "pruned"))
    plain = loglikelihoods(folders, "hf", pretrained=str(folders / "plain"))  # plain transformers, no headwise
    assert len(ours) == 9
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(plain), atol=1e-4, rtol=0)


def test_lm_eval_headwise_model_scores_a_kv_policy_folder_through_its_policy(folders):
    from lm_eval.models.huggingface import HFLM

    import headwise.clients.lm_eval  # noqa: F401
    from headwise.kvcache import policy_forward

    ours = loglikelihoods(folders, "headwise", pretrained=str(folders / "kv"))
    model, tokenizer = headwise.load_model(str(folders / "kv"), task="lm")
    with policy_forward(model):  # the reference: lm-eval's own HF model, every forward through the policy's cache
        reference = loglikelihoods(folders, HFLM(pretrained=model, tokenizer=tokenizer, backend="causal"))
    full = loglikelihoods(folders, "hf", pretrained=str(folders / "kv"), trust_remote_code=True)
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(reference), atol=1e-5, rtol=0)
    assert (torch.tensor(ours) - torch.tensor(full)).abs().max() > 1e-3  # a full forward scores something else


def test_lm_eval_command_line_with_the_headwise_model_type(folders, tmp_path):
    """``python -m headwise.clients.lm_eval``: lm-eval's own command line, the ``headwise`` model type known."""
    import os
    import subprocess
    import sys

    import yaml

    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "tiny.yaml").write_text(yaml.safe_dump(tiny_task(folders)))
    result = subprocess.run(
        [sys.executable, "-m", "headwise.clients.lm_eval", "--model", "headwise", "--model_args",
         f"pretrained={folders / 'kv'}", "--tasks", "headwise_tiny", "--include_path", str(tmp_path / "tasks"),
         "--device", "cpu", "--output_path", str(tmp_path / "results")], capture_output=True, text=True,
        timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "headwise_tiny" in result.stdout and "acc" in result.stdout
