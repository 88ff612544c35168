import random

import pytest
import torch
import transformers as tf
from tiny import GateSum

from headwise import HeadwiseError, add_gates, enable
from headwise.tasks import BleuMetric, ParallelCorpus, SyntheticGrammar, corpus_bleu, read_corpus, write_corpus
from headwise.tasks.corpus import (ADJ_SUFFIX, DETERMINERS, OBJECT_PARTICLE, VERB_SUFFIX, Phrase, Sentence,
                                             token_alignment, train_tokenizer)
from headwise.pruning import L0Config, L0Penalty, L0Training, add_l0_gates, l0_gates
from headwise.sites import find_sites
from headwise.training import HeadwiseSeq2SeqTrainer, TranslationDataset, train_translation

GRAMMAR = SyntheticGrammar(seed=3, nouns=40, adjectives=15, verbs=10)


# ---- corpus ----------------------------------------------------------------------------------------------------
def test_synthetic_corpus_is_deterministic():
    a, b = GRAMMAR.corpus("train", 50), SyntheticGrammar(seed=3, nouns=40, adjectives=15, verbs=10).corpus("train", 50)
    assert a.source == b.source and a.target == b.target
    assert GRAMMAR.corpus("train", 10).source == a.source[:10]  # a prefix does not depend on the size
    assert SyntheticGrammar(seed=4, nouns=40, adjectives=15, verbs=10).corpus("train", 50).source != a.source
    assert GRAMMAR.corpus("test", 50).source != a.source


def test_synthetic_rules_on_a_hand_built_sentence():
    lex = GRAMMAR.lexicon
    noun = next(i for i, n in enumerate(lex.nouns) if n[2] == "f")
    subject = Phrase("noun", "f", "pl", noun=noun, adjectives=(0, 1), definite="indef")
    obj = Phrase("name", "m", "sg", word="Doriko")
    sentence = Sentence(subject, verb=2, tense="past", object=obj, preposition="in",
                        complement=Phrase("number", lex.nouns[1][2], "pl", noun=1, word="42"))
    adj = [lex.adjectives[i] for i in (0, 1)]
    assert GRAMMAR.source(sentence) == (f"some {adj[0][0]} {adj[1][0]} {lex.nouns[noun][0]}s {lex.verbs[2][0]}ed "
                                        f"Doriko in 42 {lex.nouns[1][0]}s .")
    # SOV, the noun before its adjectives, f.pl agreement on determiner, adjectives and verb; names/numbers copied
    assert GRAMMAR.target(sentence) == (f"unas {lex.nouns[noun][1]}en {adj[0][1]}as {adj[1][1]}as Doriko ko "
                                        f"42 {lex.nouns[1][1]}en ne {lex.verbs[2][1]}inas .")
    src, tgt = GRAMMAR.source(sentence).split(), GRAMMAR.target(sentence).split()
    pairs = {(src[i], tgt[j]) for i, j in GRAMMAR.alignment(sentence)}
    assert ("Doriko", "Doriko") in pairs and ("some", "unas") in pairs and (f"{lex.verbs[2][0]}ed", tgt[-2]) in pairs
    assert OBJECT_PARTICLE not in {t for _, t in pairs}


def test_synthetic_agreement_and_order_hold_on_random_sentences():
    rng = random.Random(0)
    for _ in range(300):
        s = GRAMMAR.sample(rng)
        src, tgt = GRAMMAR.source(s).split(), GRAMMAR.target(s).split()
        assert tgt[-1] == "." and tgt[-2].endswith(VERB_SUFFIX[s.tense, s.subject.gender, s.subject.number])
        assert tgt[-2].startswith(GRAMMAR.lexicon.verbs[s.verb][1])
        assert OBJECT_PARTICLE in tgt and tgt.index(OBJECT_PARTICLE) < len(tgt) - 2
        for phrase in (s.subject, s.object, s.complement):
            if phrase is None:
                continue
            if phrase.kind in ("name", "number"):
                assert phrase.word in src and phrase.word in tgt
            if phrase.kind == "name":
                assert phrase.gender == ("f" if phrase.word.endswith("a") else "m")
            if phrase.kind == "noun":
                words = GRAMMAR._target_phrase(phrase, "x")
                assert words[0][0] == DETERMINERS[phrase.definite, phrase.gender, phrase.number]
                assert all(w.endswith(ADJ_SUFFIX[phrase.gender, phrase.number]) for w, _ in words[2:])
                assert phrase.gender == GRAMMAR.lexicon.nouns[phrase.noun][2]
        assert len(GRAMMAR.alignment(s)) == len(tgt) - 1  # every target word but "ko"


