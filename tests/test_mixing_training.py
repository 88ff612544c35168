"""Mixing and swapping inside ``HeadwiseTrainer`` runs: tiny BERT regression and a tiny GPT-2 language model."""

import math
import random

import torch
import transformers as tf
from tiny import RandomPairs
from torch.utils.data import Dataset

from headwise.mixing import (MixingConfig, NuclearNormPenalty, NuclearNormTraining, SwapSchedule, add_mixers,
                             fold_mixing, mixers_of)
from headwise.runtime import enable
from headwise.tasks import TaskObjective, get_task
from headwise.training import HeadwiseTrainer


def _args(tmp_path, steps, **kw):
    options = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=steps, learning_rate=1e-3,
                   report_to="none", save_strategy="no", use_cpu=True, remove_unused_columns=False,
                   disable_tqdm=True, seed=0, data_seed=0, logging_steps=1000)
    return tf.TrainingArguments(**{**options, **kw})


def _encoder():
    torch.manual_seed(0)
    cfg = tf.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return enable(tf.BertModel(cfg, add_pooling_layer=False))


def _nuclear(model):
    return sum(float(m.nuclear_norm().detach()) for _, m in mixers_of(model))


def _train_mixing(tmp_path, training, steps=8, callbacks=()):
    encoder = _encoder()
    add_mixers(encoder, MixingConfig())
    term = NuclearNormPenalty(encoder, training)
    trainer = HeadwiseTrainer(model=TaskObjective(get_task("stsb"), encoder), args=_args(tmp_path, steps),
                              train_dataset=RandomPairs(16),
                              penalties=[term], callbacks=[term, *callbacks], head_learning_rate=1e-2)
    trainer.train()
    return encoder, term


def test_nuclear_norm_moves_the_asked_way_and_waits_for_start(tmp_path):
    start = 8.0  # two identity 4×4 alphas
    shrunk, _ = _train_mixing(tmp_path, NuclearNormTraining(gamma=1.0, direction="shrink", form="seed"))
    grown, _ = _train_mixing(tmp_path, NuclearNormTraining(gamma=1.0, direction="grow", radius=0.05))
    assert _nuclear(shrunk) < start - 0.2 < start + 0.2 < _nuclear(grown)
    late, term = _train_mixing(tmp_path, NuclearNormTraining(gamma=1.0, start=1.0), steps=2)  # start never reached
    assert not term.active
    for _, m in mixers_of(late):
        assert torch.equal(m.alpha.detach(), torch.eye(4))


def test_swap_schedule_runs_at_its_steps(tmp_path):
    encoder = _encoder()
    schedule = SwapSchedule(encoder, {"1": ["enc-self.0:0 <-> enc-self.1:3"], "2.5": ["enc-self.0:1 <-> enc-self.1:1"]})
    trainer = HeadwiseTrainer(model=TaskObjective(get_task("stsb"), encoder), args=_args(tmp_path, 12),
                              train_dataset=RandomPairs(16),
                              callbacks=[schedule])
    trainer.train()  # 4 steps per epoch: epoch 1 → step 0, epoch 2.5 → step 6
    assert [(step, str(s)) for step, s in schedule.applied] == [
        (0, "enc-self.0:0 <-> enc-self.1:3"), (6, "enc-self.0:1 <-> enc-self.1:1")]


WORDS = ["the", "a", "small", "big", "red", "old", "cat", "dog", "bird", "fox", "sees", "likes", "finds", "."]


def corpus(n, seed):
    """Template sentences with agreement between determiners and adjectives (a learnable structure)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = []
        for _ in range(2):
            words += [rng.choice(["the", "a"]), rng.choice(["small", "big", "red", "old"]),
                      rng.choice(["cat", "dog", "bird", "fox"])]
            if len(words) == 3:
                words.append(rng.choice(["sees", "likes", "finds"]))
        out.append([WORDS.index(w) for w in words + ["."]])
    return torch.tensor(out)


class Text(Dataset):
    def __init__(self, ids):
        self.ids = ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


@torch.no_grad()
def perplexity(model, ids):
    model.eval()
    return math.exp(float(model(input_ids=ids, labels=ids).loss))


def test_mixing_trains_a_causal_lm_and_folds(tmp_path):
    torch.manual_seed(0)
    cfg = tf.GPT2Config(vocab_size=len(WORDS), n_embd=64, n_layer=2, n_head=4, n_positions=16,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = enable(tf.GPT2LMHeadModel(cfg))
    add_mixers(model, MixingConfig())
    term = NuclearNormPenalty(model, NuclearNormTraining(gamma=0.01, direction="grow"))
    held_out = corpus(64, seed=1)
    before = perplexity(model, held_out)
    args = _args(tmp_path, 150, learning_rate=3e-3)
    HeadwiseTrainer(model=model, args=args, train_dataset=Text(corpus(512, seed=0)), penalties=[term],
                    callbacks=[term], head_learning_rate=1e-2).train()
    after = perplexity(model, held_out)
    assert after < before / 2 and after < 6.0
    assert any(not torch.equal(m.alpha.detach(), torch.eye(4)) for _, m in mixers_of(model))
    logits = model(input_ids=held_out).logits
    fold_mixing(model)
    torch.testing.assert_close(model(input_ids=held_out).logits, logits, atol=1e-5, rtol=1e-5)
