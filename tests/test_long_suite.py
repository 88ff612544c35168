"""The long-context suite (task ``long``): deterministic samples, RULER's scorer against hand-worked answers, the
policy cache against a masked dense reference, forked caches, the resumable log, refusals in one line, and
``headwise eval long`` on a kv-policy, a gqa and a latent folder (tiny models)."""

from __future__ import annotations

import json
import random

import pytest
import torch
import transformers as tf
from transformers.cache_utils import DynamicCache

import headwise
from headwise import HeadwiseError
from headwise.cli import main
from headwise.conversion.cache import latent_cache
from headwise.kvcache import FULL, KVPolicy, PolicyCache, apply_kv_policy, streaming
from headwise.tasks import get_task
from headwise.tasks.corpus import train_tokenizer
from headwise.tasks.long import (LongContext, ResultLog, fork, greedy, paired_difference, prefill, run_sample,
                                 summarize)
from headwise.tasks.haystacks import Haystack, generated_sentence
from headwise.tasks.long_data import FAMILIES, TASKS, SuiteSpec, draw, parse_lengths, score_answer
from test_kvcache import reference_logits

LENGTH = 512


def corpus() -> list[str]:
    rng = random.Random(0)
    texts = [generated_sentence(rng) for _ in range(400)]
    texts += ["0123456789 abcdef-ABCDEFGHIJKLMNOPQRSTUVWXYZ ghijklmnopqrstuvwxyz .,:?!'\n" * 3]
    spec = SuiteSpec((LENGTH,), 1)
    plain = type("Bytes", (), {"chat_template": None, "__call__": lambda self, t, add_special_tokens=False:
                               {"input_ids": list(t.encode())}})()  # a tokenizer of bytes, to draw the prompts
    for task in TASKS:  # the prompts' own words (intros, questions, names, cities) in the vocabulary
        s = draw(plain, task, 4096, 0, spec)
        texts.append(bytes(s.context_ids).decode()[:3000])
        texts += [bytes(q.ids).decode() for q in s.questions]
    return texts


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(corpus(), vocab_size=400, min_frequency=1)


def causal_lm(tokenizer, seed: int = 0, kv_heads: int = 2) -> tf.PreTrainedModel:
    """A tiny random Llama over ``tokenizer``'s vocabulary, sharp attention so masks matter."""
    torch.manual_seed(seed)
    config = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv_heads,
                            intermediate_size=37, vocab_size=len(tokenizer), max_position_embeddings=4096,
                            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "q_proj.weight" in name or "k_proj.weight" in name:
                p.normal_(0.0, 0.5)
    return model


# ---- generation -------------------------------------------------------------------------------------------------

def test_samples_are_deterministic_for_a_seed_and_independent_of_the_count(tokenizer):
    spec = SuiteSpec((LENGTH, 1024), 2)
    for task in TASKS:
        a, b = draw(tokenizer, task, LENGTH, 1, spec), draw(tokenizer, task, LENGTH, 1, spec)
        assert a == b
        assert draw(tokenizer, task, LENGTH, 1, SuiteSpec((LENGTH,), 5)) == a  # the count does not change sample 1
        assert draw(tokenizer, task, LENGTH, 1, SuiteSpec((LENGTH,), 2, seed=7)) != a
        assert draw(tokenizer, task, LENGTH, 0, spec) != a
        for length in spec.lengths:
            s = draw(tokenizer, task, length, 0, spec)
            assert s.tokens <= length and len(s.context_ids) > length // 2  # fills the length, never beyond
            context = tokenizer.decode(list(s.context_ids))
            for q in s.questions:
                if task in ("niah_single", "niah_multi", "qa"):
                    assert all(e in context for e in q.expected)  # the needles are in the context
                elif task == "vt":
                    assert all(f"VAR {e}" in context for e in q.expected)


