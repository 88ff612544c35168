"""The public surface: the top-level verbs and configs, ``remove_*`` undoing each ``add_*``, quantizer short names,
and the ``mix`` / ``replace`` verbs (tiny models, no evaluation)."""

from __future__ import annotations

import json

import pytest
import torch
from tiny import tiny_inputs, tiny_model

import headwise
from headwise.cli import main
from headwise.mechanisms import use as use_mechanism
from headwise.mixing import swap_heads
from headwise.quantization import QuantizationConfig


def test_top_level_exports_verbs_and_configs_not_internals():
    for name in ("compress", "CollaborativeConfig", "quantize_attention", "QuantizationConfig", "replace_attention",
                 "add_mixers", "MixingConfig", "apply_masks", "add_l0_gates", "L0Config", "analyze",
                 "AnalysisConfig", "save_pretrained", "from_pretrained", "select_sites", "convert_gqa", "convert_latent",
                 "kv_policy", "apply_kv_policy", "KVPolicy"):
        assert name in headwise.__all__ and callable(getattr(headwise, name))
    # new methods register with headwise.contract instead of growing this list
    assert len(headwise.__all__) <= 51 and all(hasattr(headwise, n) for n in headwise.__all__)
    assert issubclass(headwise.HeadwiseError, ValueError)


REMOVABLE = [
    (lambda m: headwise.add_gates(m), headwise.remove_gates),
    (lambda m: headwise.apply_masks(m, {"enc-self.0": [0, 1, 0, 1]}), headwise.remove_masks),
    (lambda m: headwise.add_l0_gates(m, headwise.L0Config(init=-1.0)), headwise.remove_l0_gates),
    (lambda m: headwise.add_mixers(m), headwise.remove_mixers),
    (lambda m: headwise.quantize_attention(m, quantizer="bin"), headwise.remove_quantization),
    (lambda m: headwise.replace_attention(m, "linear"), headwise.restore_attention),
]


@pytest.mark.parametrize("add, remove", REMOVABLE)
def test_remove_undoes_add(add, remove):
    model = tiny_model("bert")
    inputs, real = tiny_inputs("bert")
    with torch.no_grad():
        before = model(**inputs).last_hidden_state
        add(model)
        remove(model)
        after = model(**inputs).last_hidden_state
    assert torch.equal(after[real], before[real])
    assert all(getattr(s.module, "headwise", None) is None for s in headwise.find_sites(model))


@pytest.mark.parametrize("alias, method, bits", [("log3", "linear_slog_clamped_midval", 3), ("log", "linear_slog_clamped_midval", 5),
                                                 ("ulog4", "uniform_slog_mean", 4), ("bin", "binarization", 5),
                                                 ("prune", "none", 5), ("linear_slog", "linear_slog", 5)])
def test_quantizer_short_names(alias, method, bits):
    config = QuantizationConfig(quantizer=alias, bits=5)
    assert (config.quantizer, config.bits) == (method, bits)


def test_unknown_quantizer_name_lists_the_short_names():
    with pytest.raises(headwise.HeadwiseError, match="short name log, lin"):
        QuantizationConfig(quantizer="log3x")


def test_mix_verb_swaps_heads_and_saves(tmp_path, capsys):
    source, out = tmp_path / "tiny", tmp_path / "mixed"
    headwise.save_pretrained(tiny_model("bert"), source)
    swap = "enc-self.0:1 <-> enc-self.1:2"
    assert main(["mix", "--model", str(source), "--no-eval", "--out", str(out)]) == 2
    assert "nothing to do" in capsys.readouterr().err
    assert main(["mix", "--model", str(source), "--swap", "enc-self.0:9 <-> enc-self.1:2", "--no-eval",
                 "--out", str(out)]) == 2 and not out.exists()
    capsys.readouterr()
    assert main(["mix", "--model", str(source), "--swap", swap, "--no-eval", "--out", str(out)]) == 0
    assert json.loads((out / "mixing.json").read_text())["swaps"] == [swap]
    expected = swap_heads(headwise.from_pretrained(source), [swap])
    inputs, _ = tiny_inputs("bert")
    with torch.no_grad():
        assert torch.equal(headwise.from_pretrained(out / "model")(**inputs).last_hidden_state,
                           expected(**inputs).last_hidden_state)
    assert (out / "report.html").is_file()


def test_replace_verb_attaches_a_mechanism_and_saves(tmp_path, capsys):
    source, out = tmp_path / "tiny", tmp_path / "replaced"
    headwise.save_pretrained(tiny_model("bert"), source)
    assert main(["replace", "local", "--arg", "windw=2", "--model", str(source), "--no-eval", "--out", str(out)]) == 2
    assert "NAME one of window, mode, overlap, rel_pos_bias" in capsys.readouterr().err and not out.exists()
    assert main(["replace", "local", "--arg", "window=2", "--model", str(source), "--no-eval", "--out", str(out)]) == 0
    summary = json.loads((out / "replace.json").read_text())
    assert summary["args"] == {"window": 2} and len(summary["sites"]) == 2
    expected = headwise.from_pretrained(source)
    use_mechanism(expected, "local", window=2)
    inputs, _ = tiny_inputs("bert")
    with torch.no_grad():
        assert torch.equal(headwise.from_pretrained(out / "model")(**inputs).last_hidden_state,
                           expected(**inputs).last_hidden_state)