def test_read_corpus_names_a_missing_or_misaligned_file(tmp_path):
    write_corpus(tmp_path, {"train": ParallelCorpus(["a b", "c"], ["x", "y z"])})
    assert read_corpus(tmp_path, "train").target == ["x", "y z"]
    with pytest.raises(HeadwiseError, match=r"dev\.src"):
        read_corpus(tmp_path, "dev")
    (tmp_path / "train.tgt").write_text("x\n")
    with pytest.raises(HeadwiseError, match=r"train\.src has 2 lines but .*train\.tgt has 1"):
        read_corpus(tmp_path, "train")
    (tmp_path / "test.src").write_text("a\n")
    with pytest.raises(HeadwiseError, match=r"test\.tgt"):
        read_corpus(tmp_path, "test")


def test_token_alignment_maps_words_to_subwords():
    corpus = GRAMMAR.corpus("dev", 20)
    tok = train_tokenizer(corpus.source + corpus.target, vocab_size=120, min_frequency=1)
    sentences = GRAMMAR.sentences("dev", 20)
    aligned = token_alignment(tok, corpus.head(2), [GRAMMAR.alignment(s) for s in sentences[:2]])
    tgt = tok(text_target=corpus.target[:2], padding=True)
    src = tok(corpus.source[:2], padding=True)
    assert aligned.shape == (2, len(tgt["input_ids"][0]), len(src["input_ids"][0]))
    ko = tok(text_target=[OBJECT_PARTICLE])["input_ids"][0][0]
    for b in range(2):
        for i, token in enumerate(tgt["input_ids"][b]):
            real = tgt["attention_mask"][b][i] and token != tok.eos_token_id
            assert bool(aligned[b, i].any()) == bool(real and token != ko), (b, i)
    # the final "." is aligned with the source "."
    dot = tgt["input_ids"][0].index(tok.eos_token_id) - 1
    assert aligned[0, dot].nonzero().flatten().tolist() == [src["input_ids"][0].index(tok.eos_token_id) - 1]


# ---- BLEU ------------------------------------------------------------------------------------------------------
def test_bleu_matches_sacrebleu_on_known_strings():
    assert corpus_bleu(["the cat sat on the mat ."], ["the cat sat on the mat ."]) == pytest.approx(100.0)
    # by hand: n-gram precisions 6/7, 4/6, 2/5, 1/4, no brevity penalty → (6/7·4/6·2/5·1/4)^(1/4) = 0.48892
    assert corpus_bleu(["the cat sat on the mat ."], ["the cat sat on a mat ."]) == pytest.approx(48.892, abs=1e-3)
    with pytest.raises(HeadwiseError, match="one reference per hypothesis"):
        corpus_bleu(["a"], ["a", "b"])


def test_bleu_metric_decodes_generated_ids_and_masked_labels():
    corpus = ParallelCorpus(["x"], ["the cat sat on the mat ."])
    tok = train_tokenizer(corpus.target + ["the cat sat on a mat ."], vocab_size=60, min_frequency=1)
    hyp = tok(["the cat sat on a mat ."], padding="max_length", max_length=12)["input_ids"]
    ref = tok(corpus.target, padding="max_length", max_length=12)["input_ids"]
    ref = [[t if t != tok.pad_token_id else -100 for t in row] for row in ref]
    pred = tf.EvalPrediction(predictions=torch.tensor(hyp).numpy(), label_ids=torch.tensor(ref).numpy())
    assert BleuMetric(tok)(pred)["bleu"] == pytest.approx(48.892, abs=1e-3)


# ---- trainer ---------------------------------------------------------------------------------------------------
def _tiny(tok, seed=0):
    torch.manual_seed(seed)
    config = tf.MarianConfig(vocab_size=len(tok), d_model=16, encoder_layers=2, decoder_layers=2,
                             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=24,
                             decoder_ffn_dim=24, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                             decoder_start_token_id=tok.pad_token_id)
    return enable(tf.MarianMTModel(config))