def test_needle_families_are_what_the_docs_say(tokenizer):
    spec = SuiteSpec((LENGTH,), 3)
    multi = [draw(tokenizer, "niah_multi", LENGTH, i, spec) for i in range(3)]
    assert all(len(s.questions) == 4 for s in multi)
    tags = {q.tag.split("-")[0] for s in multi for q in s.questions}
    assert tags == {"number", "word", "uuid"}
    assert all(sum(len(q.expected) == 2 for q in s.questions) == 1 for s in multi)  # one key has two values
    vt = draw(tokenizer, "vt", LENGTH, 0, spec)
    assert [len(q.expected) for q in vt.questions] == [5, 5]
    assert [len(q.expected) for q in draw(tokenizer, "cwe", LENGTH, 0, spec).questions] == [5]
    assert [q.match for q in draw(tokenizer, "qa", LENGTH, 0, spec).questions] == ["any"] * 4
    assert set(FAMILIES.values()) == {"retrieval", "multi-hop", "aggregation", "qa"}


def test_haystack_from_a_file(tokenizer, tmp_path):
    text = tmp_path / "hay.txt"
    text.write_text("The cat sat on the mat. " * 4 + "A storm rolled in from the west! Where did it go? " * 30)
    hay = Haystack.of(str(text))
    assert "sha256" in hay.source and str(text) in hay.source
    s = draw(tokenizer, "niah_single", LENGTH, 0, SuiteSpec((LENGTH,), 1, haystack=hay))
    assert "storm" in tokenizer.decode(list(s.context_ids))


def test_without_a_chat_template_prompts_are_plain_text_and_with_one_they_use_it(tokenizer):
    spec = SuiteSpec((LENGTH,), 1)
    plain = draw(tokenizer, "qa", LENGTH, 0, spec)
    assert tokenizer.decode(list(plain.context_ids), skip_special_tokens=True).startswith("The following text")
    assert tokenizer.decode(list(plain.questions[0].ids)).endswith("lives in")
    chat = train_tokenizer(corpus() + ["<user> </user> <assistant>"], vocab_size=400, min_frequency=1)
    chat.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
                          "{% if add_generation_prompt %}<assistant>{% endif %}")
    turn = draw(chat, "qa", LENGTH, 0, spec)
    assert chat.decode(list(turn.context_ids)).replace(" ", "").startswith("<user>Thefollowingtext")
    assert "</user><assistant>" in chat.decode(list(turn.questions[0].ids)).replace(" ", "")


# ---- scoring ------------------------------------------------------------------------------------------------------

def test_scorer_matches_hand_worked_answers():
    assert score_answer(" 1234567 and 7654321.", ("1234567", "7654321")) == 1.0
    assert score_answer("The values are 1234567", ("1234567", "7654321")) == 0.5
    assert score_answer("BRIGHT-lantern", ("bright-lantern",)) == 1.0  # case-insensitive
    assert score_answer("ABCDE\x00, FGHIJ", ("abcde", "fghij", "klmno")) == pytest.approx(2 / 3)
    assert score_answer("Lyon or Porto", ("Porto", "Oporto"), "any") == 1.0
    assert score_answer("Lyon", ("Porto",), "any") == 0.0
    with pytest.raises(HeadwiseError, match="use 'all' or 'any'"):
        score_answer("x", ("x",), "some")


def record(task, length, index, score, key=None):
    return {"key": key or f"{task}/{length}/{index}", "task": task, "length": length, "index": index, "score": score,
            "kv_bytes": 100, "questions": [{}]}


