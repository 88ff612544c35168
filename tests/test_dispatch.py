"""A model loaded the way big-model users load it — Accelerate dispatch with CPU and disk offload under a small
``max_memory`` — gives the same analysis statistics, importance tables and edited outputs as the same model
loaded whole (a SmolLM2-shaped tiny Llama: grouped-query attention 3:1, tied embeddings)."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from test_analysis_support import random_texts, word_tokenizer
from tiny import VOCAB

import headwise
from headwise.analysis import ablation_importance, analyze, gradient_importance
from headwise.planning.edits import edited
from plan_edits import edit as make

pytest.importorskip("accelerate")
TEXTS = random_texts(6, seed=3)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=96, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2,
                            intermediate_size=160, vocab_size=VOCAB, max_position_embeddings=64,
                            tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("smol")
    tf.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    word_tokenizer("llama").save_pretrained(path)
    return path


def load(folder, tmp_path, dispatched: bool):
    extra = dict(device_map="auto", max_memory={"cpu": "400KB"}, offload_folder=str(tmp_path / "offload")) \
        if dispatched else {}
    model, _ = headwise.load_model(str(folder), task="lm", with_tokenizer=False, **extra)
    return model


def test_the_dispatched_model_really_offloads(folder, tmp_path):
    model = load(folder, tmp_path, True)
    assert "disk" in set(model.hf_device_map.values())
    assert any(p.device.type == "meta" for p in model.model.layers[-1].parameters())


@pytest.mark.parametrize("what", ["statistics", "gradient", "ablation"])
def test_analysis_of_the_dispatched_model_equals_the_whole_one(folder, tmp_path, what):
    tokenizer = word_tokenizer("llama")
    results = []
    for dispatched in (False, True):
        model = load(folder, tmp_path / str(dispatched), dispatched)
        if what == "statistics":
            heads = analyze(model, tokenizer, TEXTS, importance=(), examples=0, progress=False).to_dict()["heads"]
            metrics = sorted(k for k, v in heads.items() if isinstance(v, list) and not k.startswith("importance"))
            assert len(metrics) > 3
            results.append(torch.tensor([heads[k] for k in metrics], dtype=torch.float64))
        elif what == "gradient":
            results.append(gradient_importance(model, tokenizer, TEXTS, batch_size=3, progress=False))
        else:
            results.append(ablation_importance(model, tokenizer, TEXTS, batch_size=3, sweep_batch=9, progress=False))
    assert torch.allclose(results[0], results[1], atol=1e-5, equal_nan=True)
    assert results[1].isfinite().any()


def test_a_reversible_edit_in_place_on_the_dispatched_model_equals_the_whole_one(folder, tmp_path):
    ids = torch.arange(4, 20).view(2, 8)
    edit = make(local=(3, ["dec-self.0", "dec-self.3"]), quantization={"quantizer": "lin", "bits": 4})
    got = []
    for dispatched in (False, True):
        model = load(folder, tmp_path / str(dispatched), dispatched)
        with torch.no_grad():
            before = model(input_ids=ids).logits
            with edited(model, edit):
                after = model(input_ids=ids).logits
            assert torch.equal(model(input_ids=ids).logits, before)  # restored
        got.append((before, after))
    assert torch.allclose(got[0][0], got[1][0], atol=1e-5) and torch.allclose(got[0][1], got[1][1], atol=1e-5)
    assert not torch.allclose(got[0][0], got[0][1], atol=1e-3)


def test_an_edit_that_rewrites_offloaded_weights_is_refused(folder, tmp_path):
    model = load(folder, tmp_path, True)
    with pytest.raises(headwise.HeadwiseError, match="offloaded"):
        with edited(model, make(prune={"dec-self.3": [0, 1, 2]})):
            pass
    with pytest.raises(headwise.HeadwiseError, match="need --device-map"):
        headwise.load_model(str(folder), task="lm", max_memory={"cpu": "1GB"})


def test_the_cli_loads_with_device_map_and_gives_the_same_perplexity(folder, tmp_path, capsys):
    import json

    from headwise.cli import main

    text = tmp_path / "text.txt"
    text.write_text("\n".join(TEXTS * 4) + "\n")
    common = ["eval", "lm", "--model", str(folder), "--data", str(text), "--max-length", "16", "--json"]
    assert main(common) == 0
    whole = json.loads(capsys.readouterr().out)
    assert main([*common, "--device-map", "auto", "--max-memory", "cpu=400KB", "--offload-folder",
                 str(tmp_path / "off")]) == 0
    dispatched = json.loads(capsys.readouterr().out)
    assert dispatched["perplexity"] == pytest.approx(whole["perplexity"], rel=1e-5)
    assert main([*common, "--max-memory", "cpu=1GB"]) == 2
    assert "need --device-map" in capsys.readouterr().err


def test_every_verb_that_loads_a_model_takes_the_dispatch_flags():
    from test_cli_flags import leaves

    from headwise.cli import build_parser
    from headwise.contract import load_methods

    load_methods()
    loading = {command: {flag for action in parser._actions for flag in action.option_strings}
               for command, parser in leaves(build_parser())}
    loading = {command: flags for command, flags in loading.items() if "--model" in flags}
    assert {"sites", "eval stsb", "convert gqa", "edit masks", "kv-policy"} <= set(loading)
    lacking = [c for c, flags in loading.items() if not {"--device-map", "--max-memory", "--offload-folder"} <= flags]
    assert not lacking, f"verbs that load a model without the dispatch flags: {lacking}"


def test_the_cli_edits_a_dispatched_model_with_disk_offload_and_reloads_it_dispatched(folder, tmp_path, capsys):
    """``edit`` on a model whose layers are on disk: a mask works, the saved folder reloads dispatched with the
    perplexity of the model edited whole; a weight edit of an offloaded layer is refused in one line."""
    import json

    from headwise.cli import main

    text = tmp_path / "text.txt"
    text.write_text("\n".join(TEXTS * 4) + "\n")
    dispatch = ["--device-map", "auto", "--max-memory", "cpu=400KB", "--offload-folder", str(tmp_path / "off")]
    masks = ["--task", "lm", "--masks", json.dumps({"dec-self.3": [0, 1, 1, 0, 1, 1]})]
    assert main(["sites", "--model", str(folder), *dispatch]) == 0
    assert "4 attention sites" in capsys.readouterr().out
    assert main(["edit", "masks", "--model", str(folder), *masks, "--out", str(tmp_path / "whole")]) == 0
    assert main(["edit", "masks", "--model", str(folder), *masks, *dispatch, "--out", str(tmp_path / "disp")]) == 0
    capsys.readouterr()
    perplexity = {}
    for name, extra in (("whole", []), ("disp", dispatch)):
        assert main(["eval", "lm", "--model", str(tmp_path / name / "model"), "--data", str(text), "--max-length",
                     "16", "--json", *extra]) == 0
        perplexity[name] = json.loads(capsys.readouterr().out)["perplexity"]
    assert perplexity["disp"] == pytest.approx(perplexity["whole"], rel=1e-5)
    assert main(["edit", "prune_heads", "--model", str(folder), "--heads", '{"dec-self.3": [0, 1, 2]}', *dispatch,
                 "--out", str(tmp_path / "pruned")]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "offloaded (dec-self.3" in error and "--max-memory" in error
    assert not (tmp_path / "pruned").exists()
