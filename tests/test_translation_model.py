"""Translation training from scratch (``headwise train translation``): token-bucketed batches, the label-smoothed
loss, and a tiny run on a few hundred synthetic pairs that trains, resumes exactly, caches its result, loads with
plain transformers and evaluates with ``headwise eval translation``."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from headwise import HeadwiseError
from headwise.cli import main
from headwise.tasks import SyntheticGrammar, write_corpus
from headwise.batching import collate
from headwise.tasks.corpus import train_tokenizer
from headwise.tasks.translation import Translation
from headwise.training import TranslationRecipe, token_batches, train_translation_model
from headwise.training.translation_model import label_smoothed_nll, marian_model, smoothed_loss

TINY = dict(vocab_size=200, d_model=32, layers=1, heads=2, ffn=64, max_tokens=400, warmup=4, val_size=16,
            minutes=None, max_new_tokens=24)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    grammar = SyntheticGrammar(seed=3, nouns=40, adjectives=15, verbs=10)
    return write_corpus(tmp_path_factory.mktemp("pairs"), {"train": grammar.corpus("train", 300),
                                                          "val": grammar.corpus("val", 16)})


def tiny_task(corpus_dir) -> Translation:
    return Translation(data_dir=str(corpus_dir), src="src", tgt="tgt")


# ---- batches --------------------------------------------------------------------------------------------------
def test_token_batches_cover_every_example_once_within_the_budget():
    src = [(i * 7) % 23 + 1 for i in range(200)]
    tgt = [(i * 5) % 19 + 1 for i in range(200)]
    batches = token_batches(src, tgt, 60, seed=1, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(200))
    assert all(len(b) * max(max(src[i], tgt[i]) for i in b) <= 60 for b in batches)
    assert batches == token_batches(src, tgt, 60, seed=1, epoch=0)  # deterministic in (seed, epoch)
    assert batches != token_batches(src, tgt, 60, seed=1, epoch=1)
    assert batches != token_batches(src, tgt, 60, seed=2, epoch=0)


def test_token_batches_hand_computed():
    # longest sides 3, 3, 3, 5: three pairs of 3 fill 9 tokens; the pair of 5 goes alone
    batches = token_batches([3, 1, 3, 2], [1, 3, 3, 5], 9, seed=0, epoch=0)
    assert sorted(sorted(b) for b in batches) == [[0, 1, 2], [3]]
    with pytest.raises(HeadwiseError, match="max_tokens=4"):
        token_batches([3, 5], [1, 1], 4, seed=0, epoch=0)


# ---- loss -----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_marian(corpus_dir):
    task = tiny_task(corpus_dir)
    train = task.corpus("train")
    tokenizer = train_tokenizer([*train.source, *train.target], 200, nfkc=True)
    model = marian_model(TranslationRecipe(**TINY, max_steps=1), tokenizer).eval()
    batch = collate(task.examples(tokenizer, "train").items[:6], tokenizer.pad_token_id)
    return model, batch


def test_smoothed_loss_matches_transformers_and_the_smoothing_formula(tiny_marian):
    model, batch = tiny_marian
    with torch.no_grad():
        plain = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        assert torch.allclose(smoothed_loss(model, batch, 0.0), plain.loss, atol=1e-6)
        logp = plain.logits.log_softmax(-1)
        real = batch["labels"] != -100
        nll = -logp.gather(-1, batch["labels"].clamp(min=0)[..., None])[..., 0]
        uniform = -logp.mean(-1)
        expected = ((0.9 * nll + 0.1 * uniform) * real).sum() / real.sum()
        assert torch.allclose(smoothed_loss(model, batch, 0.1), expected, atol=1e-5)
        assert torch.allclose(label_smoothed_nll(plain.logits, batch["labels"], 0.1), expected, atol=1e-5)


@pytest.mark.parametrize("dtype, tol", [(torch.float16, 2e-2), (torch.bfloat16, 5e-2)])
def test_smoothed_loss_in_half_precision_matches_float32(tiny_marian, dtype, tol):
    model, batch = tiny_marian
    with torch.no_grad():
        reference = smoothed_loss(model, batch, 0.1)
        half = smoothed_loss(model.to(dtype), batch, 0.1)
    model.float()
    assert half.dtype == torch.float32 and abs(half.item() - reference.item()) < tol * reference.item()


def test_label_smoothed_nll_on_meta(tiny_marian):
    # the loss op on meta; the whole Marian forward cannot run there (its decoder builds a mask that
    # transformers reads with .item())
    _, batch = tiny_marian
    logits = torch.randn(*batch["labels"].shape, 200, device="meta")
    loss = label_smoothed_nll(logits, batch["labels"].to("meta"), 0.1)
    assert loss.device.type == "meta" and loss.shape == ()


# ---- training ----------------------------------------------------------------------------------------------------
def test_recipe_refuses_bad_settings():
    with pytest.raises(HeadwiseError, match="budget"):
        TranslationRecipe(minutes=None)
    with pytest.raises(HeadwiseError, match="multiple of heads"):
        TranslationRecipe(d_model=30, heads=8)
    with pytest.raises(HeadwiseError, match="max_tokens"):
        TranslationRecipe(max_tokens=0)


def test_trains_loads_evaluates_and_caches(corpus_dir, tmp_path, capsys):
    out = tmp_path / "model"
    recipe = TranslationRecipe(**TINY, max_steps=16, eval_every=8, learning_rate=3e-3)
    result = train_translation_model(out, tiny_task(corpus_dir), recipe, progress=False)
    assert result["steps"] == 16 and result["val_pairs"] == 16 and result["train_pairs"] == 300
    log = json.loads((out / "training_log.json").read_text())["evals"]
    assert [e["step"] for e in log] == [8, 16] and log[1]["loss"] < log[0]["loss"]
    assert result["best_val_bleu"] == max(e["val_bleu"] for e in log)
    # a plain transformers folder: the best model and the tokenizer it was trained with
    model = AutoModelForSeq2SeqLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == "MarianMTModel" and model.config.d_model == 32 and len(tokenizer) == 200
    assert tokenizer("ein Test").input_ids[-1] == tokenizer.eos_token_id
    # headwise eval translation scores the saved model as the training did
    assert main(["eval", "translation", "--model", str(out), "--data-dir", str(corpus_dir), "--split", "val",
                 "--src", "src", "--tgt", "tgt", "--max-new-tokens", "24", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert math.isclose(metrics["bleu"], result["best_val_bleu"], abs_tol=1e-6)
    # the finished training is cached: same options give the result back without training
    stamp = (out / "checkpoint.pt").stat().st_mtime_ns
    assert train_translation_model(out, tiny_task(corpus_dir), recipe, progress=False) == result
    assert (out / "checkpoint.pt").stat().st_mtime_ns == stamp


def test_resume_continues_exactly(corpus_dir, tmp_path):
    task = tiny_task(corpus_dir)
    straight = tmp_path / "straight"
    train_translation_model(straight, task, TranslationRecipe(**TINY, max_steps=10), progress=False)
    split = tmp_path / "split"
    train_translation_model(split, task, TranslationRecipe(**TINY, max_steps=6), progress=False)
    (split / "result.json").unlink()  # as if interrupted after the last checkpoint
    with pytest.raises(HeadwiseError, match="--resume"):
        train_translation_model(split, task, TranslationRecipe(**TINY, max_steps=10), progress=False)
    result = train_translation_model(split, task, TranslationRecipe(**TINY, max_steps=10), resume=True,
                                     progress=False)
    assert result["steps"] == 10
    a = torch.load(straight / "checkpoint.pt", weights_only=False)
    b = torch.load(split / "checkpoint.pt", weights_only=False)
    assert a["epoch"] == b["epoch"] and a["batch"] == b["batch"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(torch.equal(x, y) for x, y in zip(a["optimizer"]["state"][0].values(),
                                                  b["optimizer"]["state"][0].values()))


def test_refuses_other_folders_and_recipes(corpus_dir, tmp_path):
    task = tiny_task(corpus_dir)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(HeadwiseError, match="holds no headwise training"):
        train_translation_model(foreign, task, TranslationRecipe(**TINY, max_steps=2), progress=False)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    out = tmp_path / "out"
    train_translation_model(out, task, TranslationRecipe(**TINY, max_steps=2), progress=False)
    with pytest.raises(HeadwiseError, match="another recipe"):
        train_translation_model(out, task, TranslationRecipe(**{**TINY, "d_model": 64}, max_steps=2),
                                progress=False)
    result = train_translation_model(out, task, TranslationRecipe(**TINY, max_steps=3), force=True, progress=False)
    assert result["steps"] == 3


def test_cli_trains_and_refuses_missing_data(corpus_dir, tmp_path, capsys):
    out = tmp_path / "cli"
    args = ["train", "translation", "--data-dir", str(corpus_dir), "--src", "src", "--tgt", "tgt", "--out", str(out),
            "--no-time-limit", "--max-steps", "3", "--vocab-size", "200", "--d-model", "32", "--num-layers", "1",
            "--num-heads", "2", "--ffn", "64", "--batch-tokens", "400", "--val-size", "8", "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["steps"] == 3 and result["recipe"]["layers"] == 1 and (out / "model.safetensors").is_file()
    missing = tmp_path / "nothing"
    assert main(["train", "translation", "--data-dir", str(missing), "--out", str(tmp_path / "x"), "--json"]) == 2
    assert "nothing" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_two_runs_on_one_out_started_together_exactly_one_exits_0(corpus_dir, tmp_path):
    """The training folder is built in place (resumable), under the one single-writer claim of ``io.files``: the
    second run is refused in one line instead of silently replacing the first one's result. Each run trains for 18 s
    once it holds the folder, so the two overlap whatever the start-up times."""
    import os
    import subprocess
    import sys

    out = tmp_path / "shared-out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    runs = [subprocess.Popen(
        [sys.executable, "-m", "headwise", "train", "translation", "--data-dir", str(corpus_dir), "--src", "src",
         "--tgt", "tgt", "--out", str(out), "--minutes", "0.3", "--vocab-size", "200",
         "--d-model", "32", "--num-layers", "1", "--num-heads", "2", "--ffn", "64", "--batch-tokens", "400",
         "--val-size", "8", "--seed", str(seed), "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for seed in (1, 2)]
    outcomes = [(run.wait(timeout=600), *run.communicate()) for run in runs]
    codes = sorted(code for code, _, _ in outcomes)
    assert codes == [0, 2], [(code, err[-500:]) for code, _, err in outcomes]
    (winner,) = [json.loads(text) for code, text, _ in outcomes if code == 0]
    (refusal,) = [err.strip().splitlines() for code, _, err in outcomes if code == 2]
    assert len(refusal) == 1 and refusal[0].startswith("headwise: error: another headwise run is writing")
    assert json.loads((out / "result.json").read_text())["recipe"]["seed"] == winner["recipe"]["seed"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared-out"]  # no lock or temporary left
