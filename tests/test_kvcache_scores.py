"""Head scores for the KV cache against eager attention maps; budgets; the ``kv-policy`` command."""

from __future__ import annotations

import json
import string

import pytest
import torch
import transformers as tf
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

import headwise
from headwise import HeadwiseError
from headwise.cli import main
from headwise.kvcache import (KVPolicy, ScoreConfig, full_heads_for_budget, head_scores, kv_policy, passkey_prompts,
                              policy_of, rank_kv_heads)
from headwise.kvcache.passkey import passkey_accuracy
from headwise.kvcache.scores import repeated_tokens

CHARS = string.printable



def spare_bytes(rules: KVPolicy, head_dim: int, itemsize: int) -> int:
    """Most bytes a PolicyCache holds beyond the policy's count (``PolicyCache.stored_bytes``): one ring slot per
    streaming head, fewer than ``GROW`` spare slots per full head of a mixed layer; all-full layers hold exactly."""
    from headwise.kvcache.layer import GROW

    slots = sum(1 if not h.full else GROW - 1 for layer in rules.heads if not all(h.full for h in layer) for h in layer)
    return 2 * slots * head_dim * itemsize


def assert_held(row: dict, rules: KVPolicy, head_dim: int) -> None:
    count = rules.kv_bytes(row["tokens_held"], head_dim, 4)
    assert count <= row["kv_bytes"] <= count + spare_bytes(rules, head_dim, 4)


def char_tokenizer() -> tf.PreTrainedTokenizerFast:
    """One token per character (the 100 printable ASCII characters, then [UNK] and [EOS])."""
    vocab = {c: i for i, c in enumerate(CHARS)} | {"[UNK]": len(CHARS), "[EOS]": len(CHARS) + 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]")


def tiny_lm(family: str = "llama", attn: str = "headwise") -> tf.PreTrainedModel:
    torch.manual_seed(0)
    if family == "gpt2":
        config = tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=104, n_positions=512)
    else:
        config = tf.Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                intermediate_size=37, vocab_size=104, max_position_embeddings=512)
    return tf.AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()


CONFIG = ScoreConfig(length=160, depths=(0.2, 0.8), keys=1, random_length=24, random_sequences=2, sink=2, window=16)

def saved_lm_and_text(tmp_path) -> tuple:
    """A tiny Llama and its character tokenizer saved under ``tmp_path/lm``, and a calibration text file of 20
    repeated lines; returns ``(model, model folder, text file)``."""
    model, tok = tiny_lm(), char_tokenizer()
    model.save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    lines = [f"Line {i}: the quick brown fox jumps over the lazy dog. " * (2 + i % 3) for i in range(20)]
    (tmp_path / "calib.txt").write_text("\n".join(lines) + "\n")
    return model, tmp_path / "lm", tmp_path / "calib.txt"


