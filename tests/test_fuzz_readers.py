"""Fuzzed readers: random bytes, random JSON and random CSV/TSV/JSONL cells into every data reader (STS-B, lm text,
classification, translation corpora, mask files, plan.json, the ``--json`` document finder). Each gives a right
answer (checked against what was written) or raises ``HeadwiseError`` with a one-line message, never another
exception."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
import torch
import transformers as tf
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from headwise.cli import _json_start
from headwise.errors import HeadwiseError
from headwise.planning import Plan
from plan_edits import edit
from headwise.planning.plan import Point, fingerprint
from headwise.pruning.masks import load_masks, resolve_masks
from headwise.sites import find_sites
from headwise.tasks import Classification, LanguageModeling, read_corpus, read_stsb
from tiny import VOCAB

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
CELL = st.one_of(st.sampled_from(["", " ", "0", "1", "2", "-1", "1.5", "nan", "inf", "-inf", "5", "5.01", "x",
                                  "pos", "a\tb", 'q"uote', "a,b", "é", "\u2028", "\x00"]),
                 st.text(max_size=8))
JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 20) | st.floats(allow_nan=True, allow_infinity=True)
                    | st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                max_size=4),
                    max_leaves=12)


def one_line(call):
    """``call()``'s result, or None when it raised a one-line ``HeadwiseError``; any other exception fails."""
    try:
        result = call()
    except HeadwiseError as err:
        assert "\n" not in str(err) and str(err), repr(str(err))
        event("refused")
        return None
    event("read")
    return result


def write(path, data: bytes | str):
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def text_or_bytes(rows_strategy):
    return st.one_of(st.binary(max_size=200), rows_strategy)


# ---- STS-B --------------------------------------------------------------------------------------------------------
SCORE = st.one_of(st.sampled_from(["0", "1.5", "5", "3.25", "nan", "inf", "6", "-0.1", ""]),
                  st.floats(0, 5).map(str))
SENTENCE = st.one_of(st.sampled_from(["a cat sits", "two dogs", "a man", "", " "]), CELL)
STSB_ROWS = st.one_of(
    st.lists(st.lists(CELL, min_size=0, max_size=8), max_size=6).map(
        lambda rows: "".join("\t".join(r) + "\n" for r in rows)),
    st.lists(st.tuples(SCORE, SENTENCE, SENTENCE), min_size=1, max_size=6).map(
        lambda rows: "".join(f"g\tf\t2012\t{i:04d}\t{sc}\t{a}\t{b}\n" for i, (sc, a, b) in enumerate(rows))))


@FUZZ
@given(data=text_or_bytes(STSB_ROWS))
def test_stsb_reader(folder, data):
    path = write(folder / "sts-dev.tsv", data)
    pairs = one_line(lambda: read_stsb("dev", path))
    if pairs is not None:
        lines = path.read_text(encoding="utf-8").splitlines()
        assert len(pairs) == len(lines) > 0
        assert all(0 <= s <= 5 for s in pairs.scores)
        assert all(a.strip() and b.strip() for a, b in zip(pairs.first, pairs.second))


# ---- language-modelling text ---------------------------------------------------------------------------------------
@FUZZ
@given(data=text_or_bytes(st.lists(CELL, max_size=12).map("\n".join)))
def test_lm_text_reader(folder, data):
    path = write(folder / "text.txt", data)
    task = LanguageModeling(data=str(path), max_length=8)
    lines = one_line(lambda: task.texts("eval"))
    if lines is not None:
        every = path.read_text(encoding="utf-8").splitlines()
        assert lines == every[int(len(every) * 0.9):] and any(line.strip() for line in lines)


# ---- classification -----------------------------------------------------------------------------------------------
def table_text(suffix: str, header: list[str], rows: list[list[str]]) -> str:
    if suffix == ".jsonl":
        return "".join(json.dumps(dict(zip(header, r))) + "\n" for r in rows)
    out = io.StringIO()
    writer = csv.writer(out, delimiter="\t" if suffix == ".tsv" else ",")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


GOOD_LABEL = st.one_of(st.sampled_from(["pos", "neg"]), st.sampled_from(["1", "2", "2.0"]), st.sampled_from(["-1", "1"]))
LABEL = st.one_of(GOOD_LABEL, GOOD_LABEL, GOOD_LABEL, GOOD_LABEL, GOOD_LABEL,
                  st.sampled_from(["", "nan", "inf", "0.5", "mid"]), CELL)
TABLES = st.one_of(
    st.tuples(st.sampled_from([".csv", ".tsv", ".jsonl"]),
              st.lists(st.sampled_from(["text", "label", "pair", "x"]), min_size=1, max_size=3, unique=True),
              st.lists(st.lists(CELL, max_size=4), max_size=12)),
    st.tuples(st.sampled_from([".csv", ".tsv", ".jsonl"]), st.just(["text", "label"]),
              st.lists(st.tuples(SENTENCE, LABEL).map(list), min_size=2, max_size=14)))


@FUZZ
@given(table=TABLES, raw=st.one_of(st.none(), st.none(), st.none(), st.binary(max_size=120),
                                   st.lists(JSON, max_size=4)))
