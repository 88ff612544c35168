import json
import subprocess
import sys

import pytest
import torch
import transformers as tf
from tiny import FAMILIES, tiny_inputs, tiny_model

import headwise
from headwise.io.manifest import write_manifest
from headwise.runtime import add_gates


def _randomise_gates(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for gate in add_gates(model).values():
            gate.weight.copy_(torch.rand(gate.weight.shape, generator=g))


@pytest.mark.parametrize("family", FAMILIES)
def test_save_reload_gated_model_is_exact(family, tmp_path):
    model = tiny_model(family)
    _randomise_gates(model)
    inputs, _ = tiny_inputs(family)
    with torch.no_grad():
        before = model(**inputs).last_hidden_state
    headwise.save_pretrained(model, tmp_path / "ckpt")
    loaded = headwise.from_pretrained(tmp_path / "ckpt")
    assert loaded.config._attn_implementation == "headwise"
    assert set(loaded.state_dict()) == set(model.state_dict())
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).last_hidden_state, before)


def test_tied_lm_head_survives_reload(tmp_path):
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tiny_model("gpt2").config).eval()
    headwise.enable(model)
    _randomise_gates(model)
    headwise.save_pretrained(model, tmp_path / "lm")
    loaded = headwise.from_pretrained(tmp_path / "lm")
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()
    ids = torch.randint(2, 90, (2, 6))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_refuses_to_overwrite_without_consent(tmp_path):
    model = tiny_model("bert")
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(headwise.HeadwiseError, match="not empty"):
        headwise.save_pretrained(model, out)
    assert (out / "notes.txt").read_text() == "mine"
    headwise.save_pretrained(model, out, overwrite=True)
    assert not (out / "notes.txt").exists() and (out / "model.safetensors").exists()


def test_failed_save_leaves_nothing_behind(tmp_path):
    model = tiny_model("bert")
    site = headwise.find_sites(model)[0]
    from headwise.runtime import attach

    attach(site, "output", "unsaveable", torch.nn.Identity())
    with pytest.raises(headwise.HeadwiseError, match="cannot be saved"):
        headwise.save_pretrained(model, tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


def test_plain_folder_is_not_a_headwise_checkpoint(tmp_path):
    with pytest.raises(headwise.HeadwiseError, match="not a headwise checkpoint"):
        headwise.from_pretrained(tmp_path)


def test_damaged_checkpoint_is_refused(tmp_path):
    model = tiny_model("bert")
    add_gates(model)
    headwise.save_pretrained(model, tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    config["headwise"]["ops"] = config["headwise"]["ops"][1:]  # one gate's weights become unexpected
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    write_manifest(tmp_path / "ckpt")  # the edit sealed as if headwise wrote it: what is checked is the record
    with pytest.raises(headwise.HeadwiseError, match="unexpected"):
        headwise.from_pretrained(tmp_path / "ckpt")



def test_checkpoint_op_on_a_site_the_model_lacks_is_refused(tmp_path):
    model = tiny_model("bert")
    add_gates(model)
    headwise.save_pretrained(model, tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    config["headwise"]["ops"][0]["site"] = "encoder.layer.9.attention.self"
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    write_manifest(tmp_path / "ckpt")  # the edit sealed as if headwise wrote it: what is checked is the record
    with pytest.raises(headwise.HeadwiseError, match=r"an op names site 'encoder.layer.9.attention.self', absent"):
        headwise.from_pretrained(tmp_path / "ckpt")


@pytest.mark.parametrize("record", [
    {"kind": "gqa_kv_heads", "kv_heads": {"nope": 1}},
    {"kind": "latent_kv", "sites": {"nope": {"rank": 2, "rope_rows": 0}}},
    {"kind": "fold_mixing", "sites": ["nope"], "nuclear_norms": {"nope": 1.0}},
    {"kind": "prune_heads", "heads": {"nope": [0]}},
])
def test_edit_naming_a_site_the_model_lacks_is_refused_untouched(record):
    from headwise.contract import replay, upgrade_edits

    model = tiny_model("bert")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(headwise.HeadwiseError, match=f"edit {record['kind']} names site 'nope', absent from the model"):
        replay(model, upgrade_edits([record], "test"), "test")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_recorded_sites_maps_every_path():
    model = tiny_model("bert")
    paths = [s.path for s in headwise.find_sites(model)]
    assert list(headwise.sites.recorded_sites(model, paths[:2], "test")) == paths

FRESH_PROCESS = """
import sys, torch, headwise
model, tok = headwise.load_model(sys.argv[1])
batch = tok(["A man is playing a guitar.", "Two dogs run on the beach in the sun."], padding=True, return_tensors="pt")
with torch.no_grad():
    torch.save(model(**batch).last_hidden_state, sys.argv[2])
"""


def test_gated_minilm_reloads_bit_identical_in_a_fresh_process(minilm, tmp_path):
    import copy

    model, tokenizer = minilm
    model = copy.deepcopy(model)
    _randomise_gates(model, seed=3)
    batch = tokenizer(["A man is playing a guitar.", "Two dogs run on the beach in the sun."], padding=True,
                      return_tensors="pt")
    with torch.no_grad():
        expected = model(**batch).last_hidden_state
    headwise.save_pretrained(model, tmp_path / "gated", tokenizer=tokenizer)
    subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(tmp_path / "gated"), str(tmp_path / "out.pt")],
                   check=True)
    assert torch.equal(torch.load(tmp_path / "out.pt"), expected)


def test_ops_of_packages_not_imported_yet_reload_in_a_fresh_process(tmp_path):
    import headwise.mechanisms

    model = tiny_model("bert")
    headwise.mechanisms.use(model, "linear")
    headwise.save_pretrained(model, tmp_path / "m")
    code = ("import sys, headwise; m = headwise.from_pretrained(sys.argv[1]); "
            "assert 'headwise.mechanisms' in sys.modules; print(type(m).__name__)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m")], capture_output=True, text=True,
                         env={"HF_HUB_OFFLINE": "1", "PATH": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "BertModel"


def test_a_package_reads_as_an_attribute_after_import_headwise_alone():
    """``import headwise; headwise.io.export_plain`` in a fresh process (no other headwise import first), with
    every method registered as for a public name; a name that is neither is still an AttributeError."""
    code = ("import sys, headwise; assert 'headwise.io' not in sys.modules; f = headwise.io.export_plain; "
            "from headwise.contract import METHODS; assert 'prune_heads' in METHODS\n"
            "try:\n    headwise.no_such_name\nexcept AttributeError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"HF_HUB_OFFLINE": "1", "PATH": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "module 'headwise' has no attribute 'no_such_name'"
