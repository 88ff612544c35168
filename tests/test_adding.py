"""docs/adding.md is true: its steps alone, replayed in a copy of the tree, give a new built-in method its command
(``headwise edit``, with a help page built without torch and its examples), its place in the planner
(``headwise plan`` / ``headwise apply``), its entry in the docs index (``headwise methods``), the layer rules and the
method contract. The files are the doc's own code blocks (each opens with ``# src/headwise/...``); the one line is
the doc's step 5."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "adding.md"
BLOCK = re.compile(r"```python\n# (src/headwise/[\w/]+\.py)\n(.*?)```", re.S)


def documented_files() -> dict[str, str]:
    """``{path: text}`` of the doc's code blocks that are files of the new package."""
    return {path: text for path, text in BLOCK.findall(DOC.read_text(encoding="utf-8"))}


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of ``src/`` with the doc's steps applied: its four files and the one line."""
    root = tmp_path_factory.mktemp("tree")
    shutil.copytree(ROOT / "src" / "headwise", root / "src" / "headwise",
                    ignore=shutil.ignore_patterns("__pycache__"))
    files = documented_files()
    assert sorted(files) == [f"src/headwise/head_gain/{n}.py" for n in ("__init__", "config", "declaration", "method")]
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text, encoding="utf-8")
    assert '`"headwise.head_gain"` to `METHOD_PACKAGES` in `src/headwise/contract.py`' in DOC.read_text()
    contract = root / "src" / "headwise" / "contract.py"
    text = contract.read_text(encoding="utf-8")
    assert text.count("METHOD_PACKAGES = (") == 1
    contract.write_text(text.replace("METHOD_PACKAGES = (", 'METHOD_PACKAGES = ("headwise.head_gain", '),
                        encoding="utf-8")
    return root


def run(tree: Path, script: str, *args: str) -> dict:
    """Run ``script`` (prints one JSON line last) against the tree in a fresh process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree / "src"), str(ROOT / "tests")]), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, cwd=tree)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_only_the_package_and_the_one_line_differ_from_the_tree(tree):
    ours = {p.relative_to(ROOT / "src") for p in (ROOT / "src").rglob("*.py") if "__pycache__" not in p.parts}
    theirs = {p.relative_to(tree / "src") for p in (tree / "src").rglob("*.py") if "__pycache__" not in p.parts}
    assert {str(p) for p in theirs - ours} == {f"headwise/head_gain/{n}.py"
                                               for n in ("__init__", "config", "declaration", "method")}
    changed = [str(p) for p in ours & theirs if (ROOT / "src" / p).read_bytes() != (tree / "src" / p).read_bytes()]
    assert changed == ["headwise/contract.py"]


def test_the_new_package_keeps_the_layer_rules(tree):
    from test_import_layers import layer_of, layers, violations

    assert layer_of("headwise.head_gain.method", layers(tree / "src"))[0] == "methods"
    assert violations(tree / "src") == []


HELP = r"""
import contextlib, io, json, sys
from headwise.cli import main

from headwise.cli.methods import index

pages = {}
for argv in (["edit", "head_gain", "--help"], ["edit", "--help"], ["plan", "--help"]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(argv)
    pages[" ".join(argv)] = out.getvalue()
pages["index"] = index()  # the docs index (headwise methods) reads declarations only
pages["heavy"] = sorted(m for m in ("torch", "transformers", "numpy") if m in sys.modules)
print(json.dumps(pages))
"""


def test_its_help_examples_plan_page_and_docs_index_come_from_the_declaration_without_torch(tree):
    pages = run(tree, HELP)
    assert pages["heavy"] == []
    edit = pages["edit head_gain --help"]
    assert "--gain FLOAT" in edit and "the factor on each head's output" in edit
    assert "  headwise edit head_gain --gain 0.5 --kinds enc-self --out minilm-gain" in edit
    assert re.search(r"^ +head_gain +Multiply each selected head's output by gain\.", pages["edit --help"], re.M)
    assert "head_gain" in " ".join(pages["plan --help"].split())
    entry = next(e for e in pages["index"] if e["name"] == "head_gain")
    assert entry["package"] == "headwise.head_gain" and entry["planned"] == {"order": 60, "role": "alone"}
    assert entry["doc"] == "the docstring of headwise.head_gain"


WORK = r"""
import json, sys
import torch
import headwise
from headwise.cli import main
from headwise.contract import METHODS
from test_method_contract import check_contract
from tiny import tiny_model

bert, stsb, out = sys.argv[1:4]
result = {"contract": [f for f in ("bert", "gpt2", "llama") if check_contract("head_gain", f)]}
result["edit"] = main(["edit", "head_gain", "--model", bert, "--gain", "0.5", "--kinds", "enc-self",
                       "--out", out + "/edited"])
reference = headwise.load_model(bert)[0]
headwise.apply(reference, METHODS["head_gain"].config(gain=0.5))
reloaded = headwise.from_pretrained(out + "/edited/model")
ids = torch.tensor([[2, 5, 7, 9, 3]])
with torch.no_grad():
    result["same"] = bool(torch.equal(reloaded(input_ids=ids).last_hidden_state,
                                      reference(input_ids=ids).last_hidden_state))
result["plan"] = main(["plan", "--model", bert, "--task", "stsb", "--data", stsb, "--budget", "latency=10x",
                       "--methods", "head_gain", "--repeats", "1", "--calibration-limit", "8", "--out", out + "/plan"])
plan = json.load(open(out + "/plan/plan.json"))
result["points"] = {p["name"]: p["methods"] for p in plan["points"]}
result["apply"] = main(["apply", out + "/plan/plan.json", "--point", "gain-0.5", "--model", bert, "--no-eval",
                        "--out", out + "/applied"])
print(json.dumps(result))
"""


def test_it_is_applied_saved_reloaded_planned_and_keeps_the_contract(tree, tmp_path):
    import transformers as tf

    from test_planning import VOCAB, sentence
    from headwise.tasks import train_tokenizer

    bert = tmp_path / "bert"
    tf.AutoModel.from_config(tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=37, vocab_size=VOCAB)).save_pretrained(bert)
    tokenizer = train_tokenizer([sentence(i) for i in range(200)], vocab_size=80, min_frequency=1)
    tokenizer.model_max_length = 64
    tokenizer.save_pretrained(bert)
    stsb = tmp_path / "stsb"
    stsb.mkdir()
    for split, n in (("train", 40), ("dev", 24)):
        rows = [f"g\tf\t2015\t{i:04d}\t{(i * 37 % 50) / 10}\t{sentence(i)}\t{sentence(i + 3)}" for i in range(n)]
        (stsb / f"sts-{split}.tsv").write_text("\n".join(rows) + "\n")
    result = run(tree, WORK, str(bert), str(stsb), str(tmp_path))
    assert result["contract"] == ["bert", "gpt2", "llama"]
    assert result["edit"] == 0 and result["same"]
    assert result["plan"] == 0 and result["points"]["gain-0.5"] == ["head_gain"]
    assert result["apply"] == 0 and (tmp_path / "applied" / "model").is_dir()


def test_every_declared_doc_page_exists():
    from headwise.contract import declarations

    for d in declarations().values():
        page = d.doc.partition("#")[0]
        assert not page or (ROOT / page).is_file(), f"{d.name}: {d.doc} does not exist"