def test_classification_reader(folder, table, raw):
    suffix, header, rows = table
    path = folder / f"data{suffix}"
    if raw is None:
        write(path, table_text(suffix, header, rows))
    elif isinstance(raw, bytes):
        write(path, raw)
    else:
        write(path, "".join(json.dumps(v) + "\n" for v in raw))
    task = Classification(data=str(path))
    if one_line(task.check) is None:
        return
    names = one_line(lambda: None if task.is_regression() else task.label_names())
    if names is not None:
        assert len(names) >= 2 and len(set(names)) == len(names)
        assert all(n.strip() for n in names)
        numbers = [float(n) for n in names if _is_number(n)]
        assert all(math.isfinite(x) for x in numbers)
        if len(numbers) == len(names):
            assert numbers == sorted(numbers)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# ---- translation corpora ------------------------------------------------------------------------------------------
@FUZZ
@given(src=text_or_bytes(st.lists(CELL, max_size=5).map("\n".join)),
       tgt=text_or_bytes(st.lists(CELL, max_size=5).map("\n".join)))
def test_translation_reader(folder, src, tgt):
    write(folder / "train.src", src)
    write(folder / "train.tgt", tgt)
    corpus = one_line(lambda: read_corpus(folder, "train"))
    if corpus is not None:
        assert corpus.source == (folder / "train.src").read_text(encoding="utf-8").splitlines()
        assert len(corpus.source) == len(corpus.target)


# ---- mask files ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    return tf.AutoModel.from_config(tf.BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                                  intermediate_size=20, vocab_size=VOCAB))


YAMLISH = st.lists(st.sampled_from(["enc-self:", "  - [1, 0]", "- [0, 1]", "enc-self.0: [1, 1]", "a: b: c", "[",
                                    "{", "enc-self: [[1, 0], [1, 1]]", "  x", ":", "'", "enc-self.1: [1, 0, 1]"]),
                   max_size=5).map("\n".join)


@FUZZ
@given(suffix=st.sampled_from([".json", ".yaml"]),
       data=st.one_of(st.binary(max_size=120), YAMLISH, JSON.map(json.dumps),
                      st.dictionaries(st.sampled_from(["enc-self", "enc-self.0", "enc-self.1", "dec"]),
                                      st.lists(st.one_of(st.integers(-1, 2), st.lists(st.integers(0, 1), max_size=3)),
                                               max_size=3), max_size=2).map(json.dumps)))
def test_mask_reader(folder, bert, suffix, data):
    path = write(folder / f"mask{suffix}", data)
    spec = one_line(lambda: load_masks(path))
    if spec is not None:
        assert isinstance(spec, dict) and spec
        resolved = one_line(lambda: resolve_masks(bert, spec))
        if resolved is not None:
            heads = {s.path: s.num_heads for s in find_sites(bert)}
            assert all(len(row) == heads[p] and set(row) <= {0.0, 1.0} for p, row in resolved.items())


# ---- plan.json ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plan_dict(bert):
    site = find_sites(bert)[0].name
    points = [Point("base", "base", [], edit(), {"score": 80.0}),
              Point("heads-3", "single", ["prune_heads"], edit(prune={site: [1]}), {"score": 79.0})]
    return Plan(model="tiny", task={"name": "stsb", "options": {}, "metric": "spearman", "higher_is_better": True},
                budget={}, settings={"recover": "none"}, points=points, proxies={}, layers={},
                recommended="heads-3", fingerprint=fingerprint(bert)).to_dict()


def replace_at(value, path: list, new):
    """A copy of ``value`` with the entry at ``path`` (keys/indices, taken modulo) replaced by ``new``."""
    if not path or not isinstance(value, (dict, list)) or not value:
        return new
    keys = list(value) if isinstance(value, dict) else list(range(len(value)))
    key = keys[path[0] % len(keys)]
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[key] = replace_at(value[key], path[1:], new)
    return copy


@FUZZ
@given(path=st.lists(st.integers(0, 30), max_size=5), new=JSON, raw=st.one_of(st.none(), st.binary(max_size=80)))
def test_plan_reader(folder, bert, plan_dict, path, new, raw):
    file = folder / "plan.json"
    write(file, raw if raw is not None else json.dumps(replace_at(plan_dict, path, new)))
    plan = one_line(lambda: Plan.load(file))
    if plan is not None:
        assert plan.base.kind == "base"
        if one_line(lambda: plan.check_model(bert)) is None:
            return
        point = plan.recommended_point
        if point is not None:
            assert all(isinstance(h, int) for c in point.edit.configs if hasattr(c, "heads")
                       for heads in c.heads.values() for h in heads)


# ---- the --json document finder -------------------------------------------------------------------------------------
@FUZZ
@given(noise=st.text(max_size=40), value=JSON)
def test_json_document_finder(noise, value):
    text = noise + "\n" + json.dumps(value)
    start = _json_start(text)
    assert 0 <= start <= len(text)
    if start < len(text):
        json.loads(text[start:])
