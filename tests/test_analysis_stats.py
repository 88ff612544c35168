"""HeadStats: merging, the stats.json schema, round trips, and the 2-process (gloo) all-reduce."""

from __future__ import annotations

import json
import math

import numpy as np
import torch
import torch.multiprocessing as mp

from headwise.analysis import HeadStats, analyze
from headwise.analysis.metrics import SIMILARITIES
from headwise.sites import find_sites
from test_analysis_support import loud_model, random_texts, word_tokenizer

TEXTS = random_texts(9, seed=5)
OPTIONS = dict(batch_size=2, examples=2, importance=("gradient", "ablation"), abs_scope="example", progress=False)


def _close(a, b, tol=1e-9):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _close(a[k], b[k], tol)
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _close(x, y, tol)
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, abs_tol=tol, rel_tol=0), (a, b)
    else:
        assert a == b


def test_merge_of_two_shards_equals_one_pass():
    model, tokenizer = loud_model("bert"), word_tokenizer("bert")
    whole = analyze(model, tokenizer, TEXTS, importance=("ablation",), examples=0, progress=False)
    first = analyze(model, tokenizer, TEXTS[:4], importance=("ablation",), examples=0, progress=False)
    second = analyze(model, tokenizer, TEXTS[4:], importance=("ablation",), examples=0, progress=False)
    _close(first.merge_(second).to_dict(), whole.to_dict(), 1e-6)


def test_to_dict_schema_and_json_round_trip(tmp_path):
    model = loud_model("gpt2")
    stats = analyze(model, word_tokenizer("gpt2"), TEXTS, **OPTIONS)
    doc = json.loads(stats.to_json(tmp_path / "stats.json").read_text())
    assert list(doc) == ["headwise_stats", "model", "data", "sentences", "tokens", "sites", "heads", "metric_info",
                         "histogram", "similarity", "examples"]
    assert doc["headwise_stats"] == 1 and doc["sentences"] == 9 and isinstance(doc["tokens"], int)
    rows, H = len(find_sites(model)), 4
    assert doc["sites"] == [s.describe() for s in find_sites(model)]
    assert set(doc["heads"]) == {"confidence", "confidence_no_special", "mhr_base", "mhr_advanced", "entropy",
                                 "distance", "special", "self", "prev", "next", "sparsity@0.0001", "sparsity@0.001",
                                 "sparsity@0.01", "sparsity@0.1", "importance_gradient", "importance_ablation"}
    assert set(doc["metric_info"]) == set(doc["heads"])
    for name, info in doc["metric_info"].items():
        assert set(info) == {"label", "description", "range", "higher"}
        assert info["higher"] in ("specialised", "important", None)
        assert np.array(doc["heads"][name]).shape == (rows, H)
        if info["range"] is not None:
            lo, hi = info["range"]
            assert all(lo - 1e-9 <= v <= hi + 1e-9 for row in doc["heads"][name] for v in row), name
    assert len(doc["histogram"]["edges"]) == 101
    counts = np.array(doc["histogram"]["counts"])
    assert counts.shape == (rows, H, 100) and np.allclose(counts.sum(-1), 1)
    assert set(doc["similarity"]) == set(SIMILARITIES)
    for table in doc["similarity"].values():
        assert np.array(table).shape == (rows, H, H)
    assert np.allclose([np.diag(np.array(m)) for m in doc["similarity"]["attention_cosine"]], 1)
    assert np.allclose([np.diag(np.array(m)) for m in doc["similarity"]["output_l2"]], 0)
    ex = doc["examples"][0]
    assert set(ex) == {"text", "tokens", "maps"}
    assert np.array(ex["maps"]).shape == (rows, H, len(ex["tokens"]), len(ex["tokens"]))
    assert np.allclose(np.array(doc["heads"]["importance_gradient"]) ** 2 @ np.ones(H), 1)  # rows L2-normalised
    again = HeadStats.from_dict(doc).to_dict()
    _close(again, doc, 1e-12)


def test_ragged_heads_are_left_out_of_the_json():
    stats = HeadStats.empty([{"name": "a", "path": "a", "num_heads": 3}, {"name": "b", "path": "b", "num_heads": 2}],
                            (0.1,))
    sums = {k: torch.ones(3) for k in ("confidence", "entropy")}
    stats.add_(0, {**sums, "n_rows": torch.tensor(2.0)})
    stats.add_(1, {k: v[:2] for k, v in sums.items()} | {"n_rows": torch.tensor(4.0)})
    doc = stats.to_dict()
    assert doc["heads"]["confidence"] == [[0.5, 0.5, 0.5], [0.25, 0.25]]
    assert doc["heads"]["mhr_base"] == [[None] * 3, [None] * 2]  # no data: null, not NaN
    assert torch.isnan(stats["confidence"][1, 2])


def _worker(rank: int, init: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        stats = analyze(loud_model("bert"), word_tokenizer("bert"), TEXTS, **OPTIONS)
        with open(f"{out}.{rank}", "w") as f:
            json.dump(stats.to_dict(), f)
    finally:
        dist.destroy_process_group()


def test_two_processes_give_the_one_process_statistics(tmp_path):
    single = analyze(loud_model("bert"), word_tokenizer("bert"), TEXTS, **OPTIONS).to_dict()
    out = str(tmp_path / "stats")
    mp.spawn(_worker, args=(f"file://{tmp_path}/init", out), nprocs=2, join=True)
    for rank in range(2):
        with open(f"{out}.{rank}") as f:
            doc = json.load(f)
        _close(doc.pop("examples"), single["examples"], 1e-4)  # maps are rounded to 5 decimals
        _close(doc, {k: v for k, v in single.items() if k != "examples"}, 1e-5)


def test_the_observed_pass_fills_no_cache_and_builds_the_last_position_s_logits_only():
    """``observed_call`` (the statistics pass) runs a causal LM that asks for a cache (``config.use_cache``) without
    one and with ``logits_to_keep=1``: no ``[B, T, V]`` logits; on ``meta`` it leaves the cache as the config says
    (``compat.no_cache``: without one, transformers reads position ids that meta tensors cannot give)."""
    import transformers as tf

    from headwise.analysis.attach import observed_call

    config = tf.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(config).eval()
    assert model.config.use_cache
    seen = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs.get("use_cache")),
                                    with_kwargs=True)
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(tuple(out.shape)))
    out = observed_call(model, {"input_ids": torch.randint(0, 50, (2, 9))})
    assert seen == [False, (2, 1, 50)] and out.past_key_values is None
    with torch.device("meta"):
        meta = tf.LlamaForCausalLM(config).eval()
    seen.clear()
    meta.register_forward_pre_hook(lambda module, args, kwargs: seen.append("use_cache" in kwargs), with_kwargs=True)
    assert observed_call(meta, {"input_ids": torch.zeros(2, 9, dtype=torch.long, device="meta")}).logits.shape == (
        2, 1, 50)
    assert seen == [False]
