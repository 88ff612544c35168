"""The edit journal: checkpoints written by an earlier format keep loading, and what they load computes what the
saved model computed.

``tests/data/checkpoints_v1`` holds tiny checkpoints written by headwise at commit ecf0f5c (journal format 1:
``{"kind": ...}`` edit records), each with ``expected.safetensors``: the inputs and the outputs the model gave
right before it was saved (``last_hidden_state``, or ``logits`` for the encoder-decoder)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import headwise
from headwise.io.manifest import write_manifest

V1 = Path(__file__).resolve().parent / "data" / "checkpoints_v1"
CHECKPOINTS = sorted(p.name for p in V1.iterdir())


def _outputs(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        result = model(**inputs)
    return result.logits if "decoder_input_ids" in inputs else result.last_hidden_state


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_format_1_checkpoint_reloads_to_the_saved_outputs(name):
    stored = load_file(V1 / name / "expected.safetensors")
    expected = stored.pop("expected")
    model = headwise.from_pretrained(V1 / name)
    torch.testing.assert_close(_outputs(model, stored), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_format_1_checkpoint_saved_again_reloads_the_same(name, tmp_path):
    stored = load_file(V1 / name / "expected.safetensors")
    expected = stored.pop("expected")
    headwise.save_pretrained(headwise.from_pretrained(V1 / name), tmp_path / "again")
    torch.testing.assert_close(_outputs(headwise.from_pretrained(tmp_path / "again"), stored), expected,
                               rtol=1e-5, atol=1e-5)


def test_format_1_kv_policy_is_back():
    model = headwise.from_pretrained(V1 / "llama-latent-kvpolicy")
    assert headwise.kvcache.policy_of(model) is not None


def test_journal_entries_carry_method_version_config_and_state(tmp_path):
    import json

    from headwise.contract import config_from_dict, journal
    from headwise.pruning.method import PruneHeadsConfig
    from tiny import tiny_model

    model = tiny_model("llama")
    headwise.apply(model, PruneHeadsConfig({"dec-self.1": [0, 1]}))
    (entry,) = journal(model)
    assert entry["method"] == "prune_heads" and entry["version"] == 1
    path = headwise.find_sites(model)[1].path
    assert entry["state"] == {"heads": {path: [0, 1]}}
    assert config_from_dict(entry) == PruneHeadsConfig({"dec-self.1": [0, 1]})
    headwise.save_pretrained(model, tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())["headwise"]
    assert saved["version"] == 2 and "edits" not in saved and saved["journal"] == [entry]


@pytest.mark.parametrize("change, message", [
    (lambda e: e.update(method="no_such_method"), "needs method 'no_such_method', unknown to this headwise"),
    (lambda e: e.update(version=99), "its prune_heads entry is version 99, newer than this headwise"),
    (lambda e: e.pop("state"), "a journal entry needs 'method', 'version', 'config' and 'state'"),
])
def test_a_journal_this_headwise_cannot_replay_is_refused(tmp_path, change, message):
    import json

    from tiny import tiny_model

    model = tiny_model("llama")
    headwise.prune_heads(model, {"dec-self.0": [0, 1]})
    headwise.save_pretrained(model, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    change(config["headwise"]["journal"][0])
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    write_manifest(tmp_path / "m")  # the edit sealed as if headwise wrote it: what is checked is the record
    with pytest.raises(headwise.HeadwiseError, match=message):
        headwise.from_pretrained(tmp_path / "m")


def test_gqa_inside_the_config_saves_a_plain_loadable_model(tmp_path):
    """An entry with no state rebuilds nothing: the folder carries no marker and plain transformers loads it."""
    import transformers

    from tiny import tiny_inputs, tiny_model

    model = tiny_model("llama")
    headwise.convert_gqa(model, kv_heads=1, init="mean")
    assert headwise.contract.journal(model)[0]["state"] == {}
    headwise.save_pretrained(model, tmp_path / "m")
    plain = transformers.AutoModel.from_pretrained(tmp_path / "m").eval()
    inputs, _ = tiny_inputs("llama")
    with torch.no_grad():
        torch.testing.assert_close(plain(**inputs).last_hidden_state, model(**inputs).last_hidden_state)