def test_macro_average_and_intervals_match_a_hand_computed_table():
    records = [record("niah_single", 512, 0, 100), record("niah_single", 512, 1, 50),
               record("vt", 512, 0, 20), record("vt", 512, 1, 40),
               record("niah_single", 1024, 0, 0), record("vt", 1024, 0, 60)]
    out = summarize(records)
    # cells: niah 512 → 75, vt 512 → 30, niah 1k → 0, vt 1k → 60; macro = (75 + 30 + 0 + 60) / 4
    assert out["score"] == pytest.approx(41.25)
    assert out["tasks"] == {"niah_single": pytest.approx(37.5), "vt": pytest.approx(45.0)}
    assert out["lengths"] == {"512": pytest.approx(52.5), "1024": pytest.approx(30.0)}
    assert out["samples"] == {"niah_single": {"512": 2, "1024": 1}, "vt": {"512": 2, "1024": 1}}
    lo, hi = out["score_ci"]
    # the extremes of the resampled macro: cells at their lowest (50, 20) or highest (100, 40) sample
    assert (50 + 20 + 0 + 60) / 4 <= lo < out["score"] < hi <= (100 + 40 + 0 + 60) / 4
    same = paired_difference(records, records)
    assert same["difference"] == 0 and same["ci"] == [0, 0]
    shifted = [dict(r, score=r["score"] - 10) for r in records]
    assert paired_difference(records, shifted) == {"difference": pytest.approx(10), "ci": [pytest.approx(10)] * 2,
                                                   "samples": 6}


# ---- caches -------------------------------------------------------------------------------------------------------

def mixed_policy(model) -> KVPolicy:
    return KVPolicy(((FULL, streaming(2, 24)), (streaming(1, 40), streaming(4, 16))))


def test_policy_cache_answers_equal_the_masked_dense_reference(tokenizer):
    """Prefill + two questions batched from forks of one cache == greedy decoding where every step recomputes the
    whole sequence with eager attention masked per head by the policy (no cache at all)."""
    model = causal_lm(tokenizer)
    policy = mixed_policy(model)
    sample = draw(tokenizer, "qa", LENGTH, 0, SuiteSpec((LENGTH,), 1))
    headwise.enable(model)
    cache = PolicyCache(policy, length=LENGTH)
    context = torch.tensor([sample.context_ids])
    prefill(model, context, cache, 64)  # chunked: the rule holds for every query
    questions = sample.questions[:2]
    assert len({len(q.ids) for q in questions}) == 1
    got = greedy(model, fork(cache, 2, model), torch.tensor([q.ids for q in questions]), context.shape[1], [6, 6],
                 set())
    for q, tokens in zip(questions, got):
        seq = list(sample.context_ids) + list(q.ids)
        want = []
        for _ in range(6):
            ids = torch.tensor([seq])
            logits = reference_logits(model, policy, ids, torch.ones_like(ids))
            want.append(int(logits[0, -1].argmax()))
            seq.append(want[-1])
        assert tokens == want
    # the masks matter here: the full cache's reference answers differently
    ids = torch.tensor([list(sample.context_ids) + list(questions[0].ids)])
    assert not torch.allclose(reference_logits(model, policy, ids, torch.ones_like(ids))[0, -1],
                              reference_logits(model, KVPolicy.uniform(model), ids, torch.ones_like(ids))[0, -1])


