"""Checkpoints that prove they are whole (issue 44.1) and edited folders plain transformers refuses (issue 43.2):
the manifest catches torn, truncated, missing and edited files; the ``headwise`` record is validated one line per
problem; NaN or infinite weights are refused with their names; folders from before the manifest still load."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from tiny import tiny_inputs, tiny_model

import headwise
from headwise import HeadwiseError
from headwise.cli import main
from headwise.io import checkpoint, manifest
from headwise.io.manifest import MANIFEST, sha256_of, write_manifest
from headwise.runtime import add_gates


def _saved(tmp_path, name="ckpt"):
    model = tiny_model("bert")
    add_gates(model)
    headwise.save_pretrained(model, tmp_path / name)
    return tmp_path / name


def test_the_manifest_lists_every_file_with_its_size_and_sha256(tmp_path):
    folder = _saved(tmp_path)
    files = json.loads((folder / MANIFEST).read_text())["files"]
    on_disk = {p.name for p in folder.iterdir()} - {MANIFEST}
    assert set(files) == on_disk and {"config.json", "model.safetensors"} <= on_disk
    for name, entry in files.items():  # against hashlib over the bytes, independently of the writer
        import hashlib

        data = (folder / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _tear(path):
    """Zero the last quarter of ``path`` in place: the size stays, the content does not (a torn copy)."""
    data = bytearray(path.read_bytes())
    data[-len(data) // 4:] = bytes(len(data) // 4)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, words", [
    (_tear, ["model.safetensors", "sha256", "torn"]),
    (lambda p: p.write_bytes(p.read_bytes()[:-100]), ["model.safetensors", "bytes where", "truncated"]),
    (lambda p: p.unlink(), ["model.safetensors", "is missing"]),
])
def test_a_damaged_weights_file_is_refused_naming_it(tmp_path, damage, words):
    folder = _saved(tmp_path)
    damage(folder / "model.safetensors")
    with pytest.raises(HeadwiseError) as err:
        headwise.from_pretrained(folder)
    message = str(err.value)
    assert len(message.splitlines()) == 1 and all(w in message for w in words), message
    assert "save the folder again" in message or "save one with" in message


def test_an_edited_config_is_refused(tmp_path):
    folder = _saved(tmp_path)
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text.replace('"hidden_act": "gelu"', '"hidden_act": "relu"'))
    assert (folder / "config.json").stat().st_size == len(text)  # same size: only the hash can tell
    with pytest.raises(HeadwiseError, match=r"config.json does not match its sha256"):
        headwise.from_pretrained(folder)


def test_hashes_are_checked_below_the_limit_or_with_verify(tmp_path, monkeypatch):
    folder = _saved(tmp_path)
    _tear(folder / "model.safetensors")
    monkeypatch.setattr(manifest, "HASH_LIMIT", 0)  # as if the folder were larger than the default limit
    assert manifest.verify_manifest(folder) is True  # sizes only: the torn file passes this check
    with pytest.raises(HeadwiseError, match="sha256"):
        headwise.from_pretrained(folder, verify=True)


def test_the_cli_refuses_a_torn_folder_in_one_line_and_takes_verify(tmp_path, capsys):
    folder = _saved(tmp_path)
    assert main(["sites", "--model", str(folder), "--verify"]) == 0
    capsys.readouterr()
    _tear(folder / "model.safetensors")
    assert main(["sites", "--model", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model.safetensors does not match its sha256" in err, err


def test_a_folder_written_before_the_manifest_loads_with_one_note(tmp_path, capsys):
    folder = _saved(tmp_path)
    (folder / MANIFEST).unlink()
    headwise.from_pretrained(folder)
    headwise.from_pretrained(folder)
    err = capsys.readouterr().err
    assert err.count(f"has no {MANIFEST}") == 1, err


def test_a_run_folder_lists_its_model_by_the_model_s_own_manifest(tmp_path):
    from headwise.io import atomic_dir

    with atomic_dir(tmp_path / "run") as tmp:
        headwise.save_pretrained(tiny_model("bert"), tmp / "model")
        (tmp / "summary.json").write_text("{}")
    files = json.loads((tmp_path / "run" / MANIFEST).read_text())["files"]
    assert sorted(files) == [f"model/{MANIFEST}", "summary.json"]
    assert files[f"model/{MANIFEST}"]["sha256"] == sha256_of(tmp_path / "run" / "model" / MANIFEST)


def _with_record(folder, change):
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))
    write_manifest(folder)  # sealed again, as a tool writing a bad record would: what is checked is the record


@pytest.mark.parametrize("change, words", [
    (lambda c: c["headwise"].update(version="2"), ["headwise.version is '2'; expected an int"]),
    (lambda c: c["headwise"].update(version=None), ["headwise.version is None"]),
    (lambda c: c.update(headwise=[1, 2]), ["headwise is a list, not a mapping"]),
    (lambda c: c["headwise"].update(journal=[7, {"method": 3, "version": "1", "config": None, "state": {}}]),
     ["headwise.journal[0] is a int, not a mapping", "headwise.journal[1].method is 3",
      "headwise.journal[1].version is '1'"]),
    (lambda c: c["headwise"].update(ops="gates", source=5), ["headwise.ops must be a list", "headwise.source is 5"]),
])
def test_a_bad_record_is_refused_one_line_per_problem(tmp_path, change, words):
    folder = _saved(tmp_path)
    _with_record(folder, change)
    with pytest.raises(HeadwiseError) as err:
        headwise.from_pretrained(folder)
    lines = str(err.value).splitlines()
    assert len(lines) == len(words) + 1, lines  # one line per problem, then the fix
    for word in words:
        assert any(word in line for line in lines), (word, lines)


def test_a_newer_record_is_refused_with_upgrade(tmp_path):
    folder = _saved(tmp_path)
    _with_record(folder, lambda c: c["headwise"].update(version=3))
    with pytest.raises(HeadwiseError, match="newer headwise .format 3.; upgrade headwise"):
        headwise.from_pretrained(folder)


@pytest.mark.parametrize("poison", ["weight", "gate"])
def test_non_finite_weights_or_gates_are_refused_naming_the_tensor(tmp_path, poison):
    model = tiny_model("bert")
    add_gates(model)
    name = f"encoder.layer.0.attention.{'self.headwise.output.gate' if poison == 'gate' else 'output.dense'}.weight"
    with torch.no_grad():
        model.state_dict()[name].view(-1)[0] = float("nan")
    headwise.save_pretrained(model, tmp_path / "nan")
    with pytest.raises(HeadwiseError, match=f"NaN or infinity \\({name}"):
        headwise.from_pretrained(tmp_path / "nan")


def test_a_sealed_causal_lm_refuses_plain_transformers_naming_headwise_and_loads_in_headwise(tmp_path):
    model = tiny_model("llama")
    lm = transformers.LlamaForCausalLM(model.config)
    headwise.prune_heads(lm, {"dec-self.0": [0, 1]})
    headwise.save_pretrained(lm, tmp_path / "lm")
    with pytest.raises(ValueError, match=f"{tmp_path / 'lm'} contains custom code"):  # load_with_headwise.py
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "lm", trust_remote_code=False)
    inputs, _ = tiny_inputs("llama")
    with torch.no_grad():
        expected = lm(**inputs).logits
        got = headwise.from_pretrained(tmp_path / "lm")(**inputs).logits
    torch.testing.assert_close(got, expected)
    # saved again, the record keeps the real model type and the seal
    headwise.save_pretrained(headwise.from_pretrained(tmp_path / "lm"), tmp_path / "again")
    saved = json.loads((tmp_path / "again" / "config.json").read_text())
    assert saved["model_type"] == checkpoint.SEALED and saved["headwise"]["model_type"] == "llama"
    assert saved["auto_map"] == checkpoint.auto_map() and (tmp_path / "again" / "load_with_headwise.py").is_file()
    assert headwise.models.native_task(str(tmp_path / "again")) == "lm"


def test_an_unedited_model_saves_a_folder_plain_transformers_loads(tmp_path):
    model = tiny_model("gpt2")
    headwise.save_pretrained(model, tmp_path / "plain")
    inputs, real = tiny_inputs("gpt2")
    with torch.no_grad():
        plain = transformers.AutoModel.from_pretrained(tmp_path / "plain")(**inputs).last_hidden_state
        torch.testing.assert_close(plain[real], model(**inputs).last_hidden_state[real])


def test_a_plain_export_is_verified_when_loaded_by_headwise_and_loads_in_transformers(tmp_path):
    from headwise.io import export_plain

    model = tiny_model("llama")
    headwise.prune_heads(model, {"dec-self.0": [0, 1], "dec-self.1": [2, 3]})  # one key/value group per layer
    export_plain(model, tmp_path / "plain")
    assert (tmp_path / "plain" / MANIFEST).is_file()
    inputs, real = tiny_inputs("llama")
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state[real]
        plain = transformers.AutoModel.from_pretrained(tmp_path / "plain")(**inputs).last_hidden_state[real]
    torch.testing.assert_close(plain, expected)
    loaded, _ = headwise.load_model(str(tmp_path / "plain"), with_tokenizer=False)
    _tear(tmp_path / "plain" / "model.safetensors")
    with pytest.raises(HeadwiseError, match="model.safetensors does not match its sha256"):
        headwise.load_model(str(tmp_path / "plain"), with_tokenizer=False)
