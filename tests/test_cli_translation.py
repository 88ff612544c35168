"""The verbs on an encoder-decoder with ``--task translation`` (tiny saved Marian with a trained tokenizer):
analyze (roles, confidence, gradient importance of every kind), mix --no-mixers (static swaps fine-tuned, and the
plain control), quantize --methods none (threshold sweep only), compress of cross-attention."""

import gzip
import json

import pytest
import torch

import headwise
from headwise.analysis import analyze_seq2seq
from headwise.cli import main
from headwise.collaborative import is_collaborative
from headwise.mixing import swap_heads
from headwise.sites import find_sites
from headwise.tasks import Translation, train_tokenizer
from headwise.training import finetune
from tiny import VOCAB, tiny_seq2seq

WORDS = "the a cat dog sat on mat ran to house big small red blue tree sun".split()


def sentence(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(5 + i % 3))


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    """A tiny Marian saved with a trained BPE tokenizer, and a folder of parallel {split}.{de,en}.gz files."""
    root = tmp_path_factory.mktemp("cli-marian")
    tokenizer = train_tokenizer([sentence(i) for i in range(200)], vocab_size=80, min_frequency=1)
    assert len(tokenizer) <= VOCAB
    model = tiny_seq2seq("marian", pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         decoder_start_token_id=tokenizer.pad_token_id)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    for split, n in (("train", 12), ("val", 6), ("test_2016_flickr", 5)):
        for lang, shift in (("de", 1), ("en", 2)):
            lines = "".join(sentence(i + shift) + "\n" for i in range(n)).encode()
            (root / f"{split}.{lang}.gz").write_bytes(gzip.compress(lines))
    return root


def test_cli_analyze_translation_writes_every_kind(marian_dir, tmp_path):
    out = tmp_path / "a"
    argv = ["analyze", "--task", "translation", "--model", str(marian_dir / "model"), "--data-dir", str(marian_dir),
            "--limit", "4", "--importance-examples", "4", "--batch-size", "2", "--max-length", "32", "--out", str(out)]
    assert main(argv) == 0
    stats = json.loads((out / "stats.json").read_text())
    assert (out / "report.html").is_file() and "dec-enc heads" in (out / "report.html").read_text()
    assert {s["kind"] for s in stats["sites"]} == {"enc-self", "dec-self", "dec-enc"}
    gradient = torch.tensor(stats["importance_gradient"])
    assert gradient.shape == (6, 4) and (gradient > 0).all()
    # the same numbers as the library on the same batches
    model, tok = headwise.load_model(str(marian_dir / "model"), task="translation")
    task = Translation(data_dir=str(marian_dir), max_length=32)
    direct = analyze_seq2seq(model, task.calibration_inputs(tok, limit=4, batch_size=2), loss_fn=task.loss,
                             loss_inputs=task.batches(tok, "train", 2, 4))
    assert torch.allclose(gradient, torch.tensor(direct.importance), atol=1e-6)
    assert stats["scores"]["confidence"] == direct.roles.scores["confidence"]


def test_cli_analyze_translation_refuses_ablation_and_writes_nothing(marian_dir, tmp_path, capsys):
    out = tmp_path / "never"
    argv = ["analyze", "--task", "translation", "--model", str(marian_dir / "model"), "--data-dir", str(marian_dir),
            "--importance", "gradient,ablation", "--out", str(out)]
    assert main(argv) != 0
    assert "ablation" in capsys.readouterr().err and not out.exists()


def test_mix_no_mixers_fine_tunes_the_swapped_model_as_it_is(marian_dir, tmp_path, capsys):
    out = tmp_path / "m"
    swap = "dec-enc.0:1 <-> dec-enc.1:2"
    argv = ["mix", "--task", "translation", "--model", str(marian_dir / "model"), "--data-dir", str(marian_dir),
            "--max-length", "32", "--max-new-tokens", "8", "--swap", swap, "--mix-epochs", "0.5", "--no-mixers", "--json", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["mixers"] is False and "nuclear_norms" not in result
    got = headwise.from_pretrained(out / "model")
    reference, tok = headwise.load_model(str(marian_dir / "model"), task="translation")
    swap_heads(reference, [swap])
    finetune(reference, tok, Translation(data_dir=str(marian_dir), max_length=32), epochs=0.5, progress=False)
    want = reference.state_dict()
    assert all(torch.allclose(v, want[k], atol=1e-6) for k, v in got.state_dict().items())
    assert not torch.equal(want["model.decoder.layers.0.encoder_attn.q_proj.weight"],
                           tiny_seq2seq("marian").state_dict()["model.decoder.layers.0.encoder_attn.q_proj.weight"])
    assert main(argv[:-3] + ["--mix-epochs", "0", "--out", str(tmp_path / "never")]) != 0  # --no-mixers alone
    assert "--no-mixers" in capsys.readouterr().err and not (tmp_path / "never").exists()


def test_quantize_methods_none_sweeps_only_thresholds(marian_dir, tmp_path, capsys):
    argv = ["quantize", "--task", "translation", "--model", str(marian_dir / "model"), "--data-dir", str(marian_dir),
            "--max-length", "32", "--max-new-tokens", "8", "--quantizers", "none", "--thresholds", "0.01,0.2", "--json",
            "--out", str(tmp_path / "q")]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(r["method"], r["threshold"]) for r in result["rows"]] == [("none", 0.01), ("none", 0.2)]
    assert 0 < result["rows"][0]["sparsity"] < result["rows"][1]["sparsity"] < 1


def test_compress_cross_attention_with_task_calibration(marian_dir, tmp_path, capsys):
    out = tmp_path / "c"
    argv = ["compress", "--task", "translation", "--model", str(marian_dir / "model"), "--data-dir", str(marian_dir),
            "--max-length", "32", "--max-new-tokens", "8", "--dk", "32", "--kinds", "dec-enc", "--calibration", "task", "--curve", "none",
            "--json", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["metric_edited"] == pytest.approx(result["metric_before"], abs=1e-6)  # dk = H·d is exact
    model = headwise.from_pretrained(out / "model")
    assert [s.kind for s in find_sites(model) if is_collaborative(s.module)] == ["dec-enc", "dec-enc"]
