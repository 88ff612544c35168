"""``headwise convert gqa|latent`` on a tiny random Llama with SmolLM2's tokenizer."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers as tf

import headwise
from headwise.cli import main
from headwise.models import resolve_model

WORDS = "the cat sat on a mat while dogs ran past houses near rivers and hills under grey skies".split()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("convert")
    tokenizer = tf.AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=37, tie_word_embeddings=True)
    tf.AutoModelForCausalLM.from_config(config).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    g = torch.Generator().manual_seed(0)
    lines = [" ".join(WORDS[i] for i in torch.randint(len(WORDS), (40,), generator=g)) for _ in range(60)]
    (root / "text.txt").write_text("\n".join(lines) + "\n")
    return root


def _run(root, *argv):
    return main(["convert", *argv, "--model", str(root / "model"), "--data", str(root / "text.txt"),
                 "--calib-tokens", "1024", "--eval-tokens", "128", "--max-length", "64"])


def test_gqa_with_uptraining_exports_natively(tiny_folder, tmp_path, capsys):
    out = tmp_path / "gqa"
    code = _run(tiny_folder, "gqa", "--kv-heads", "1", "--uptrain-tokens", "256", "--distill", "0.5", "--out", str(out))
    assert code == 0
    summary = json.loads((out / "conversion.json").read_text())
    assert next(iter(summary)) == "verdict" and summary["verdict"].startswith("KV cache 128 → 64 bytes/token")
    assert summary["uptraining"]["steps"] == 4 and set(summary["perplexity"]) == {"original", "converted", "uptrained"}
    ppl = summary["perplexity"]  # the run record every editing verb writes
    assert (summary["metric_before"], summary["metric_edited"], summary["metric_recovered"]) == (
        ppl["original"], ppl["converted"], ppl["uptrained"]) and summary["metric_name"] == "lm perplexity"
    assert summary["costs"]["after"]["kv_heads"] < summary["costs"]["before"]["kv_heads"]
    original, tokenizer = headwise.load_model(str(tiny_folder / "model"), task="lm")
    task = headwise.get_task("lm", data=str(tiny_folder / "text.txt"), max_length=64, max_tokens=128)
    assert ppl["original"] == pytest.approx(task.evaluate(original, tokenizer)["perplexity"], rel=1e-5)
    plain = tf.AutoModelForCausalLM.from_pretrained(out / "model").eval()
    assert plain.config.num_key_value_heads == 1
    reloaded = headwise.from_pretrained(out / "model")
    ids = torch.randint(0, 100, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, plain(input_ids=ids).logits, rtol=0, atol=1e-5)
    assert "saved" in capsys.readouterr().out
    assert _run(tiny_folder, "gqa", "--kv-heads", "1", "--out", str(out)) == 2  # refuses to overwrite
    assert "not empty" in capsys.readouterr().err


def test_latent_saves_for_headwise(tiny_folder, tmp_path):
    out = tmp_path / "latent"
    assert _run(tiny_folder, "latent", "--kv-budget", "0.5", "--rope-pairs", "1", "--out", str(out)) == 0
    summary = json.loads((out / "conversion.json").read_text())
    assert summary["kv_bytes_per_token"] == {"before": 128, "after": 64}
    assert summary["saved"].startswith("headwise.from_pretrained (latent")
    model = headwise.from_pretrained(out / "model")
    assert model.model.layers[0].self_attn.k_proj.rank == 12


def test_bad_kv_heads_writes_nothing(tiny_folder, tmp_path, capsys):
    out = tmp_path / "bad"
    assert _run(tiny_folder, "gqa", "--kv-heads", "3", "--out", str(out)) == 2
    assert "does not divide the 4 query heads" in capsys.readouterr().err and not out.exists()


def test_text_shorter_than_a_window_is_refused(tiny_folder, tmp_path, capsys):
    out = tmp_path / "short"
    argv = ["convert", "gqa", "--kv-heads", "1", "--model", str(tiny_folder / "model"), "--data",
            str(tiny_folder / "text.txt"), "--max-length", "100000", "--out", str(out)]
    assert main(argv) == 2
    assert "fewer than one --max-length of 100000" in capsys.readouterr().err and not out.exists()


def test_uptraining_resumes_from_its_checkpoints(tiny_folder, tmp_path, monkeypatch, capsys):
    """Checkpoints of the shared recovery (tied embeddings included) resume to the weights of an unbroken run.
    Only the last checkpoint stays (rotation), so a copy of each is taken as it is saved, and the run is resumed
    from the copy of step 2 as if it had been stopped there."""
    out = tmp_path / "resume"
    argv = ["gqa", "--kv-heads", "1", "--uptrain-tokens", "256", "--distill", "0.5", "--out", str(out),
            "--keep-checkpoints"]
    copies = tmp_path / "copies"
    save = tf.Trainer._save_checkpoint

    def save_and_copy(trainer, *args, **kwargs):
        save(trainer, *args, **kwargs)
        name = f"checkpoint-{trainer.state.global_step}"
        shutil.copytree(f"{trainer.args.output_dir}/{name}", copies / name)

    monkeypatch.setattr(tf.Trainer, "_save_checkpoint", save_and_copy)
    assert _run(tiny_folder, *argv) == 0
    monkeypatch.undo()
    checkpoints = tmp_path / "resume.checkpoints"
    assert sorted(p.name for p in checkpoints.glob("checkpoint-*")) == ["checkpoint-4"]  # the last one only
    assert sorted(p.name for p in copies.iterdir()) == [f"checkpoint-{i}" for i in range(1, 5)]
    unbroken = headwise.from_pretrained(out / "model").state_dict()
    shutil.rmtree(checkpoints / "checkpoint-4")
    shutil.copytree(copies / "checkpoint-2", checkpoints / "checkpoint-2")
    # options that shape the result must be those the run started with: each difference is named
    capsys.readouterr()
    assert _run(tiny_folder, *argv, "--resume", "--force", "--lr", "10") == 2
    err = capsys.readouterr().err
    assert "lr 0.0001 → 10.0" in err and len(err.strip().splitlines()) == 1
    argv_kv = [a if a != "1" else "2" for a in argv]  # --kv-heads 2: refused before any state_dict is loaded
    assert _run(tiny_folder, *argv_kv, "--resume", "--force") == 2
    assert "kv_heads 1 → 2" in capsys.readouterr().err
    # a harmless option (evaluation only) takes its new value and says so
    assert main(["convert", *argv, "--resume", "--force", "--model", str(tiny_folder / "model"), "--text",
                 str(tiny_folder / "text.txt"), "--calib-tokens", "1024", "--eval-tokens", "64",
                 "--max-length", "64"]) == 0
    assert "takes the new eval_tokens 128 → 64" in capsys.readouterr().err
    summary = json.loads((out / "conversion.json").read_text())
    assert summary["uptraining"]["steps"] == 4 and summary["uptraining"]["alpha"] == pytest.approx(1 / 3)
    resumed = headwise.from_pretrained(out / "model").state_dict()
    assert resumed.keys() == unbroken.keys()
    for name, value in unbroken.items():
        torch.testing.assert_close(resumed[name], value, rtol=0, atol=1e-6, msg=name)


def test_resume_without_checkpoints_is_refused(tiny_folder, tmp_path, capsys):
    out = tmp_path / "fresh"
    assert _run(tiny_folder, "gqa", "--kv-heads", "1", "--uptrain-tokens", "128", "--resume", "--out", str(out)) == 2
    assert "no checkpoint in" in capsys.readouterr().err and not out.exists()
