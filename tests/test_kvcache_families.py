"""Passkey prompt families (filler, running text, code-like lists; with and without the chat template), chunked greedy
answers against ``generate()``, calibration over several families, and ``measure_policy``."""

from __future__ import annotations

import re

import pytest
import torch

from headwise import HeadwiseError
from headwise.kvcache import KVPolicy, ScoreConfig, apply_kv_policy, head_scores, remove_kv_policy, streaming
from headwise.kvcache.measure import measure_policy
from headwise.kvcache.passkey import (FILLER, HAYSTACKS, NEEDLE, PromptFamily, family_prompts, greedy_continuation,
                                      passkey_accuracy, passkey_prompts, text_sentences)
from test_kvcache_scores import char_tokenizer, tiny_lm, assert_held, spare_bytes

TEXT = " ".join(f"Sentence number {i} talks about topic {i % 7}." for i in range(200))
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def chat_tokenizer():
    tok = char_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


@pytest.mark.parametrize("haystack", HAYSTACKS)
@pytest.mark.parametrize("chat", [True, False])
def test_every_family_hides_the_key_at_its_depth(haystack, chat):
    tok = chat_tokenizer()
    prompts = family_prompts(tok, PromptFamily(haystack, chat), 800, [0.0, 0.5, 1.0], 2, seed=7, text=TEXT)
    assert len(prompts) == 6 and len({p.key for p in prompts}) == 6
    for p in prompts:
        text = tok.decode(p.ids)
        start, end = p.needle
        assert tok.decode(p.ids[start:end]) == " " + p.key
        assert 700 < len(p.ids) <= 800  # whole units up to the length
        assert text.startswith("<user>") == chat
        assert text.count(p.key) == 2  # the needle sentence names it twice, nothing else does
        # the needle's place in the haystack follows the depth
        hay_start = text.index("memorize it.") + len("memorize it.")
        hay_end = text.index("What is the pass key?")
        where = (text.index(NEEDLE.format(key=p.key)) - hay_start) / (hay_end - hay_start - len(NEEDLE) - 5)
        assert abs(where - p.depth) < 0.2
    hay = tok.decode(prompts[2].ids)
    if haystack == "filler":
        assert FILLER in hay
    elif haystack == "text":  # consecutive sentences of the given text
        found = re.findall(r"Sentence number (\d+)", hay)
        numbers = [int(n) for n in found]
        assert len(numbers) > 5 and all(b - a in (1, -199) for a, b in zip(numbers, numbers[1:]))
    else:
        assert len(re.findall(r"item_\d{4} = \d+\.\d+(, \d+\.\d+)+", hay)) > 5 and "grass" not in hay


def test_families_are_seeded_and_filler_is_the_default():
    tok = char_tokenizer()
    a = family_prompts(tok, PromptFamily("numbers"), 300, [0.5], 2, seed=3)
    b = family_prompts(tok, PromptFamily("numbers"), 300, [0.5], 2, seed=3)
    c = family_prompts(tok, PromptFamily("numbers"), 300, [0.5], 2, seed=4)
    assert [p.ids.tolist() for p in a] == [p.ids.tolist() for p in b] != [p.ids.tolist() for p in c]
    assert [p.ids.tolist() for p in family_prompts(tok, PromptFamily(), 300, [0.5], 2, seed=3)] == \
        [p.ids.tolist() for p in passkey_prompts(tok, 300, [0.5], 2, seed=3)]
    assert PromptFamily.parse("text-raw") == PromptFamily("text", False)
    assert PromptFamily.parse("filler").name == "filler" and PromptFamily("numbers", True).name == "numbers-chat"
    with pytest.raises(HeadwiseError, match="unknown haystack"):
        PromptFamily.parse("poems-chat")
    with pytest.raises(HeadwiseError, match="-chat or HAYSTACK-raw"):
        PromptFamily.parse("text-html")
    with pytest.raises(HeadwiseError, match="needs running text"):
        family_prompts(tok, PromptFamily("text"), 300, [0.5], 1)
    assert text_sentences("One. Two? Three!\nFour") == ["One. ", "Two? ", "Three! ", "Four "]


