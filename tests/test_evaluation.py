import pytest
import torch

import headwise
from headwise.cli import main
from headwise.tasks import evaluate_stsb, mean_pool, read_stsb

from tiny import tiny_model


def test_mean_pool_ignores_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    assert torch.equal(mean_pool(hidden, torch.tensor([[1, 1, 0]])), torch.tensor([[2.0, 3.0]]))


def test_read_stsb_parses_scores_and_sentences(tmp_path):
    (tmp_path / "sts-dev.tsv").write_text("g\tf\ty\t1\t4.5\tA cat sits.\tA cat is sitting.\nx\ty\tz\t2\t0\tHi\tBye\textra\n")
    pairs = read_stsb("dev", tmp_path)
    assert pairs.scores == [4.5, 0.0] and pairs.first == ["A cat sits.", "Hi"] and pairs.second[1] == "Bye"


def test_read_stsb_names_the_bad_line(tmp_path):
    (tmp_path / "sts-dev.tsv").write_text("g\tf\ty\t1\t4.5\tA\tB\ng\tf\ty\t1\tfive\tA\tB\n")
    with pytest.raises(headwise.HeadwiseError, match=r"sts-dev.tsv:2"):
        read_stsb("dev", tmp_path)


def test_minilm_reproduces_its_published_dev_score(minilm):
    model, tokenizer = minilm
    assert model.config._attn_implementation == "headwise"
    result = evaluate_stsb(model, tokenizer, "dev")
    assert result.pairs == 1500
    assert abs(result.spearman - 86.72) <= 0.05


def _one_line_error(capsys, argv):
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("headwise: error:") and "Traceback" not in err[0]
    return err[0]


def test_cli_missing_stsb_file(capsys, tmp_path):
    assert "STS-B file not found" in _one_line_error(capsys, ["eval", "stsb", "--data", str(tmp_path / "nope.tsv")])


def test_cli_path_that_is_not_a_model(capsys, tmp_path):
    assert "not a model folder" in _one_line_error(capsys, ["sites", "--model", str(tmp_path)])


def test_cli_unknown_family(capsys, tmp_path):
    import transformers as tf

    tf.BloomModel(tf.BloomConfig(hidden_size=32, n_layer=1, n_head=4, vocab_size=50)).save_pretrained(tmp_path / "m")
    line = _one_line_error(capsys, ["sites", "--model", str(tmp_path / "m")])
    assert "BloomModel" in line and "Supported:" in line


def test_cli_decoder_passed_to_eval_stsb(capsys, tmp_path):
    tiny_model("gpt2").save_pretrained(tmp_path / "gpt2")
    (tmp_path / "sts-dev.tsv").write_text("g\tf\ty\t1\t4.5\tA cat sits.\tA cat is sitting.\n"
                                          "g\tf\ty\t2\t0.5\tA dog runs.\tA man sings.\n")  # two pairs: data is fine
    line = _one_line_error(capsys, ["eval", "stsb", "--model", str(tmp_path / "gpt2"), "--data", str(tmp_path)])
    assert "causal decoder" in line


def test_cli_debug_shows_the_traceback(tmp_path):
    with pytest.raises(headwise.HeadwiseError):
        main(["sites", "--model", str(tmp_path), "--debug"])


def test_cli_sites_table(capsys):
    assert main(["sites"]) == 0
    out = capsys.readouterr().out
    assert "6 attention sites, 72 heads" in out and "enc-self.5" in out


def test_fidelity_is_one_for_the_same_model_and_drops_when_a_head_is_cut(minilm):
    import copy

    from headwise.tasks import fidelity

    model, tokenizer = minilm
    texts = read_stsb("dev").first[:24]
    assert fidelity(model, model, tokenizer, texts) == pytest.approx(1.0, abs=1e-6)
    cut = copy.deepcopy(model)
    gates = headwise.add_gates(cut)
    with torch.no_grad():
        next(iter(gates.values())).weight.zero_()
    score = fidelity(cut, model, tokenizer, texts)
    assert 0.5 < score < 0.9999


def test_stsb_found_under_headwise_data_dir(monkeypatch, tmp_path):
    """``$HEADWISE_DATA_DIR/stsb`` is searched like every other task's data (before shared/data above)."""
    from headwise.tasks.stsb_data import stsb_file

    (tmp_path / "stsb").mkdir()
    (tmp_path / "stsb" / "sts-dev.tsv").write_text("main\tcaptions\t2012\t1\t5.0\tA cat.\tA cat.\n")
    monkeypatch.delenv("HEADWISE_STSB_DIR", raising=False)
    monkeypatch.setenv("HEADWISE_DATA_DIR", str(tmp_path))
    assert stsb_file("dev") == tmp_path / "stsb" / "sts-dev.tsv"
    monkeypatch.setenv("HEADWISE_STSB_DIR", str(tmp_path / "nowhere"))  # its own variable first, then the root
    assert stsb_file("dev") == tmp_path / "stsb" / "sts-dev.tsv"