@pytest.mark.parametrize("kind", ["dynamic", "policy", "latent"])
def test_fork_leaves_the_prefilled_cache_as_it_was(tokenizer, kind):
    model = causal_lm(tokenizer)
    if kind == "latent":
        headwise.convert_latent(model, kv_budget=0.5, init="svd", progress=False)
    headwise.enable(model)
    make = {"dynamic": lambda: DynamicCache(config=model.config), "policy": lambda: PolicyCache(mixed_policy(model)),
            "latent": lambda: latent_cache(model)}[kind]
    ids = torch.randint(3, len(tokenizer), (1, 120), generator=torch.Generator().manual_seed(0))
    question = torch.randint(3, len(tokenizer), (1, 9), generator=torch.Generator().manual_seed(1))
    cache = make()
    prefill(model, ids, cache)
    before = [t.clone() for layer in cache.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
    first = greedy(model, fork(cache, 1, model), question, 120, [8], set())
    again = greedy(model, fork(cache, 3, model), question.repeat(3, 1), 120, [8] * 3, set())
    after = [t for layer in cache.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert again == first * 3
    if kind == "policy":  # the same answer as generate() on context + question through the cache it builds
        apply_kv_policy(model, mixed_policy(model), prefill_chunk=None)
    whole = torch.cat([ids, question], 1)
    out = model.generate(whole, attention_mask=torch.ones_like(whole), max_new_tokens=8, do_sample=False)
    made = out[0, whole.shape[1]:].tolist()
    assert made == first[0][:len(made)]


# ---- the task, the log, refusals ------------------------------------------------------------------------------------

def test_resume_reads_done_samples_and_refuses_another_suite(tokenizer, tmp_path):
    model = causal_lm(tokenizer)
    task = LongContext(lengths=str(LENGTH), samples=1, tasks=("niah_single", "qa"))
    path = tmp_path / "samples.jsonl"
    made = []

    def counting(m, length):
        made.append(length)
        return DynamicCache(config=m.config)

    first = task.evaluate(model, tokenizer, log=task.log(path, model, "tiny"), make_cache=counting, progress=False)
    assert len(made) == 2
    with open(path, "a") as f:
        f.write('{"arm": "model", "key": "torn')  # a killed run's last line
    again = task.evaluate(model, tokenizer, log=task.log(path, model, "tiny"), make_cache=counting, progress=False)
    assert len(made) == 2 and again == first  # nothing run again, the torn line dropped
    assert all(json.loads(line) for line in path.read_text().splitlines())
    other = LongContext(lengths=str(LENGTH), samples=1, seed=1, tasks=("niah_single", "qa"))
    with pytest.raises(HeadwiseError, match="another suite or model"):
        other.log(path, model, "tiny")
    assert first["drawn_from"]["seed"] == task.seed and first["questions"] == 5


def test_a_run_over_several_haystacks_reports_each_and_their_macro_average(tokenizer, tmp_path, capsys):
    """``eval long --haystack generated,prose``: each haystack's scores are those of a run on it alone, and the
    run's score is their mean (the same tasks, lengths and counts on each)."""
    folder = tmp_path / "lm"
    headwise.save_pretrained(causal_lm(tokenizer), folder, tokenizer=tokenizer)
    common = ["eval", "long", "--model", str(folder), "--lengths", str(LENGTH), "--samples", "1", "--json"]
    alone = {}
    for name in ("generated", "prose"):
        assert main(common + ["--haystack", name]) == 0
        alone[name] = json.loads(capsys.readouterr().out)
        assert alone[name]["haystack"] == name and alone[name]["drawn_from"]["haystack_name"] == name
    assert main(common + ["--haystack", "generated,prose", "--out", str(tmp_path / "both")]) == 0
    both = json.loads(capsys.readouterr().out)
    assert list(both["haystacks"]) == ["generated", "prose"] and both["haystack"] == "generated,prose"
    for name in alone:
        assert both["haystacks"][name]["tasks"] == pytest.approx(alone[name]["tasks"])
        assert "CC BY-SA" in both["drawn_from"]["haystacks"]["prose"]["licence"]
    assert both["score"] == pytest.approx((alone["generated"]["score"] + alone["prose"]["score"]) / 2)
    assert main(common[:-1] + ["--haystack", "generated,prose", "--out", str(tmp_path / "both"), "--resume"]) == 0
    text = capsys.readouterr().out
    assert "macro-average over 2 haystacks" in text and "prose: " in text and "licence" in text


def test_bad_lengths_and_data_are_refused_in_one_line(tmp_path, capsys):
    assert parse_lengths("2k, 4096") == (2048, 4096)
    for bad in ("2q", "0", "", "2k,2k", "100"):
        with pytest.raises(HeadwiseError, match="--lengths"):
            parse_lengths(bad)
    with pytest.raises(HeadwiseError, match="--data .*no such file"):
        get_task("long", data=str(tmp_path / "missing.txt")).check()
    for args in (["--lengths", "2q"], ["--data", str(tmp_path / "missing.txt")], ["--samples", "0"],
                 ["--haystack", "essays"], ["--haystack", "prose", "--data", str(tmp_path / "missing.txt")]):
        code = main(["eval", "long", "--model", str(tmp_path / "never-loaded"), *args])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and args[0] in err[0]


def test_an_encoder_decoder_or_an_encoder_is_refused(tokenizer):
    from tiny import tiny_model, tiny_seq2seq

    with pytest.raises(HeadwiseError, match="decoder-only causal LMs; MarianMTModel is an encoder-decoder"):
        LongContext().check_model(tiny_seq2seq("marian"), tokenizer)
    with pytest.raises(HeadwiseError, match="needs a causal LM"):
        LongContext().check_model(tiny_model("bert"), tokenizer)
    with pytest.raises(HeadwiseError, match="evaluation suite"):
        LongContext().examples(tokenizer)


@pytest.fixture(scope="module")
def folders(tokenizer, tmp_path_factory):
    """The tiny Llama saved plain, with a KV policy, converted to GQA (1 KV head) and to latent K/V (half)."""
    root = tmp_path_factory.mktemp("long")
    out = {}
    for name in ("plain", "policy", "gqa", "latent"):
        model = causal_lm(tokenizer)
        if name == "policy":
            apply_kv_policy(model, KVPolicy.uniform(model, streaming(4, 60)))
        elif name == "gqa":
            headwise.convert_gqa(model, kv_heads=1, init="mean", progress=False)
        elif name == "latent":
            headwise.convert_latent(model, kv_budget=0.5, init="svd", progress=False)
        headwise.save_pretrained(model, root / name, tokenizer=tokenizer)
        out[name] = root / name
    return out


def test_eval_long_on_edited_folders(folders, capsys, tmp_path):
    results = {}
    for name, folder in folders.items():
        args = ["eval", "long", "--model", str(folder), "--lengths", str(LENGTH), "--samples", "1", "--json"]
        if name == "policy":
            args += ["--out", str(tmp_path / "run")]
        assert main(args) == 0
        results[name] = json.loads(capsys.readouterr().out)
    for name, result in results.items():
        assert result["measured"] == "cache" and set(result["tasks"]) == set(TASKS)
        assert 0 <= result["score"] <= 100 and result["questions"] == 13
        assert result["samples"] == {t: {str(LENGTH): 1} for t in TASKS}
    full = results["plain"]["kv_bytes"][str(LENGTH)]
    # what each cache really holds after the context: 64 of ~450 tokens per head; a third of the KV heads (grown
    # buffers: < 64 spare slots); half the values per token (< 16 spare slots)
    assert results["policy"]["kv_bytes"][str(LENGTH)] < 0.2 * full
    assert results["gqa"]["kv_bytes"][str(LENGTH)] == pytest.approx(full / 2, rel=0.02)
    assert results["latent"]["kv_bytes"][str(LENGTH)] == pytest.approx(full / 2, rel=0.1)
    assert (tmp_path / "run" / "report.html").is_file() and (tmp_path / "run" / "samples.jsonl").is_file()
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["score"] == results["policy"]["score"]
    code = main(["eval", "long", "--model", str(folders["policy"]), "--lengths", str(LENGTH), "--samples", "1",
                 "--out", str(tmp_path / "run")])
    assert code == 2 and "--resume" in capsys.readouterr().err  # an earlier run is not overwritten silently


def test_equal_bytes_baselines_and_the_verification_subset(tokenizer):
    from headwise.kvcache import HeadScores, equal_bytes_policies
    from headwise.tasks.long import verify_policy

    model = causal_lm(tokenizer)
    scores = HeadScores({"retrieval": torch.tensor([[0.1, 0.2, 0.9, 0.8], [0.3, 0.05, 0.4, 0.6]])}, [2, 2])
    arms = equal_bytes_policies(model, tokenizer, 0.625, scores, context=1024, sink=4, ranking="retrieval")
    at = {arm: p.kv_fraction(1024) for arm, p in arms.items()}
    assert at["streaming"] == pytest.approx(0.625, abs=1 / 1024)
    assert at["policy"] <= 0.625 and at["random"] == at["policy"] and at["layer"] <= 0.625
    # default window 156 at 0.625 × 1024: full heads hold 1, streaming ones 160/1024; (0.625·4 − 4·0.156)/0.844 → 2
    assert arms["policy"].full_heads() == [(0, 1), (1, 1)]  # the two best by retrieval (0.9, 0.6)
    assert len(arms["random"].full_heads()) == 2
    assert all(len(set(layer)) == 1 for layer in arms["layer"].heads)  # whole layers
    check = verify_policy(model, tokenizer, arms["streaming"], length=LENGTH, samples=1, progress=False)
    assert check["full"]["samples"] == check["policy"]["samples"] == {t: {str(LENGTH): 1}
                                                                    for t in ("niah_single", "niah_multi", "qa")}
    assert check["difference"]["samples"] == 3 and check["drawn_from"]["seed"] != 0
    assert check["policy"]["kv_bytes"][str(LENGTH)] < check["full"]["kv_bytes"][str(LENGTH)]


def test_a_narrower_window_keeps_more_heads_full_at_the_same_bytes(tokenizer):
    """``window=``: policy, random and layer take it; StreamingLLM still fills the budget with one window."""
    from headwise.kvcache import HeadScores, equal_bytes_policies
    from headwise.kvcache.choose import default_window

    model = causal_lm(tokenizer)
    scores = HeadScores({"retrieval": torch.tensor([[0.1, 0.2, 0.9, 0.8], [0.3, 0.05, 0.4, 0.6]])}, [2, 2])
    wide = equal_bytes_policies(model, tokenizer, 0.625, scores, context=1024, sink=4,
                                window=default_window(0.625, 1024, 4, share=3 / 4), ranking="retrieval")
    narrow = equal_bytes_policies(model, tokenizer, 0.625, scores, context=1024, sink=4, window=124,
                                  ranking="retrieval")
    # window 476: streaming heads hold 480/1024; (0.625·4 − 4·0.469)/0.531 → 1 full head
    assert wide["policy"].full_heads() == [(0, 1)]  # the KV head of query heads 2, 3 (retrieval 0.9)
    # window 124: streaming heads hold 128/1024; (0.625·4 − 4·0.125)/0.875 → 2 full heads
    assert narrow["policy"].full_heads() == [(0, 1), (1, 1)]  # the two best by retrieval (0.9, 0.6)
    assert len(wide["random"].full_heads()) == 1 and len(narrow["random"].full_heads()) == 2
    for arm in ("policy", "random", "layer"):
        assert narrow[arm].kv_fraction(1024) <= 0.625
        assert {c.at(1024).window for layer in narrow[arm].heads for c in layer if not c.full} <= {124}
    assert narrow["streaming"] == wide["streaming"]
    with pytest.raises(HeadwiseError, match="window share=1.5"):  # wider than the budget: refused, not a full cache
        default_window(0.625, 1024, 4, share=1.5)


def test_a_latent_cache_holds_no_weights(tokenizer):
    """Issue 49 item 4: every byte the latent cache object holds is a latent, a rotary row or a position (and the
    positions' cos/sin table); the decoders in head layout live once on the model, the values' is the weight."""
    from headwise.conversion.cache import LatentLayer
    from headwise.tasks.long import held_bytes

    model = causal_lm(tokenizer)
    headwise.convert_latent(model, kv_budget=0.5, rope_pairs=1, init="svd", progress=False)
    headwise.enable(model)
    ids = torch.randint(3, len(tokenizer), (1, 100), generator=torch.Generator().manual_seed(0))
    caches = []
    for _ in range(2):
        cache = latent_cache(model)
        prefill(model, ids, cache)
        greedy(model, cache, ids[:, :3], 100, [4], set())
        caches.append(cache)
    cache = caches[0]
    table = cache.positions.table
    positions = cache.positions.ids.untyped_storage().nbytes() + sum(t.untyped_storage().nbytes() for t in table[1:])
    index = sum(layer.rope_dims.untyped_storage().nbytes() for layer in cache.layers)  # which rows are rotary
    assert held_bytes(cache) == cache.stored_bytes() + positions + index
    attn = next(m for m in model.modules() if hasattr(m, "k_proj") and hasattr(m.k_proj, "head_rows"))
    assert attn.v_proj.head_rows() is attn.v_proj.up.weight  # values: the weight itself
    assert attn.k_proj.head_rows() is attn.k_proj.head_rows()  # keys: one head-layout copy for every cache
    assert not any(hasattr(layer, "_decoders") for layer in cache.layers if isinstance(layer, LatentLayer))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_policy_cache_forks_and_counts_its_bytes(tokenizer, dtype):
    model = causal_lm(tokenizer).to(dtype)
    headwise.enable(model)
    from headwise.tasks.long import held_bytes

    ids = torch.randint(3, len(tokenizer), (1, 90), generator=torch.Generator().manual_seed(0))
    cache = PolicyCache(mixed_policy(model))
    prefill(model, ids, cache, 32)
    assert held_bytes(cache) >= cache.stored_bytes() > 0  # + the padding rows and head indices it keeps
    before = [t.clone() for t in cache.layers[1].stored_tensors()]
    rows = greedy(model, fork(cache, 2, model), ids[:, :5].repeat(2, 1), 90, [5, 5], set())
    assert rows[0] == rows[1] and len(rows[0]) == 5
    assert all(torch.equal(a, b) for a, b in zip(before, cache.layers[1].stored_tensors()))


def test_kv_policy_checks_its_policy_with_the_suite_on_the_samples_eval_long_draws(tokenizer, tmp_path, capsys):
    """``headwise kv-policy``'s default check is the suite's retrieval and QA subset at --context tokens: its two
    arms are what ``headwise eval long`` scores on the same samples for the unedited folder and for the folder with
    the policy saved in it; a context below the suite's shortest prompt is refused before the model loads."""
    base = tmp_path / "lm"
    headwise.save_pretrained(causal_lm(tokenizer), base, tokenizer=tokenizer)
    args = ["kv-policy", "--model", str(base), "--kv-budget", "0.5", "--context", str(LENGTH), "--sink", "4",
            "--window", "60", "--samples", "1", "--no-perplexity", "--measure-new", "2"]
    assert main(args + ["--save-model", "--out", str(tmp_path / "kv")]) == 0
    summary = json.loads((tmp_path / "kv" / "summary.json").read_text())
    check, verified = summary["long_check"], ("niah_single", "niah_multi", "qa")
    assert "passkey_check" not in summary and summary["inputs"]["long_check"]["seed"] != 0  # not the calibration's
    assert check["full"]["samples"] == check["policy"]["samples"] == {t: {str(LENGTH): 1} for t in verified}
    assert "long-context check" in summary["verdict"]["quality"] and "with the full cache" in summary["verdict"]["quality"]
    for arm, folder in (("full", base), ("policy", tmp_path / "kv" / "model")):
        capsys.readouterr()
        assert main(["eval", "long", "--model", str(folder), "--lengths", str(LENGTH), "--samples", "1",
                     "--haystack", "prose", "--json"]) == 0
        scored = json.loads(capsys.readouterr().out)["tasks"]
        assert {t: check[arm]["tasks"][t] for t in verified} == pytest.approx({t: scored[t] for t in verified})
    assert check["difference"]["difference"] == pytest.approx(check["policy"]["score"] - check["full"]["score"])
    assert check["drawn_from"]["haystack_name"] == "prose" and list(check["haystacks"]) == ["prose"]
    kept = check["retention"]
    assert kept is None or kept == pytest.approx(check["policy"]["score"] / check["full"]["score"])
    assert "on prose:" in summary["verdict"]["quality"] and "retention" in summary["verdict"]["quality"]
    assert main(args[:5] + ["--context", "200", "--out", str(tmp_path / "short")]) == 2
    assert "--check passkey" in capsys.readouterr().err and not (tmp_path / "short").exists()
