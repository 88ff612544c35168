"""The ``outside`` score's default calibration text (``kvcache.natural``): passages of Python's documentation and
standard-library source, measured like any text (against transformers' eager attention maps), never the prose the
long-context check judges on."""

from __future__ import annotations

import torch
from test_kvcache_scores import char_tokenizer, eager_maps, tiny_lm

from headwise.kvcache import ScoreConfig, kv_policy, rank_kv_heads
from headwise.kvcache.choose import NATURAL_RANKING, RANKINGS, calibrate, text_length
from headwise.kvcache.natural import CALIBRATION_SOURCES, natural_texts, source_text
from headwise.tasks.haystacks import PROSE_FILE, Haystack
from headwise.workflows.kv_policy import SuiteCheck

CONFIG = ScoreConfig(length=160, depths=(0.5,), keys=1, random_length=24, random_sequences=1, sink=2, window=16,
                     text_length=120)


def test_outside_on_natural_text_matches_eager_attention_maps():
    """With no texts, a ranking that reads 'outside' measures it on natural_texts: per query head, the mean over
    the queries that drop anything of the attention mass beyond sink 2 + window 16, by hand from eager maps."""
    model, tok = tiny_lm(), char_tokenizer()
    scores = calibrate(model, tok, NATURAL_RANKING, 2, 16, config=CONFIG, progress=False)
    texts = natural_texts(tok, CONFIG.text_length, seed=CONFIG.seed)
    assert len(texts) == 2 * len(CALIBRATION_SOURCES) == scores.counts["calibration"]
    expected = torch.zeros(2, model.config.num_attention_heads)
    for text in texts:
        ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
        assert len(ids) >= CONFIG.text_length
        ids = ids[: CONFIG.text_length]
        for layer, a in enumerate(eager_maps(model, ids)):
            queries = range(CONFIG.sink + CONFIG.window + 1, len(ids))
            expected[layer] += torch.stack([a[:, t, CONFIG.sink: t - CONFIG.window].sum(-1)
                                            for t in queries]).mean(0) / len(texts)
    torch.testing.assert_close(scores.scores["outside"], expected, atol=1e-5, rtol=1e-4)
    assert expected.min() > 0  # a random tiny model attends everywhere: the mass beyond the window is not 0
    # the ranking reads it: each score over its largest KV head, summed
    total = sum(scores.kv(n) / scores.kv(n).max() for n in ("retrieval", "lookup", "outside"))
    order = [divmod(i, 2) for i in torch.argsort(total.flatten(), descending=True, stable=True).tolist()]
    assert rank_kv_heads(scores, NATURAL_RANKING) == order and NATURAL_RANKING in RANKINGS
    policy, _ = kv_policy(model, tok, 0.6, 160, 2, 16, ranking=NATURAL_RANKING, scores=scores, progress=False)
    assert policy.full_heads() == sorted(order[: len(policy.full_heads())])


def test_given_texts_replace_the_natural_ones():
    model, tok = tiny_lm(), char_tokenizer()
    mine = ["the quick brown fox jumps over the lazy dog " * 4]
    given = calibrate(model, tok, NATURAL_RANKING, 2, 16, texts=mine, config=CONFIG, progress=False)
    assert given.counts["calibration"] == 1
    ids = tok(mine[0], add_special_tokens=False, return_tensors="pt")["input_ids"][0][: CONFIG.text_length]
    first = eager_maps(model, ids)[0]
    expected = torch.stack([first[:, t, 2: t - 16].sum(-1) for t in range(19, len(ids))]).mean(0)
    torch.testing.assert_close(given.scores["outside"][0], expected, atol=1e-5, rtol=1e-4)


def test_calibration_text_is_docs_and_code_never_the_checked_prose():
    """The passages come from the docs and code sources (the suite's docs and code haystacks read the same text),
    deterministically per seed; none is in the prose haystack, the long-context check's default family."""
    tok = char_tokenizer()
    assert "prose" not in CALIBRATION_SOURCES and SuiteCheck(2048).haystack == "prose"
    prose = PROSE_FILE.read_text(encoding="utf-8")
    texts = natural_texts(tok, 300, seed=3)
    assert texts == natural_texts(tok, 300, seed=3) and texts != natural_texts(tok, 300, seed=4)
    for name, passages in zip(CALIBRATION_SOURCES, (texts[:2], texts[2:])):
        whole = source_text(name)
        haystack = "".join(Haystack.of(name).sentences)
        for passage in passages:
            assert passage[:200] in whole + "\n" + whole and passage[:200] not in prose
            assert passage.split()[0] in haystack
    assert text_length(4, 252) == 1024 and text_length(4, 508) == 2048