def eager_maps(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """Attention maps ``[H, T, T]`` per layer from transformers' own eager attention."""
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return [a[0] for a in model(ids[None], output_attentions=True).attentions]
    finally:
        model.set_attn_implementation("headwise")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_scores_match_eager_attention_maps(family):
    model, tok = tiny_lm(family), char_tokenizer()
    texts = ["The quick brown fox jumps over the lazy dog. " * 5]
    scores = head_scores(model, tok, CONFIG, texts=texts, progress=False)
    heads = model.config.num_attention_heads
    # induction / echo by hand, from eager maps of the same repeated sequences
    n = CONFIG.random_length
    induction, echo = torch.zeros(2, heads), torch.zeros(2, heads)
    for ids in repeated_tokens(CONFIG, len(tok)):
        for layer, a in enumerate(eager_maps(model, ids)):
            for q in range(n + 1, 2 * n):
                induction[layer] += a[:, q, q - n + 1] / (n - 1) / CONFIG.random_sequences
                echo[layer] += a[:, q, q - n] / (n - 1) / CONFIG.random_sequences
    torch.testing.assert_close(scores.scores["induction"], induction, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(scores.scores["echo"], echo, atol=1e-5, rtol=1e-4)
    # retrieval: mass on the key's digits while predicting them; lookup: on the asked room while saying it
    from headwise.kvcache.lookup import lookup_prompts
    from headwise.kvcache.passkey import PromptFamily
    lookups = lookup_prompts(tok, PromptFamily(), CONFIG.length, list(CONFIG.depths), CONFIG.keys, CONFIG.facts,
                             CONFIG.seed)
    for name, prompts in (("retrieval", passkey_prompts(tok, CONFIG.length, list(CONFIG.depths), CONFIG.keys,
                                                        CONFIG.seed)), ("lookup", lookups)):
        mass = torch.zeros(2, heads)
        for p in prompts:
            ids = torch.cat([p.ids, p.answer_ids])
            start, end = p.needle
            assert tok.decode(p.ids[start:end]) == " " + p.key
            for layer, a in enumerate(eager_maps(model, ids)):
                rows = [len(p.ids) - 1 + k for k in range(len(p.answer_ids))]
                mass[layer] += a[:, rows, start:end].sum(-1).mean(-1) / len(prompts)
        torch.testing.assert_close(scores.scores[name], mass, atol=1e-5, rtol=1e-4)
    assert scores.counts["lookup"] == len(lookups) == len(CONFIG.depths) * CONFIG.keys
    # outside: mass a sink 2 + window 16 cache drops, over the queries that drop anything
    ids = tok(texts[0], add_special_tokens=False, return_tensors="pt")["input_ids"][0][: CONFIG.length]
    outside = torch.zeros(2, heads)
    for layer, a in enumerate(eager_maps(model, ids)):
        values = []
        for t in range(CONFIG.sink + CONFIG.window + 1, len(ids)):
            values.append(a[:, t, CONFIG.sink: t - CONFIG.window].sum(-1))
        outside[layer] = torch.stack(values).mean(0)
    torch.testing.assert_close(scores.scores["outside"], outside, atol=1e-5, rtol=1e-4)
    # per KV head: the max over its query heads
    kv = scores.kv("outside")
    group = heads // scores.kv_heads[0]
    assert torch.equal(kv, scores.scores["outside"].unflatten(1, (-1, group)).amax(-1))
    # observers are gone afterwards
    assert all(headwise.runtime.ops_of(s) is None for s in headwise.find_sites(model))


def test_budget_arithmetic():
    # 90 heads, 1024 tokens, 128 kept by streaming heads: F·1024 + (90 - F)·128 ≤ 0.5·90·1024 → F = 38
    assert full_heads_for_budget(90, 0.5, 1024, 4, 124) == 38
    assert full_heads_for_budget(90, 1.0, 1024, 4, 124) == 90
    assert full_heads_for_budget(8, 0.5, 100, 0, 200) == 8  # the window covers the context: nothing to save
    with pytest.raises(HeadwiseError, match="above kv_budget"):
        full_heads_for_budget(90, 0.1, 1024, 4, 124)
    with pytest.raises(HeadwiseError):
        full_heads_for_budget(90, 1.5, 1024, 4, 124)


def test_kv_policy_fits_the_budget_and_follows_the_ranking():
    model, tok = tiny_lm(), char_tokenizer()
    policy, scores = kv_policy(model, tok, kv_budget=0.6, context=160, sink=2, window=16, ranking="retrieval",
                               config=CONFIG, progress=False)
    n_full = full_heads_for_budget(4, 0.6, 160, 2, 16)
    assert n_full == 2 and len(policy.full_heads()) == n_full
    assert policy.kv_fraction(160) <= 0.6
    best = rank_kv_heads(scores, "retrieval")[:n_full]
    assert sorted(best) == policy.full_heads()
    value = scores.kv("retrieval")
    assert min(value[l, h] for l, h in best) >= max(value[l, h] for l, h in rank_kv_heads(scores, "retrieval")[n_full:])
    random_policy, _ = kv_policy(model, tok, 0.6, 160, 2, 16, ranking="random", progress=False)
    assert len(random_policy.full_heads()) == n_full
    with pytest.raises(HeadwiseError, match="unknown ranking"):
        kv_policy(model, tok, 0.6, 160, 2, 16, ranking="best", scores=scores)
    # a sum of scores: each over its largest KV head, by hand
    total = scores.kv("retrieval") / scores.kv("retrieval").max() + scores.kv("lookup") / scores.kv("lookup").max()
    order = [divmod(i, 2) for i in torch.argsort(total.flatten(), descending=True, stable=True).tolist()]
    assert rank_kv_heads(scores, "retrieval+lookup") == order == rank_kv_heads(scores, "lookup+retrieval")
    assert rank_kv_heads(scores, "copy+lookup")  # copy is 0 on every head of this model: no division by zero
    for bad, match in (("copy+best", "unknown ranking"), ("copy+outside", "needs the score")):
        with pytest.raises(HeadwiseError, match=match):
            rank_kv_heads(scores, bad)


def test_passkey_accuracy_counts_exact_matches():
    model, tok = tiny_lm(), char_tokenizer()
    prompts = passkey_prompts(tok, 120, [0.5], 2, seed=3)
    result = passkey_accuracy(model, tok, prompts, progress=False)
    expected = 0
    for p in prompts:
        with torch.no_grad():
            out = model.generate(p.ids[None], max_new_tokens=len(p.answer_ids), do_sample=False,
                                 pad_token_id=tok.eos_token_id)
        expected += tok.decode(out[0, len(p.ids):]).strip() == p.key
    assert result["correct"] == expected and result["prompts"] == 2


def test_kv_policy_command(tmp_path, capsys):
    model, _, _ = saved_lm_and_text(tmp_path)
    args = ["kv-policy", "--model", str(tmp_path / "lm"), "--kv-budget", "0.6", "--context", "160", "--sink", "2",
            "--window", "16", "--calibration-length", "160", "--data", str(tmp_path / "calib.txt"),
            "--eval-length", "100", "--prefill-chunk", "48", "--check", "passkey", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert list(summary)[0] == "verdict" and "policy.json" in summary["verdict"]["use"]
    assert summary["prefill_chunk"] == summary["measured"]["prefill_chunk"] == 48  # --prefill-chunk reached generate
    assert "prefill_chunk=48" in summary["verdict"]["use"]
    check = summary["passkey_check"]
    assert check["family"] == "text" and check["length"] > 0
    for arm in ("full", "policy"):
        assert check[arm]["prompts"] == 5 and isinstance(check[arm]["correct"], int)
        assert 0 <= check[arm]["correct"] <= 5
    # what generate() measured at --context tokens: the bytes each cache holds are the policy's count
    measured, written = summary["measured"], KVPolicy.load(tmp_path / "out")
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    for arm, rules in (("full", KVPolicy.uniform(model)), ("policy", written)):
        row = measured[arm]
        assert_held(row, rules, head_dim)
        assert row["prefill_s"] > 0 and row["decode_tokens_per_s"] > 0 and "peak_memory_above_start" in row
    assert measured["prompt_tokens"] > 0 and measured["new_tokens"] == 32
    assert measured["full"]["tokens_held"] == measured["prompt_tokens"] + 31
    fraction = written.kv_fraction(measured["full"]["tokens_held"])
    assert fraction <= measured["ratio"]["kv_bytes"] <= fraction + spare_bytes(written, head_dim, 4) / measured["full"][
        "kv_bytes"]
    assert "decode" in summary["verdict"]["measured"] and "KV held" in summary["verdict"]["measured"]
    assert summary["calibration_families"] == ["filler"]
    # perplexity on the lm task's last 10% of lines, through the full cache and through the policy
    task = headwise.tasks.get_task("lm", data=str(tmp_path / "calib.txt"), max_length=160)
    saved = tf.AutoTokenizer.from_pretrained(tmp_path / "lm")  # the command reads the saved tokenizer
    assert summary["perplexity"]["full"]["perplexity"] == pytest.approx(task.evaluate(model, saved)["perplexity"],
                                                                       rel=1e-4)
    with headwise.kvcache.policy_forward(model, KVPolicy.load(tmp_path / "out")):
        through = task.evaluate(model, saved)["perplexity"]
    assert through != pytest.approx(task.evaluate(model, saved)["perplexity"], rel=1e-4)
    assert summary["perplexity"]["policy"]["perplexity"] == pytest.approx(through, rel=1e-4)
    assert "perplexity" in summary["verdict"]["quality"]
    html = (tmp_path / "out" / "report.html").read_text()
    assert "KV cache policy" in html and "induction" in html and summary["verdict"]["memory"] in html
    assert "decode tokens/s" in html and "passkeys found" in html
    policy = KVPolicy.load(tmp_path / "out")
    assert len(policy.full_heads()) == 2 and summary["kv_fraction"] <= 0.6
    fresh = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "lm", attn_implementation="headwise")
    headwise.apply_kv_policy(fresh, tmp_path / "out" / "policy.json")
    assert policy_of(fresh) == policy
    assert summary["metric_before"] == summary["perplexity"]["full"]["perplexity"]
    assert summary["metric_edited"] == summary["perplexity"]["policy"]["perplexity"]
    assert summary["metric_recovered"] is None and summary["costs"]["before"] == summary["costs"]["after"]
    assert not (tmp_path / "out" / "model").exists()  # only with --save-model
    assert main(args) == 2  # a non-empty output folder needs --force
    assert "--force" in capsys.readouterr().err
    assert main(args + ["--force", "--save-model", "--vllm", "--no-measure", "--no-perplexity"]) == 0
    reloaded = headwise.from_pretrained(tmp_path / "out" / "model")
    assert policy_of(reloaded) == KVPolicy.load(tmp_path / "out")
    # --vllm: the policy for vLLM's plugin (Qwen2), windows counting the query (16 + 1), the 2 sink tokens dropped
    said = capsys.readouterr().out
    assert "headwise-vllm plugin" in said and "2 sink tokens" in said
    served = json.loads((tmp_path / "out" / "vllm" / "config.json").read_text())
    assert served["architectures"] == ["HeadwiseQwen2ForCausalLM"] and served["headwise_kv_policy"]["dropped_sink"] == 2
    assert served["headwise_kv_policy"]["sliding_window"] == [[None if rule.full else 17 for rule in layer]
                                                              for layer in policy.heads]
    bad = args[:4] + ["1.7"] + args[5:-1] + [str(tmp_path / "other")]
    assert main(bad) == 2 and not (tmp_path / "other").exists()
    assert main(["kv-policy", "--model", str(tmp_path / "missing"), "--data", str(tmp_path / "calib.txt"), "--out",
                 str(tmp_path / "x")]) == 2  # the data is there: the model path is what is wrong
    assert "does not exist" in capsys.readouterr().err
    assert main(args[:-1] + [str(tmp_path / "t"), "--task", "translation"]) == 2
    err = capsys.readouterr().err  # refused before any work: lm is the only task it measures
    assert "--task translation" in err and "lm task only" in err and not (tmp_path / "t").exists()
    assert main(args[:-1] + [str(tmp_path / "c"), "--prefill-chunk", "-1"]) == 2
    assert "--prefill-chunk: -1 is out of range" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_passkey_prompt_uses_the_chat_template():
    """With a chat template the haystack sits in one user turn and the assistant turn starts with the answer's
    prefix; without one the raw text ends with the question and that prefix. The needle span is the key either way."""
    from headwise.kvcache.passkey import ANSWER, FILLER, QUESTION, frame
    tok = char_tokenizer()
    raw = passkey_prompts(tok, 600, [0.5], 1, seed=1)[0]
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    chat = passkey_prompts(tok, 600, [0.5], 1, seed=1)[0]
    assert raw.key == chat.key
    raw_text, chat_text = tok.decode(raw.ids), tok.decode(chat.ids)
    assert raw_text.endswith(QUESTION.strip() + " " + ANSWER) and "<user>" not in raw_text  # "\n" is [UNK] here
    assert chat_text.startswith("<user>There is an important pass key")
    assert chat_text.endswith("</user><assistant>" + ANSWER)
    assert passkey_prompts(tok, 600, [0.5], 1, seed=1, chat=False)[0].ids.tolist() == raw.ids.tolist()
    for p in (raw, chat):
        start, end = p.needle
        assert tok.decode(p.ids[start:end]) == " " + p.key
        assert 600 - len(FILLER) < len(p.ids) <= 600  # whole filler sentences up to the length
    before, after = frame(tok)
    assert before.startswith("<user>") and after.endswith("<assistant>" + ANSWER)


def test_place_needles_puts_each_needle_at_its_depth_and_scores_it():
    """Several needles among whole filler units, each after the text ``place_needles`` reports (ordered by depth,
    the prompt within its length), in another wording's frame; ``needle_scores`` adds the mass on a needle's span
    (the eager reference) to the named total only."""
    import random

    from headwise.kvcache.passkey import FILLER, Passkey, Wording, frame, haystack_units, place_needles
    from headwise.kvcache.scores import needle_scores
    tok = char_tokenizer()
    wording = Wording("Facts below.\n", "\nWhere is the cup?", " One word.", "The cup is in the")
    before, after = frame(tok, wording=wording)
    assert before == wording.intro and after == wording.question + " " + wording.answer  # no chat template
    needles = [(0.7, "The cup is in the attic. "), (0.2, "The pen is in the shed. "), (0.7, "The hat is here. ")]
    ids, heads = place_needles(tok, 400, before, after, needles, haystack_units("filler", random.Random(0)))
    text = tok.decode(ids)
    assert 400 - len(FILLER) < len(ids) <= 400 and text.startswith(before) and text.endswith(after)
    for head, (_, needle) in zip(heads, needles):
        assert text[len(head):].startswith(needle) and head.startswith(before)
    assert len(heads[1]) < len(heads[0]) < len(heads[2])  # by depth; a tie keeps the given order
    assert (len(heads[0]) - len(before)) / (len(text) - len(before) - len(after)) == pytest.approx(0.7, abs=0.1)
    model = tiny_lm()
    prefix = heads[0] + "The cup is in the"
    span = (len(tok(prefix)["input_ids"]), len(tok(prefix + " attic")["input_ids"]))
    answer = torch.tensor(tok(" attic")["input_ids"])
    probe = Passkey(torch.tensor(ids), "attic", answer, span, 0.7)
    total = {"lookup": torch.zeros(2, 4)}
    needle_scores(model, probe, total, mass="lookup", copy=None)
    rows = [len(ids) - 1 + k for k in range(len(answer))]
    reference = torch.stack([a[:, rows, span[0]:span[1]].sum(-1).mean(-1)
                             for a in eager_maps(model, torch.cat([probe.ids, answer]))])
    assert list(total) == ["lookup"] and tok.decode(probe.ids[span[0]:span[1]]) == " attic"
    torch.testing.assert_close(total["lookup"], reference, atol=1e-5, rtol=1e-4)


def test_lookup_prompts_ask_one_fact_among_look_alikes():
    """Fact-lookup prompts: ``facts`` facts each, the first asked, its room the answer and the needle; the same for
    a seed and different for another; no word of the long-context suite's QA (names, cities); bad counts refused."""
    from headwise.kvcache.lookup import FACT, ROOMS, lookup_prompts
    from headwise.kvcache.passkey import PromptFamily
    tok = char_tokenizer()
    prompts = lookup_prompts(tok, PromptFamily("numbers"), 500, [0.1, 0.9], 2, 3, seed=5)
    again = lookup_prompts(tok, PromptFamily("numbers"), 500, [0.1, 0.9], 2, 3, seed=5)
    other = lookup_prompts(tok, PromptFamily("numbers"), 500, [0.1, 0.9], 2, 3, seed=6)
    assert [p.ids.tolist() for p in prompts] == [p.ids.tolist() for p in again]
    assert [p.ids.tolist() for p in prompts] != [p.ids.tolist() for p in other]
    assert len(prompts) == 4 and [p.depth for p in prompts] == [0.1, 0.1, 0.9, 0.9]
    for p in prompts:
        text = tok.decode(p.ids)
        asked = text.rsplit("Where is the ", 1)[1].split(" kept?")[0]
        assert text.count(" is kept in the") == 3 + 1 and p.key in ROOMS and len(p.ids) <= 500
        assert FACT.format(thing=asked, room=p.key) in text and tok.decode(p.answer_ids) == " " + p.key
        assert tok.decode(p.ids[p.needle[0]:p.needle[1]]) == " " + p.key
        assert "lives in" not in text and "In which city" not in text  # the suite's QA wording
    for facts in (0, len(ROOMS) + 1):
        with pytest.raises(HeadwiseError, match="per lookup prompt"):
            lookup_prompts(tok, PromptFamily(), 500, [0.5], 1, facts)


def test_default_window_and_ranking():
    """Without a window, streaming heads get a quarter of the per-head budget (sink + window = 1/4 · budget · context)
    and heads are ranked by retrieval + lookup; `outside` on prompts no longer than the window is refused, naming the
    fix."""
    from headwise.kvcache.choose import calibration_length, default_window
    assert default_window(0.5, 2048, 4) == 252 and default_window(0.5, 1024, 4) == 124
    assert default_window(0.5, 2048, 4, share=3 / 4) == 764
    assert full_heads_for_budget(90, 0.5, 2048, 4, default_window(0.5, 2048, 4)) == 38  # (0.5·90·2048 − 90·256) / 1792
    with pytest.raises(HeadwiseError, match="no window"):
        default_window(0.01, 100, 4)
    model, tok = tiny_lm(), char_tokenizer()
    config = ScoreConfig(length=160, depths=(0.2, 0.8), random_length=24, sink=2, window=88)
    policy, scores = kv_policy(model, tok, kv_budget=0.75, context=160, sink=2, config=config, progress=False)
    assert {rule.window for layer in policy.heads for rule in layer if rule.window} == {28}  # 1/4 · 0.75 · 160 − 2
    assert len(policy.full_heads()) == full_heads_for_budget(4, 0.75, 160, 2, 28) == 2
    assert sorted(rank_kv_heads(scores, "retrieval+lookup")[:2]) == policy.full_heads()
    assert "outside" not in scores.scores  # the default ranking needs no calibration text
    assert calibration_length("retrieval+lookup", 4, 508) == 512 and calibration_length("combined", 4, 508) == 1024
    assert calibration_length("copy+outside", 4, 508) == 1024
    no_lookup = head_scores(model, tok, ScoreConfig(length=160, depths=(0.5,), facts=0, random_length=24),
                            progress=False)
    assert "lookup" not in no_lookup.scores and no_lookup.counts["lookup"] == 0
    with pytest.raises(HeadwiseError, match="lookup needs ScoreConfig.facts"):
        kv_policy(model, tok, 0.75, 160, 2, scores=no_lookup, progress=False)
    with pytest.raises(HeadwiseError, match="calibration-length"):
        kv_policy(model, tok, 0.5, 160, 2, 38, ranking="combined", texts=["abc " * 100],
                  config=ScoreConfig(length=40, sink=2, window=38), progress=False)


def test_kv_policy_command_without_measuring(tmp_path):
    """``--no-measure`` skips generate(): no measurements, no passkey check; a bad family is refused up front."""
    saved_lm_and_text(tmp_path)
    args = ["kv-policy", "--model", str(tmp_path / "lm"), "--kv-budget", "0.6", "--context", "160", "--sink", "2",
            "--window", "16", "--data", str(tmp_path / "calib.txt"), "--no-perplexity",
            "--calibration-families", "numbers,text-raw", "--check", "passkey", "--out", str(tmp_path / "out")]
    assert main(args + ["--no-measure"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["measured"] is None and summary["passkey_check"] == {}
    assert "--no-measure" in summary["verdict"]["measured"] and "not measured" in summary["verdict"]["quality"]
    assert summary["calibration_families"] == ["numbers", "text-raw"] and summary["calibration"]["passkey"] == 10
    assert main(args[:-1] + [str(tmp_path / "bad"), "--eval-family", "poems"]) == 2
    assert not (tmp_path / "bad").exists()
