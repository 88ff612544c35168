"""Head mixing on a causal LM: a 2-layer, 64-wide GPT-2 trained from scratch on a generated corpus, held-out
perplexity for baseline vs. alpha mixing with the nuclear-norm term in both directions (``--arms mix``: mixers
with γ = 0), 2 seeds each.

The corpus is generated here: sentences from a small grammar with number agreement (``the dog runs`` / ``the
dogs run``), adjectives and prepositional phrases, so a model has structure to learn beyond word frequencies.
Mixing models are folded before the final perplexity (and the script checks the fold changes nothing).
Run: ``flock /tmp/headwise-cpu.lock python benchmarks/mixing_gpt2.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile

import torch
import transformers as tf
from torch.utils.data import Dataset

from headwise.mixing import MixingConfig, NuclearNormPenalty, NuclearNormTraining, add_mixers, alpha_table, fold_mixing
from headwise.runtime import enable
from headwise.training import HeadwiseTrainer

NOUNS = ["dog", "cat", "bird", "fox", "child", "teacher"]
VERBS = ["run", "sleep", "sing", "wait", "play"]
ADJS = ["small", "big", "red", "old", "happy"]
PLACES = ["house", "garden", "park", "river"]
VOCAB = (["<pad>", ".", "the", "a", "near", "in", "and"] + NOUNS + [n + "s" for n in NOUNS] + VERBS
         + [v + "s" for v in VERBS] + ADJS + PLACES)
LENGTH = 24


def sentence(rng: random.Random) -> list[str]:
    plural = rng.random() < 0.5
    words = ["the" if plural or rng.random() < 0.5 else "a"]
    if rng.random() < 0.6:
        words.append(rng.choice(ADJS))
    words.append(rng.choice(NOUNS) + ("s" if plural else ""))
    words.append(rng.choice(VERBS) + ("" if plural else "s"))
    if rng.random() < 0.5:
        words += [rng.choice(["near", "in"]), "the", rng.choice(PLACES)]
    return words + ["."]


def corpus(n: int, seed: int) -> torch.Tensor:
    """``n`` sequences of ``LENGTH`` word ids (sentences concatenated, then cut)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words: list[str] = []
        while len(words) < LENGTH:
            words += sentence(rng)
        out.append([VOCAB.index(w) for w in words[:LENGTH]])
    return torch.tensor(out)


class Text(Dataset):
    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


@torch.no_grad()
def perplexity(model, ids: torch.Tensor) -> float:
    model.eval()
    return math.exp(float(model(input_ids=ids, labels=ids).loss))


def run(arm: str, seed: int, steps: int, gamma: float) -> dict:
    torch.manual_seed(seed)
    cfg = tf.GPT2Config(vocab_size=len(VOCAB), n_embd=64, n_layer=2, n_head=4, n_positions=LENGTH,
                        bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = enable(tf.GPT2LMHeadModel(cfg))
    penalties = []
    if arm != "baseline":
        direction = "shrink" if arm == "mix-shrink" else "grow"
        add_mixers(model, MixingConfig())
        training = NuclearNormTraining(gamma=0.0 if arm == "mix" else gamma, direction=direction, radius=1e-2)
        penalties = [NuclearNormPenalty(model, training)]
    args = tf.TrainingArguments(output_dir=tempfile.mkdtemp(prefix="hw-gpt2-"), per_device_train_batch_size=32,
                                max_steps=steps, learning_rate=3e-3, warmup_steps=0.05, weight_decay=0.01,
                                report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True, seed=seed,
                                data_seed=seed, logging_steps=10**6)
    HeadwiseTrainer(model=model, args=args, train_dataset=Text(corpus(4096, seed=100 + seed)), penalties=penalties,
                    callbacks=penalties, head_learning_rate=1e-2 if penalties else None).train()
    held_out = corpus(512, seed=999)
    out = {"perplexity": perplexity(model, held_out)}
    if penalties:
        out["nuclear_norm"] = sum(a["nuclear_norm"] for a in alpha_table(model).values())
        fold_mixing(model)
        out["perplexity_folded"] = perplexity(model, held_out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--gamma", type=float, default=0.1)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--arms", default="baseline,mix-grow,mix-shrink", help="also: mix (mixers, γ = 0)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(2)
    results = {}
    for arm in args.arms.split(","):
        runs = [run(arm, seed, args.steps, args.gamma) for seed in range(args.seeds)]
        ppl = [r["perplexity"] for r in runs]
        results[arm] = {"runs": runs, "mean_perplexity": statistics.mean(ppl),
                        "stdev_perplexity": statistics.stdev(ppl) if len(ppl) > 1 else 0.0}
        print(arm, f"ppl {results[arm]['mean_perplexity']:.4f} ± {results[arm]['stdev_perplexity']:.4f}",
              [round(p, 4) for p in ppl], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
