"""Long runs resume from their last complete state: translation training stopped by SIGTERM/SIGINT saves a
complete checkpoint and resumes to the weights of an unbroken run; one killed outright after an evaluation resumes
from that evaluation; a resume with another recipe lists what differs."""

from __future__ import annotations

import os
import signal

import pytest
import torch

import headwise.training.translation_model as tm
from headwise import HeadwiseError
from headwise.tasks import SyntheticGrammar, write_corpus
from headwise.tasks.translation import Translation
from headwise.training import TranslationRecipe, train_translation_model
from headwise.training.resume import differences, stop_signals

TINY = dict(vocab_size=200, d_model=32, layers=1, heads=2, ffn=64, max_tokens=400, warmup=4, val_size=8,
            minutes=None, max_new_tokens=16, eval_every=3, max_steps=8)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    grammar = SyntheticGrammar(seed=3, nouns=40, adjectives=15, verbs=10)
    folder = write_corpus(tmp_path_factory.mktemp("pairs"), {"train": grammar.corpus("train", 200),
                                                            "val": grammar.corpus("val", 8)})
    return Translation(data_dir=str(folder), src="src", tgt="tgt")


@pytest.fixture(scope="module")
def unbroken(task, tmp_path_factory):
    out = tmp_path_factory.mktemp("unbroken") / "model"
    train_translation_model(out, task, TranslationRecipe(**TINY), progress=False)
    return torch.load(out / "checkpoint.pt", weights_only=False)


def interrupt_at(monkeypatch, step: int, action) -> None:
    """Run ``action`` (send a signal, or die) inside the loss of ``step`` (1-based)."""
    calls = {"n": 0}
    loss = tm.smoothed_loss

    def counting(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == step:
            action()
        return loss(*args, **kwargs)

    monkeypatch.setattr(tm, "smoothed_loss", counting)


def same_weights(a: dict, b: dict) -> None:
    assert a["step"] == b["step"] and a["epoch"] == b["epoch"] and a["batch"] == b["batch"]
    for name, value in a["model"].items():
        torch.testing.assert_close(b["model"][name], value, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_a_complete_checkpoint_that_resumes_exactly(task, unbroken, tmp_path, monkeypatch, capsys,
                                                                    sig):
    out = tmp_path / "model"
    before = signal.getsignal(sig)  # the default, or SIG_IGN for SIGINT in a shell's background job
    interrupt_at(monkeypatch, 5, lambda: os.kill(os.getpid(), sig))  # after the evaluation at step 3
    with pytest.raises(KeyboardInterrupt):
        train_translation_model(out, task, TranslationRecipe(**TINY), progress=False)
    assert f"stopped by {sig.name} at step 5" in capsys.readouterr().err
    assert torch.load(out / "checkpoint.pt", weights_only=False)["step"] == 5
    monkeypatch.undo()
    assert signal.getsignal(sig) == before  # handlers restored
    result = train_translation_model(out, task, TranslationRecipe(**TINY), resume=True, progress=False)
    assert result["steps"] == 8
    same_weights(unbroken, torch.load(out / "checkpoint.pt", weights_only=False))


def test_a_run_killed_after_an_evaluation_resumes_from_it(task, unbroken, tmp_path, monkeypatch):
    out = tmp_path / "model"

    def die():
        raise SystemExit("killed")

    interrupt_at(monkeypatch, 5, die)  # no handler runs: the state on disk is the evaluation's at step 3
    with pytest.raises(SystemExit):
        train_translation_model(out, task, TranslationRecipe(**TINY), progress=False)
    assert torch.load(out / "checkpoint.pt", weights_only=False)["step"] == 3
    monkeypatch.undo()
    train_translation_model(out, task, TranslationRecipe(**TINY), resume=True, progress=False)
    same_weights(unbroken, torch.load(out / "checkpoint.pt", weights_only=False))


def test_a_resume_with_another_recipe_lists_what_differs(task, tmp_path, monkeypatch):
    out = tmp_path / "model"
    interrupt_at(monkeypatch, 2, lambda: os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(KeyboardInterrupt):
        train_translation_model(out, task, TranslationRecipe(**TINY), progress=False)
    monkeypatch.undo()
    with pytest.raises(HeadwiseError, match=r"another recipe \(learning_rate 0.001 → 0.01\)"):
        train_translation_model(out, task, TranslationRecipe(**{**TINY, "learning_rate": 1e-2}), resume=True,
                                progress=False)


def test_differences_and_stop_signals():
    assert differences({"lr": 1e-4, "kv_heads": 1}, {"lr": 1e-4, "kv_heads": 2, "x": None}) == ["kv_heads 1 → 2"]
    with stop_signals() as stop:
        assert not stop
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop and stop.signal == "SIGTERM"


def test_a_run_killed_before_its_first_checkpoint_starts_again_with_resume(task, unbroken, tmp_path, monkeypatch,
                                                                          capsys):
    out = tmp_path / "model"

    def die():
        raise SystemExit("killed")

    interrupt_at(monkeypatch, 2, die)
    with pytest.raises(SystemExit):
        train_translation_model(out, task, TranslationRecipe(**TINY), progress=False)
    monkeypatch.undo()
    assert not (out / "checkpoint.pt").exists()
    with pytest.raises(HeadwiseError, match="stopped before its first checkpoint; pass --resume"):
        train_translation_model(out, task, TranslationRecipe(**TINY), progress=False)
    train_translation_model(out, task, TranslationRecipe(**TINY), resume=True, progress=False)
    assert "starting it from the beginning" in capsys.readouterr().err
    same_weights(unbroken, torch.load(out / "checkpoint.pt", weights_only=False))
