"""Plans are bound to the model they were made on (a fingerprint of its sites and heads), and bad plan.json or
mask files are refused with one line."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tf
from tiny import VOCAB

from headwise.errors import HeadwiseError
from headwise.planning import Plan
from plan_edits import edit
from headwise.planning.plan import Point, fingerprint
from headwise.pruning import prune_heads
from headwise.pruning.masks import load_masks
from headwise.sites import find_sites


def tiny_bert():
    torch.manual_seed(0)
    config = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                           vocab_size=VOCAB)
    return tf.AutoModel.from_config(config, attn_implementation="headwise").eval()


def hand_plan(model) -> Plan:
    first = find_sites(model)[0].name
    points = [Point("base", "base", [], edit(), {"score": 80.0}),
              Point("heads-7", "single", ["prune_heads"], edit(prune={first: [1]}), {"score": 79.0})]
    return Plan(model="tiny-bert", task={"name": "stsb", "options": {}, "metric": "spearman",
                                         "higher_is_better": True},
                budget={}, settings={"recover": "none"}, points=points, proxies={}, layers={}, recommended="heads-7",
                fingerprint=fingerprint(model))


def test_the_fingerprint_reads_sites_and_heads():
    model = tiny_bert()
    got = fingerprint(model)
    assert [s["heads"] for s in got["sites"].values()] == [4, 4] and len(got["hash"]) == 16
    assert fingerprint(tiny_bert()) == got
    prune_heads(model, {find_sites(model)[1].name: [0]})
    assert fingerprint(model)["hash"] != got["hash"]


def test_apply_refuses_another_model_and_names_what_differs(tmp_path):
    model = tiny_bert()
    plan = hand_plan(model)
    plan.save(tmp_path / "plan.json")
    again = Plan.load(tmp_path / "plan.json")
    assert again.fingerprint == plan.fingerprint and again.check_model(tiny_bert()) is None
    pruned = tiny_bert()
    site = find_sites(pruned)[0].name
    prune_heads(pruned, {site: [0, 2]})
    with pytest.raises(HeadwiseError, match=rf"another model than this one \({site} heads: planned 4, model 2;"):
        again.execute(pruned)
    assert find_sites(pruned)[0].num_heads == 2  # nothing was done
    wider = tf.AutoModel.from_config(tf.BertConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                                   intermediate_size=37, vocab_size=VOCAB))
    with pytest.raises(HeadwiseError, match="in the model, not planned"):
        again.check_model(wider)


def test_a_plan_written_before_fingerprints_still_loads_and_says_it_cannot_check(tmp_path):
    data = hand_plan(tiny_bert()).to_dict()
    del data["fingerprint"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = Plan.load(tmp_path / "old.json")
    assert old.fingerprint is None and "cannot check" in old.check_model(tiny_bert())
    model = tiny_bert()
    old.execute(model)
    assert find_sites(model)[0].num_heads == 3


def mutate(data, how):
    data = json.loads(json.dumps(data))
    how(data)
    return data


BAD_PLANS = [
    (lambda d: [d], "is a JSON list, not an object"),
    (lambda d: {k: v for k, v in d.items() if k != "points"}, "'points' is missing"),
    (lambda d: mutate(d, lambda x: x.update(points={})), "'points' is dict, not a list"),
    (lambda d: mutate(d, lambda x: x["points"][1]["edit"][0]["config"].update(heads={"enc-self.0": "abc"})),
     r"point 'heads-7': edit record 0: .*heads=\{'enc-self.0': 'abc'\} \(expected dict\[str, list\[int\]\]\)"),
    (lambda d: mutate(d, lambda x: x["points"][1]["edit"].append({"method": "gqa", "version": 1,
                                                                  "config": {"kv_heads": "2"}})),
     r"edit record 1: .*kv_heads='2' \(expected int\)"),
    (lambda d: mutate(d, lambda x: x["points"][1]["edit"].append({"method": "nope", "version": 1, "config": {}})),
     "edit record 1: no method 'nope'"),
    (lambda d: mutate(d, lambda x: x["points"][1].update(edit={"prune": {}})), "edit is a dict, not a list"),
    (lambda d: mutate(d, lambda x: x.update(schema="headwise.plan/1")), "format 1 .* re-run headwise plan"),
    (lambda d: mutate(d, lambda x: x["points"][1].pop("measured")), "point 'heads-7' has no measured"),
    (lambda d: mutate(d, lambda x: x["points"].append(7)), "a point is a int, not a mapping"),
    (lambda d: mutate(d, lambda x: x.update(recommended="nope")), "recommends 'nope', which is none"),
    (lambda d: mutate(d, lambda x: x.update(task="stsb")), "'task' is str, not a mapping"),
    (lambda d: mutate(d, lambda x: x.update(fingerprint=[1])), "fingerprint must be"),
]


@pytest.mark.parametrize("damage, message", BAD_PLANS)
def test_bad_plan_files_give_one_line(tmp_path, damage, message):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(damage(hand_plan(tiny_bert()).to_dict())))
    with pytest.raises(HeadwiseError, match=message) as err:
        Plan.load(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_latin1_and_broken_json_plans_give_one_line(tmp_path):
    path = tmp_path / "plan.json"
    path.write_bytes('{"model": "Caf\u00e9"}'.encode("latin-1"))
    with pytest.raises(HeadwiseError, match="UTF-8") as err:
        Plan.load(path)
    assert "\n" not in str(err.value)
    path.write_text('{"schema": ')
    with pytest.raises(HeadwiseError, match="is not JSON"):
        Plan.load(path)


@pytest.mark.parametrize("text, message", [
    ("enc-self: [[1, 0]\n  - x: :\n", r"m.yaml:\d+:\d+: not valid YAML"),
    ("a: b: c\n", r"m.yaml:1:\d+: not valid YAML"),
    ("- 1\n- 2\n", "must hold a mapping"),
])
def test_malformed_yaml_masks_give_one_line(tmp_path, text, message):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(HeadwiseError, match=message) as err:
        load_masks(path)
    assert "\n" not in str(err.value)


def test_a_plan_naming_any_method_loads_in_a_fresh_process_that_imported_only_the_planner(tmp_path):
    """Reading a record registers every built-in method first (``contract.load_methods``): a plan that names
    ``collaborative`` loads though nothing imported headwise.collaborative."""
    import subprocess
    import sys

    data = hand_plan(tiny_bert()).to_dict()
    data["points"][1]["edit"].append({"method": "collaborative", "version": 1,
                                      "config": {"dk": 0.5, "selection": {"kinds": None, "layers": None,
                                                                          "names": None}}})
    (tmp_path / "plan.json").write_text(json.dumps(data))
    code = ("from headwise.planning import Plan; import sys; "
            "print(Plan.load(sys.argv[1]).point('heads-7').edit.describe())")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "plan.json")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "remove 1 heads + collaborative heads dk=50% of the heads' width"


@pytest.mark.parametrize("method, config, message", [
    ("collaborative", {"dk": "x"}, r"dk='x' \(expected int \| float\)"),
    ("quantization", {"bits": "3"}, r"bits='3' \(expected int\)"),
    ("replace", {"mechanism": "local", "args": []}, r"args=\[\] \(expected dict"),
    ("gqa", {"kv_heads": 2, "grouping": "zzz"}, "grouping='zzz' .*Literal"),
    ("gqa", {"kv_heads": 2, "ridge": "r"}, r"ridge='r' \(expected float\)"),
])
def test_a_record_with_a_field_of_the_wrong_type_is_refused_in_one_line(method, config, message):
    """Records come from files (plan.json, edit.json): a value the config's type cannot hold is refused at read,
    not met later as a crash in the middle of an edit."""
    from headwise.contract import config_from_dict

    with pytest.raises(HeadwiseError, match=message) as err:
        config_from_dict({"method": method, "version": 1, "config": config})
    assert "\n" not in str(err.value)