def test_chunked_greedy_answers_equal_generate():
    """``greedy_continuation`` (generate with the prompt prefilled in chunks through the policy's cache) gives what
    ``generate()`` with the policy's default chunking gives, with a full and with a streaming policy."""
    model, tok = tiny_lm(), char_tokenizer()
    prompts = family_prompts(tok, PromptFamily("text", False), 150, [0.3, 0.9], 1, seed=2, text=TEXT)
    for policy in (KVPolicy.uniform(model), KVPolicy.keep_full(model, {(1, 0)}, 2, 9)):
        apply_kv_policy(model, policy)
        for p in prompts:
            with torch.no_grad():
                ids = p.ids[None]
                expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                                          do_sample=False, pad_token_id=tok.eos_token_id)[0, ids.shape[1]:]
            for chunk in (7, 64, 1000):
                assert greedy_continuation(model, p.ids, 6, chunk).tolist() == expected.tolist()
        chunked = passkey_accuracy(model, tok, prompts, progress=False, prefill_chunk=16)
        assert chunked == passkey_accuracy(model, tok, prompts, progress=False)
        remove_kv_policy(model)
    with pytest.raises(HeadwiseError, match="prefill_chunk"):
        greedy_continuation(model, prompts[0].ids, 2, 0)


def test_scores_over_several_families_average_the_families():
    model, tok = tiny_lm(), chat_tokenizer()
    config = dict(length=160, depths=(0.2, 0.8), random_length=24, random_sequences=1)
    both = head_scores(model, tok, ScoreConfig(families=("filler", "numbers-raw"), **config), progress=False)
    one = head_scores(model, tok, ScoreConfig(families=("filler",), **config), progress=False)
    other = head_scores(model, tok, ScoreConfig(families=("numbers-raw",), **config), progress=False)
    for name in ("retrieval", "copy"):
        torch.testing.assert_close(both.scores[name], (one.scores[name] + other.scores[name]) / 2)
    assert both.counts["passkey"] == 4
    text = head_scores(model, tok, ScoreConfig(families=("text-chat",), **config), progress=False,
                       haystack_text=TEXT)
    assert not torch.equal(text.scores["retrieval"], one.scores["retrieval"])
    with pytest.raises(HeadwiseError, match="needs running text"):
        head_scores(model, tok, ScoreConfig(families=("text",), **config), progress=False)


def test_measure_policy_reports_the_bytes_the_policy_counts():
    model, tok = tiny_lm(), char_tokenizer()
    policy = KVPolicy.keep_full(model, {(0, 1)}, 2, 20)
    ids = passkey_prompts(tok, 150, [0.5], 1)[0].ids
    got = measure_policy(model, ids, policy, new_tokens=5, repeats=2, pad_token_id=tok.eos_token_id)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    for name, rules in (("full", KVPolicy.uniform(model)), ("policy", policy)):
        row = got[name]
        assert row["tokens_held"] == len(ids) + 4  # the last new token is never fed back
        assert_held(row, rules, head_dim)
        assert row["prefill_s"] > 0 and row["decode_tokens_per_s"] > 0
        assert row["peak_memory_above_start"] is None or isinstance(row["peak_memory_above_start"], int)
    assert got["full"]["kv_bytes"] == KVPolicy.uniform(model).kv_bytes(len(ids) + 4, head_dim, 4)  # exact
    fraction = policy.kv_fraction(len(ids) + 4)
    assert fraction <= got["ratio"]["kv_bytes"] <= fraction + spare_bytes(policy, head_dim, 4) / got["full"]["kv_bytes"]
    assert set(got["ratio"]) == {"kv_bytes", "peak_memory_above_start", "prefill_s", "decode_tokens_per_s"}
    assert got["prompt_tokens"] == len(ids) and got["new_tokens"] == 5
    from headwise.kvcache import policy_of
    assert policy_of(model) is None  # the model is left as it was
    own = KVPolicy.uniform(model, streaming(2, 30))
    apply_kv_policy(model, own)
    measure_policy(model, ids, policy, new_tokens=2)
    assert policy_of(model) == own
    with pytest.raises(HeadwiseError, match="at least 2 new tokens"):
        measure_policy(model, ids, policy, new_tokens=1)