@pytest.fixture(scope="module")
def data():
    corpus = GRAMMAR.corpus("train", 32)
    return corpus, train_tokenizer(corpus.source + corpus.target, vocab_size=150, min_frequency=1)


def _args(tmp_path, batch, accumulation, **kw):
    return tf.Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=batch, max_steps=1,
        gradient_accumulation_steps=accumulation, learning_rate=0.1, optim="sgd", lr_scheduler_type="constant",
        max_grad_norm=0.0, report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True, data_seed=0,
        seed=0, **kw)


def _trainer(tmp_path, model, tok, corpus, penalties=(), batch=8, accumulation=1, **kw):
    # 8 pairs of 4 one-token words, the target reversed: every micro-batch has as many tokens as the big batch
    words = sorted(t[1:] for t in tok.get_vocab() if t.startswith("▁") and len(t) > 2)[:32]
    rows = [words[i:i + 4] for i in range(0, 32, 4)]
    equal = ParallelCorpus([" ".join(r) for r in rows], [" ".join(r[::-1]) for r in rows])
    assert len({len(ids) for ids in tok(equal.source + equal.target)["input_ids"]}) == 1
    trainer = HeadwiseSeq2SeqTrainer(
        model=model, args=_args(tmp_path, batch, accumulation, **kw), train_dataset=TranslationDataset(equal, tok),
        data_collator=tf.DataCollatorForSeq2Seq(tok, model=model, label_pad_token_id=-100), penalties=penalties)
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(trainer.train_dataset)
    return trainer


def test_penalty_is_added_to_the_seq2seq_loss_exactly(tmp_path, data):
    corpus, tok = data
    model = _tiny(tok)
    add_l0_gates(model, L0Config(kinds=["dec-enc"]))
    penalty = L0Penalty(model, L0Training(lam=0.05))
    batch = tf.DataCollatorForSeq2Seq(tok, model=model)([TranslationDataset(corpus, tok)[i] for i in range(4)])
    model.eval()  # deterministic gates (eval) and no dropout: both losses see the same forward
    torch.manual_seed(0)
    plain = _trainer(tmp_path / "a", model, tok, corpus).compute_loss(model, batch)
    torch.manual_seed(0)
    with_penalty = _trainer(tmp_path / "b", model, tok, corpus, [penalty]).compute_loss(model, batch)
    assert float(penalty(model).detach()) > 0
    torch.testing.assert_close(with_penalty - plain, penalty(model))


def test_l0_on_one_kind_trains_and_steps_the_dual_ascent(tmp_path, data):
    corpus, tok = data
    model = _tiny(tok)
    gates = add_l0_gates(model, L0Config(kinds=["dec-enc"]))
    assert {s.kind for s in find_sites(model) if s.path in gates} == {"dec-enc"}
    before = {p: g.log_alpha.detach().clone() for p, g in gates.items()}
    penalty = L0Penalty(model, L0Training(lam=0.0, target_heads=2, lambda_lr=0.5))
    trainer = train_translation(model, tok, corpus, max_steps=3, batch_size=8, learning_rate=1e-3, penalties=[penalty],
                                head_learning_rate=0.1, progress=False, logging_steps=1, use_cpu=True)
    assert penalty.steps == 3 and penalty.lam > 0  # 8 expected open heads > target 2: λ rose
    assert all(not torch.equal(before[p], g.log_alpha) for p, g in l0_gates(model).items())
    assert any("l0_lambda" in row for row in trainer.state.log_history)


def test_gradient_accumulation_matches_one_big_batch(tmp_path, data):
    corpus, tok = data
    runs = []
    for name, batch, accumulation in (("big", 8, 1), ("acc", 4, 2)):
        model = _tiny(tok)
        gates = add_gates(model)
        _trainer(tmp_path / name, model, tok, corpus, [GateSum(gates)], batch, accumulation).train()
        runs.append((model, gates))
    (big, big_gates), (acc, _) = runs
    for (name, p), q in zip(big.named_parameters(), acc.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=name)
    assert all(not torch.allclose(g.weight, torch.ones(4)) for g in big_gates.values())  # the gates did train
