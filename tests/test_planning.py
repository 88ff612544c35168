"""``headwise.plan`` / ``headwise apply``: budgets, the cost model against hand counts, the measured front, plan
round-trips, apply reproducing the measured score, and the two verbs end to end on tiny models."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random

import pytest
import torch
import transformers as tf
from peak_bytes import peak_tensor_bytes
from tiny import VOCAB, tiny_model

import headwise
from headwise.cli import main
from headwise.planning import Budget, Plan, front, static_costs
from headwise.planning.pareto import dominates
from headwise.tasks import get_task, train_tokenizer

WORDS = "the a cat dog sat on mat ran to house big small red blue tree sun".split()


def sentence(i: int, n: int = 6) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n + i % 3))


@pytest.fixture(scope="module")
def tokenizer():
    tok = train_tokenizer([sentence(i) for i in range(200)], vocab_size=80, min_frequency=1)
    tok.model_max_length = 64
    return tok


@pytest.fixture(scope="module")
def stsb_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stsb")
    for split, n in (("train", 40), ("dev", 24)):
        rows = [f"g\tf\t2015\t{i:04d}\t{(i * 37 % 50) / 10}\t{sentence(i)}\t{sentence(i + 3)}" for i in range(n)]
        (folder / f"sts-{split}.tsv").write_text("\n".join(rows) + "\n")
    return folder


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("lm") / "text.txt"
    path.write_text("\n".join(sentence(i) for i in range(60)) + "\n")
    return path


def tiny_bert():
    torch.manual_seed(0)
    config = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                           vocab_size=VOCAB)
    return tf.AutoModel.from_config(config, attn_implementation="headwise").eval()


def tiny_llama_lm():
    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=37, vocab_size=VOCAB, max_position_embeddings=64)
    return tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise").eval()


FAST = dict(repeats=1, examples=16, calibration=8, progress=False)


# ---- budgets ------------------------------------------------------------------------------------------------
def test_budget_parses_every_axis_and_form():
    b = Budget.parse("heads=36,latency=0.75x,params=-20%,kv-cache=-50%,flops=70%")
    assert (b.heads, b.latency, b.params, b.kv_cache, b.flops) == (36, 0.75, 0.8, 0.5, 0.7)
    assert Budget.parse("heads=0.5").head_count(72) == 36 and Budget.parse("heads=50%").head_count(72) == 36
    assert Budget.parse({"latency": "0.9"}).latency == 0.9
    assert Budget.parse(str(b)) == b


@pytest.mark.parametrize("text, words", [
    ("speed=2x", "unknown axis"), ("heads", "axis=value"), ("latency=fast", "ratio"), ("params=-120%", "(0, 1]"),
    ("heads=3,heads=4", "twice"), ("", "empty"), ("params=0.8x,flops=-20", "percentage"), ("heads=2.5", "head count"),
])
def test_bad_budgets_are_refused_with_the_fix(text, words):
    with pytest.raises(headwise.HeadwiseError, match=words.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        Budget.parse(text)


def test_impossible_budgets_are_refused_before_any_work():
    bert = tiny_model("bert")  # 2 layers × 4 heads
    with pytest.raises(headwise.HeadwiseError, match="fewer than the 2 attention layers.*allow-empty-layers"):
        Budget.parse("heads=1").validate(bert)
    Budget.parse("heads=1").validate(bert, allow_empty_layers=True)
    with pytest.raises(headwise.HeadwiseError, match="only 8 heads"):
        Budget.parse("heads=9").validate(bert)
    with pytest.raises(headwise.HeadwiseError, match="no decoder self-attention.*kv-cache"):
        Budget.parse("kv-cache=-50%").validate(bert)
    Budget.parse("kv-cache=-50%").validate(tiny_model("llama"))


def test_budget_shares_and_load_by_hand():
    b = Budget.parse("heads=36,latency=0.8x,params=-50%")
    base = {"heads": 72, "attention_params": 1000, "kv_bytes": 0, "flops": 10}
    point = {"heads": 18, "latency": 0.9, "attention_params": 250, "kv_bytes": 0, "flops": 5}
    assert b.shares(point, base) == pytest.approx({"heads": 0.5, "latency": 1.125, "params": 0.5})
    assert b.load(point, base) == pytest.approx(1.125) and b.violations(point, base) == ["latency"]
    assert b.shares({**point, "latency": None}, base)["latency"] == float("inf")
    assert Budget.parse("heads=72").load(base, base) == pytest.approx(1.0)


def test_finalists_measure_the_best_and_the_cheapest_pair_of_each_level():
    """Prediction says every collaborative pair is slower than its pruning (dk alone timed 1.0-1.2x on the whole
    model); the cheapest pair of each level is still measured, next to the best-scoring one."""
    from headwise.contract import METHODS
    from headwise.planning.candidates import Candidate
    from headwise.planning.search import finalists
    from plan_edits import edit

    base = {"score": 90.0, "heads": 8, "latency": 1.0, "attention_params": 100, "flops": 100, "kv_bytes": 0}
    prunes = [(Candidate(f"prune-{h}", METHODS["prune_heads"], edit(prune={"enc-self.0": list(range(8 - h))})),
               {**base, "score": 90.0 - (8 - h), "heads": h, "latency": 0.6 + 0.05 * h,
                "attention_params": 12.5 * h, "flops": 12.5 * h}) for h in (6, 4)]
    others = [(Candidate(f"dk-{f:g}", METHODS["collaborative"], edit(dk=f)),
               {**base, "score": 90.0 - (1 - f), "latency": 0.9 + 0.4 * f, "attention_params": 100 * f,
                "flops": 100 * f})
              for f in (0.75, 0.25)]
    chosen = [name for name, *_ in finalists(prunes, others, base, Budget.parse("latency=0.75x"), 1.0, top_k=1)]
    assert chosen[0] == "prune-6+dk-0.75"  # nothing fits: the best predicted score among the misses
    assert set(chosen) == {"prune-4+dk-0.75", "prune-6+dk-0.75", "prune-6+dk-0.25", "prune-4+dk-0.25"}


# ---- costs against hand counts -------------------------------------------------------------------------------
def test_costs_of_bert_match_hand_counts_before_and_after_removal():
    bert = tiny_model("bert")  # hidden 32, 4 heads of 8, biases everywhere
    c = static_costs(bert, length=7)
    assert c.heads == 8 and c.kv_bytes == 0
    assert c.attention_params == 2 * 4 * (32 * 32 + 32)
    per_token = 2 * 4 * 32 * 32 + 2 * 4 * (8 + 8) * 7  # projections + QKᵀ and A·V over 7 keys
    assert c.flops == 2 * 7 * per_token
    headwise.prune_heads(bert, {"enc-self.0": [1]})
    c = static_costs(bert, length=7)
    layer0 = 3 * (24 * 32 + 24) + (32 * 24 + 32)
    assert c.heads == 7 and c.attention_params == layer0 + 4 * (32 * 32 + 32)
    assert c.flops == 7 * (2 * 4 * 24 * 32 + 2 * 3 * 16 * 7) + 7 * per_token


@pytest.mark.parametrize("dtype, size", [(torch.float32, 4), (torch.float16, 2), (torch.bfloat16, 2)])
def test_kv_bytes_of_a_gqa_decoder_by_hand(dtype, size):
    llama = tiny_model("llama").to(dtype)  # 2 layers, 2 KV heads of 8
    c = static_costs(llama, length=10)
    assert c.kv_bytes == 2 * (2 * 8 + 2 * 8) * size
    assert c.attention_params == 2 * (32 * 32 + 2 * 32 * 16 + 32 * 32)
    assert c.flops == 2 * 10 * (2 * 3072 + 2 * 4 * 16 * 5.5)  # causal: (10 + 1) / 2 keys on average
    headwise.convert_gqa(llama, kv_heads=1, init="mean")
    assert static_costs(llama, length=10).kv_bytes == 2 * (8 + 8) * size


def test_a_local_window_and_collaborative_heads_are_costed_by_their_methods_hooks():
    """What the shapes do not show comes from the methods' cost hooks: a local window shortens the key span
    (replace's hook), collaborative heads score at their shared width plus one tag per head (collaborative's)."""
    bert = tiny_model("bert")
    headwise.replace_attention(bert, "local", selection=headwise.Selection(names=["enc-self.1"]), window=2)
    c = static_costs(bert, length=7)
    proj = 2 * 4 * 32 * 32
    full, windowed = 7 * (proj + 2 * 4 * 16 * 7), 7 * (proj + 2 * 4 * 16 * 3)  # bidirectional window 2: 3 keys
    assert c.flops == full + windowed and c.uncounted == []
    bert = tiny_model("bert")
    headwise.compress(bert, dk=8)  # shared width 8 of 32
    site = headwise.find_sites(bert)[0]
    heads, width = site.module.mixing.shape
    assert (heads, width) == (4, 8)
    dqk = width + heads  # content tags: one per head (no rotary)
    weights = {id(m): m.weight for m in [*site.module.modules(), site.o.module] if getattr(m, "weight", None)
               is not None and m.weight.dim() == 2}  # every projection of the converted module, shared ones once
    proj = 2 * sum(w.numel() for w in weights.values())
    assert static_costs(bert, length=7).flops == 2 * 7 * (proj + 2 * 4 * (dqk + 8) * 7)


def test_attention_the_cost_model_cannot_count_is_flagged_never_costed_as_softmax():
    from headwise.runtime import HeadOp, attach, detach_all

    bert = tiny_model("bert")
    headwise.replace_attention(bert, "performer", selection=headwise.Selection(names=["enc-self.0"]), features=4)
    c = static_costs(bert, length=7)
    assert c.flops is None and len(c.uncounted) == 1 and "performer" in c.uncounted[0]
    budget = Budget.parse("flops=0.9")
    base = static_costs(tiny_model("bert"), length=7).to_dict()
    assert budget.violations(c.to_dict(), base) == ["flops"]  # not counted: never inside a FLOPs budget

    class Linearised(HeadOp):  # a plug-in's op in the mechanism slot, no method's cost hook speaks for it
        op_type = "test_linearised"

        def spec(self):
            return {}

    bert = tiny_model("bert")
    site = headwise.find_sites(bert)[1]
    attach(site, "mechanism", "plugin_linear", Linearised())
    c = static_costs(bert, length=7)
    assert c.flops is None and "no registered method's cost hook counts" in c.uncounted[0]
    detach_all(bert, "plugin_linear")
    assert static_costs(bert, length=7).flops is not None


def test_the_budget_axes_are_the_cost_axes_written_once():
    from headwise.planning.axes import BUDGET_AXES, COST_KEYS
    from headwise.planning.budget import AXES
    from headwise.planning.costs import Costs

    assert set(AXES) == set(BUDGET_AXES) and set(COST_KEYS) <= {f.name for f in dataclasses.fields(Costs)}


def test_costs_on_the_meta_device():
    with torch.device("meta"):
        bert = tiny_model("bert")
    assert static_costs(bert, length=7) == static_costs(tiny_model("bert"), length=7)


# ---- fronts ------------------------------------------------------------------------------------------------
def test_front_is_exactly_the_non_dominated_set():
    rng = random.Random(0)
    vectors = [[rng.randint(0, 5) for _ in range(3)] for _ in range(40)]
    got = set(front(vectors))
    for i, v in enumerate(vectors):
        assert (i in got) == (not any(dominates(w, v) for w in vectors))
    assert not any(dominates(vectors[a], vectors[b]) for a, b in itertools.permutations(got, 2))


# ---- plans on tiny models ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bert_plan(tokenizer, stsb_dir):
    model = tiny_bert()
    task = get_task("stsb", data=str(stsb_dir))
    return model, task, headwise.plan(model, tokenizer, task, "heads=6,params=-20%", **FAST)


@pytest.fixture(scope="module")
def llama_plan(tokenizer, text_file):
    model = tiny_llama_lm()
    task = get_task("lm", data=str(text_file), max_length=64)  # the default windows of 0.75 and 0.5 fit after 4 sinks
    return model, task, headwise.plan(model, tokenizer, task, "kv-cache=-50%", **FAST)


@pytest.mark.parametrize("which", ["bert_plan", "llama_plan"])
def test_plan_measures_every_point_and_recommends_one_in_budget(request, which):
    model, task, plan = request.getfixturevalue(which)
    kinds = {p.kind for p in plan.points}
    assert kinds == {"base", "single", "combined"}
    assert all(p.measured["score"] is not None and p.measured["latency"] is not None for p in plan.points)
    assert all(p.measured["seconds"] > 0 for p in plan.points if p.kind != "base")  # what each measurement cost
    rec = plan.recommended_point
    assert rec is not None and rec.meets_budget
    budget = Budget.parse(plan.budget)
    assert budget.violations(rec.measured, plan.base.measured) == []
    sign = plan.sign
    assert all(sign * rec.measured["score"] >= sign * p.measured["score"] for p in plan.points
               if p.meets_budget and p.kind != "base")
    vectors = {p.name: [-sign * p.measured["score"]] + [p.measured[a] for a in
                                                           ("latency", "attention_params", "flops", "kv_bytes")]
               for p in plan.points}
    for p in plan.frontier:
        assert not any(dominates(v, vectors[p.name]) for v in vectors.values())
    for p in plan.points:
        if not p.on_front:
            assert any(dominates(v, vectors[p.name]) for v in vectors.values())
    assert "prune_heads" in {m for p in plan.points for m in p.methods}


def test_llama_plan_tries_kv_merges_and_latents_and_combines_them_with_removal(llama_plan):
    _, _, plan = llama_plan
    names = {p.name for p in plan.points}
    assert {"kv-1", "latent-0.5", "latent-0.25"} <= names
    assert any(p.kind == "combined" and {"gqa", "latent"} & set(p.methods) for p in plan.points)
    latent = next(p for p in plan.points if p.name == "latent-0.25")  # the cache holds the latent: a quarter
    assert latent.measured["kv_bytes"] * 4 == plan.base.measured["kv_bytes"]
    kv1 = next(p for p in plan.points if p.name == "kv-1")
    assert kv1.measured["kv_bytes"] * 2 == plan.base.measured["kv_bytes"]
    removed = [p for p in plan.points if p.methods == ["prune_heads"]]
    heads = [h for p in removed for h in p.edit.config("prune_heads").heads.values()]
    assert heads and all(len(h) % 2 == 0 for h in heads)  # whole key/value groups


@pytest.mark.parametrize("which", ["bert_plan", "llama_plan"])
def test_apply_reproduces_the_measured_score_and_the_plan_round_trips(request, which, tmp_path, tokenizer):
    model, task, plan = request.getfixturevalue(which)
    plan.save(tmp_path / "plan.json")
    again = Plan.load(tmp_path / "plan.json")
    assert again.to_dict() == plan.to_dict()
    fresh = tiny_bert() if which == "bert_plan" else tiny_llama_lm()
    again.execute(fresh, tokenizer)
    with headwise.contract.measured(fresh):  # through what the edit attaches (a KV policy's cache), as planned
        got = task.evaluate(fresh, tokenizer, progress=False)[task.metric]
    assert got == pytest.approx(plan.recommended_point.measured["score"], abs=1e-5)
    assert static_costs(fresh, plan.settings["sequence_length"]).attention_params == \
        plan.recommended_point.measured["attention_params"]


def test_plan_files_refuse_other_schemas(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({"schema": "other/9"}))
    with pytest.raises(headwise.HeadwiseError, match="schema"):
        Plan.load(tmp_path / "p.json")
    with pytest.raises(headwise.HeadwiseError, match="not a file"):
        Plan.load(tmp_path / "missing.json")


# ---- the verbs end to end -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("bert")
    tiny_bert().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_plan_and_apply_verbs_end_to_end(tmp_path, bert_dir, stsb_dir, capsys):
    out = tmp_path / "plan"
    common = ["--model", str(bert_dir), "--task", "stsb", "--data", str(stsb_dir)]
    assert main(["plan", *common, "--budget", "heads=5", "--repeats", "1", "--importance-examples", "16",
                 "--calibration-limit", "8", "--methods", "prune,dk", "--out", str(out)]) == 0
    notices = [line for line in capsys.readouterr().err.splitlines() if "still works" in line]
    assert notices == ["headwise: note: method 'prune' is now 'prune_heads' (the registered method's name); 'prune' "
                       "still works for one release",
                       "headwise: note: method 'dk' is now 'collaborative' (the registered method's name); 'dk' still "
                       "works for one release"]  # plan format 1's names, one line each
    data = json.loads((out / "plan.json").read_text())
    assert data["schema"] == "headwise.plan/2" and data["recommended"] and data["front"]
    assert data["settings"]["methods"] == ["prune_heads", "collaborative"]
    assert all(set(r) == {"method", "version", "config"} for p in data["points"] for r in p["edit"])
    html = (out / "report.html").read_text()
    assert html.index("Verdict") < html.index("Pareto fronts") and "headwise apply" in html
    applied = tmp_path / "applied"
    assert main(["apply", str(out / "plan.json"), "--model", str(bert_dir), "--out", str(applied), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["metric_edited"] == pytest.approx(summary["planned"], abs=1e-5) and summary["metric_recovered"] is None
    assert summary["costs"]["after"]["heads"] <= 5 < summary["costs"]["before"]["heads"]
    reloaded = headwise.from_pretrained(applied / "model")
    assert sum(s.num_heads for s in headwise.find_sites(reloaded)) <= 5
    # plain/ is written where plain transformers can hold the edit, else apply.json (and a note) says why not
    assert (applied / "plain").is_dir() == (summary["plain"] == "plain/ loads in plain transformers")
    assert summary["plain"].startswith(("plain/", "no plain/: "))
    # refusing to overwrite without --force, nothing changed
    assert main(["apply", str(out / "plan.json"), "--model", str(bert_dir), "--out", str(applied)]) == 2
    assert "--force" in capsys.readouterr().err


def test_impossible_budget_writes_nothing(tmp_path, bert_dir, stsb_dir, capsys):
    out = tmp_path / "never"
    assert main(["plan", "--model", str(bert_dir), "--task", "stsb", "--data", str(stsb_dir), "--budget", "heads=1",
                 "--out", str(out)]) == 2
    assert "allow-empty-layers" in capsys.readouterr().err and not out.exists()
    assert main(["plan", "--model", str(bert_dir), "--budget", "kv-cache=-50%", "--data", str(stsb_dir),
                 "--out", str(out)]) == 2
    assert "kv-cache" in capsys.readouterr().err and not out.exists()
    assert main(["plan", "--budget", "speed=2", "--out", str(out)]) == 2 and not out.exists()


def test_a_plan_of_a_fresh_classification_head_is_refused_before_any_work(tmp_path, bert_dir, capsys):
    """apply reloads the model from its checkpoint: a random head the plan measured could not be rebuilt."""
    data = tmp_path / "pairs.csv"
    data.write_text("text,label\n" + "".join(f"{sentence(i)},{i % 2}\n" for i in range(40)))
    out = tmp_path / "never"
    assert main(["plan", "--model", str(bert_dir), "--task", "classification", "--data", str(data), "--new-head",
                 "--budget", "heads=0.75", "--repeats", "1", "--importance-examples", "8", "--calibration-limit", "8",
                 "--top-k", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--new-head" in err and not out.exists()
    suggested = err.partition("(headwise mix ")[2].partition("), then")[0]  # runs as printed: this run's model and data
    assert f"--model {bert_dir} --task classification --data {data}" in suggested


def test_retime_measures_latency_again_and_keeps_the_plan_consistent(bert_plan, tokenizer):
    model, task, plan = bert_plan
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    for p in again.points:
        p.measured["latency_ms"] = -1.0
    again.retime(model, tokenizer, repeats=1, task=task, progress=False)
    assert all(p.measured["latency_ms"] > 0 for p in again.points) and again.base.measured["latency"] == 1.0
    assert [p.measured["score"] for p in again.points] == [p.measured["score"] for p in plan.points]
    rec = again.recommended_point
    assert rec is None or rec.meets_budget
    assert any(p.on_front for p in again.points)


def test_side_by_side_timing_brackets_every_round_with_the_base_and_rotates_the_order():
    from headwise.planning.costs import measure_latencies

    calls = []

    class Recorder(torch.nn.Module):
        def __init__(self, name):
            super().__init__()
            self.name, self.weight = name, torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            calls.append(self.name)
            return x

    models = {n: Recorder(n) for n in "abc"}
    per_model, base_ms = measure_latencies(models, Recorder("base"), {"x": torch.zeros(1)}, repeats=3, warmup=1)
    assert calls[:4] == ["base", "a", "b", "c"]
    rounds = [calls[4 + 5 * r: 9 + 5 * r] for r in range(3)]
    assert rounds == [["base", "a", "b", "c", "base"], ["base", "b", "c", "a", "base"],
                      ["base", "c", "a", "b", "base"]]
    assert set(per_model) == set("abc") and all(r > 0 and ms > 0 for r, ms in per_model.values()) and base_ms > 0


def test_timing_a_causal_lm_builds_the_logits_of_the_last_position_only_and_an_encoder_times_as_it_is():
    from headwise.planning.costs import measure_latency

    seen = []
    lm, encoder = tiny_llama_lm(), tiny_bert()
    lm.lm_head.register_forward_hook(lambda module, args, out: seen.append(tuple(out.shape)))
    ids = torch.randint(0, VOCAB, (2, 9))
    ratio, ms = measure_latency(lm, lm, {"input_ids": ids}, repeats=1, warmup=0)
    assert seen == [(2, 1, VOCAB)] * 3 and ratio > 0 and ms > 0  # base, model, base: never [2, 9, V]
    assert measure_latency(encoder, encoder, {"input_ids": ids}, repeats=1, warmup=0)[1] > 0


def test_l0_ranking_reads_gate_logits_and_leaves_the_model_alone(tokenizer, stsb_dir):
    from headwise.pruning.ranking import head_scores, removal_order
    from headwise.training import finetune

    model = tiny_bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    task = get_task("stsb", data=str(stsb_dir))
    model.set_attn_implementation("sdpa")
    config = model.config.to_dict()
    scores = head_scores(model, tokenizer, task, "l0", examples=16, keep=4, epochs=4, finetune=finetune)
    assert set(scores) == {"enc-self.0", "enc-self.1"} and all(len(v) == 4 for v in scores.values())
    assert _identical(model, before, config) and model.config._attn_implementation == "sdpa"
    # only the gates trained: no weight of the model got a gradient, and every weight is trainable again
    assert all(p.grad is None and p.requires_grad for p in model.parameters())
    assert any(abs(x - 3.0) > 1e-4 for v in scores.values() for x in v)  # the gates moved from log α = 3
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    order = removal_order(model, scores)
    first = min(((n, h) for n, v in scores.items() for h, _ in enumerate(v)), key=lambda nh: scores[nh[0]][nh[1]])
    assert order[0] == [first[0], [first[1]]] and len(order) == 6  # one head stays in each layer
    with pytest.raises(headwise.HeadwiseError, match="ranking"):
        head_scores(model, tokenizer, task, "ablation")
    with pytest.raises(headwise.HeadwiseError, match="finetune=headwise.training.finetune"):
        head_scores(model, tokenizer, task, "l0")


def test_the_verdict_names_the_edit_its_score_savings_and_command_or_says_none_fits(bert_plan):
    from headwise.report.plan import verdict

    _, _, plan = bert_plan
    data = plan.to_dict()
    rec = plan.recommended_point
    text = verdict(data, "out/plan.json")
    assert text.startswith(f"**Recommended: {rec.edit.describe()}**") and f"{rec.measured['score']:.2f}" in text
    assert f"heads 8 → {rec.measured['heads']}" in text and "headwise apply out/plan.json" in text
    data["recommended"] = None
    assert verdict(data).startswith("**No measured edit meets the budget heads=6,params=0.8x.**")


@pytest.mark.parametrize("edit", [{"dk": 16}, {"kv_heads": 1}])
def test_calibrated_edit_without_calibration_is_refused_and_changes_nothing(edit):
    from headwise.planning.edits import apply_edit
    from plan_edits import edit as make

    model = tiny_bert() if "dk" in edit else tiny_llama_lm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(headwise.HeadwiseError, match="calibration"):
        apply_edit(model, make(**edit))
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


# ---- no copies: edits in place, the model restored bit for bit ------------------------------------------------
def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _identical(model, state, config):
    got = model.state_dict()
    return (got.keys() == state.keys() and all(torch.equal(got[k], state[k]) for k in state)
            and model.config.to_dict() == config and not any(hasattr(s.module, "headwise") for s in
                                                              headwise.find_sites(model)))


EDITS = [{"prune": {"dec-self.0": [0, 1]}}, {"kv_heads": 1}, {"latent": 0.5}, {"dk": 0.5},
         {"local": (3, ["dec-self.1"])},
         {"quantization": {"quantizer": "log", "bits": 3}},
         {"prune": {"dec-self.1": [2, 3]}, "kv_heads": 1, "dk": 0.5},
         {"prune": {"dec-self.1": [2, 3]}, "quantization": {"quantizer": "log", "bits": 3}}]


def _projections(model):
    """``{name: tensor}`` of every site's q/k/v/o weights."""
    return {f"{s.name}.{p}": getattr(s, p).module.weight for s in headwise.find_sites(model) for p in "qkvo"}


@pytest.mark.parametrize("fields", EDITS, ids=lambda f: "+".join(f))
def test_an_edit_in_place_equals_the_edited_copy_and_restores_the_model_exactly(fields, tokenizer):
    import copy

    from headwise.contract import method_of
    from headwise.planning.edits import apply_edit, edited
    from headwise.planning.proxies import output_error
    from plan_edits import edit as make

    def outputs(model, batches):  # the full logits: the reference of output_error's chunked comparison
        with torch.no_grad():
            return [model(**b).logits.float() for b in batches]

    model = tiny_llama_lm()
    batches = [tokenizer([sentence(i + 4 * b) for i in range(4)], return_tensors="pt", padding=True)
               for b in range(3)]
    batches = [{k: v for k, v in b.items() if k in ("input_ids", "attention_mask")} for b in batches]
    state, config, base = _state(model), model.config.to_dict(), outputs(model, batches)
    edit = make(**fields)
    reference = outputs(apply_edit(copy.deepcopy(model), edit, batches), batches)  # the old way: an edited copy
    originals = _projections(model)
    with edited(model, edit, batches) as now:
        # the originals that methods rewriting weights replaced wait on disk, their memory freed (every edit here
        # applies those first)
        replaced = {n for n, w in _projections(model).items() if w.untyped_storage()._cdata
                    != originals[n].untyped_storage()._cdata}
        assert bool(replaced) == any(not method_of(c).reversible for c in edit.configs)
        assert {n for n, w in originals.items() if w.untyped_storage().nbytes() == 0} == replaced
        assert all(torch.equal(a, b) for a, b in zip(outputs(model, batches), reference))
        ours = _projections(model)
        with now.original():  # the unedited modules swapped back in, the edited ones' own tensors on disk
            assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(outputs(model, batches), base))
            away = {n for n, w in ours.items() if w.untyped_storage().nbytes() == 0}
            assert away == replaced or "latent" in fields and away <= replaced  # a latent layer's ops hold its k/v
            assert all(originals[n].untyped_storage().nbytes() > 0 for n in replaced)
        assert all(torch.equal(a, b) for a, b in zip(outputs(model, batches), reference))
    assert _identical(model, state, config)
    assert all(_projections(model)[n] is w for n, w in originals.items())  # the same tensors, read back
    assert all(torch.equal(a, b) for a, b in zip(outputs(model, batches), base))
    error = output_error(model, edit, batches, calibration=batches)
    num = sum(float((a - b).pow(2).sum()) for a, b in zip(reference, base))
    assert error == pytest.approx((num / sum(float(b.pow(2).sum()) for b in base)) ** 0.5, rel=1e-5)
    assert _identical(model, state, config)


def test_an_error_inside_the_edit_still_restores_the_model():
    from headwise.planning.edits import edited
    from plan_edits import edit

    model = tiny_bert()
    state, config = _state(model), model.config.to_dict()
    with pytest.raises(RuntimeError, match="boom"):
        with edited(model, edit(prune={"enc-self.0": [1]}, quantization={"quantizer": "log", "bits": 3})):
            assert sum(s.num_heads for s in headwise.find_sites(model)) == 7
            raise RuntimeError("boom")
    assert _identical(model, state, config) and sum(s.num_heads for s in headwise.find_sites(model)) == 8


@pytest.mark.parametrize("which", ["bert_plan", "llama_plan"])
def test_plan_leaves_the_model_bit_identical_and_its_scores_match_edited_copies(request, which, tokenizer):
    from headwise.planning.edits import apply_edit

    model, task, plan = request.getfixturevalue(which)
    fresh = tiny_bert() if which == "bert_plan" else tiny_llama_lm()  # the same seed: the model before the plan
    assert _identical(model, _state(fresh), fresh.config.to_dict())
    calibration = plan.calibration(tokenizer, task)
    for p in plan.points[1::3]:  # an independent recomputation on a fresh model, edited the old way
        edited = apply_edit(tiny_bert() if which == "bert_plan" else tiny_llama_lm(), p.edit,
                            calibration if p.edit.needs_calibration() else None)
        with headwise.contract.measured(edited):
            assert task.evaluate(edited, tokenizer, progress=False)[task.metric] == pytest.approx(
                p.measured["score"], abs=1e-6)


def test_plan_with_recovery_restores_every_trained_weight(tokenizer, stsb_dir):
    model = tiny_bert()
    state, config = _state(model), model.config.to_dict()
    task = get_task("stsb", data=str(stsb_dir))
    plan = headwise.plan(model, tokenizer, task, "heads=6", methods=("prune_heads", "quantization"), recover="distill",
                         recover_epochs=1, **FAST)
    assert len(plan.points) > 2 and _identical(model, state, config)


def test_the_stand_ins_share_the_models_tensors_and_an_edit_builds_only_what_it_changes():
    """No tensor is copied to measure an edit: the modules an edit leaves alone keep the model's very storage (the
    same memory); the replaced ones wait on disk and come back into the same storage objects."""
    from headwise.planning.edits import edited
    from plan_edits import edit

    model = tiny_llama_lm()
    storage = {name: p.untyped_storage().data_ptr() for name, p in model.named_parameters()}
    identity = {name: p.untyped_storage()._cdata for name, p in model.named_parameters()}
    with edited(model, edit(prune={"dec-self.0": [0, 1]})):
        now = {name: p.untyped_storage().data_ptr() for name, p in model.named_parameters()}
        assert {n for n in storage if now.get(n) != storage[n]} == {
            f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkvo"}  # only the pruned layer's, rebuilt
    assert {name: p.untyped_storage()._cdata for name, p in model.named_parameters()} == identity


def test_a_replaced_original_waits_on_disk_once_nothing_else_holds_it():
    """The snapshot frees an original projection's memory as soon as only the set-aside module holds it (its use
    count), never while a view, the live model or an op still reads it; ``original()`` brings it back bit for bit
    and puts the edited projection on disk meanwhile; ``restore()`` gives back the very same tensors."""
    from headwise.planning.snapshot import AttentionSnapshot

    model = tiny_llama_lm()
    attn = model.model.layers[0].self_attn
    q, k = attn.q_proj.weight, attn.k_proj.weight
    q_before, k_before = q.detach().clone(), k.detach().clone()
    state = AttentionSnapshot(model)
    state._install(state.copies)
    stand_in = model.model.layers[0].self_attn
    view = stand_in.k_proj.weight[:2]  # a reader of k's storage
    stand_in.q_proj = torch.nn.Linear(32, 32, bias=False)  # the stand-in q is dropped: q goes to disk there and then
    stand_in.k_proj = torch.nn.Linear(32, 16, bias=False)
    assert q.untyped_storage().nbytes() == 0 and k.untyped_storage().nbytes() > 0  # the view still reads k
    assert model.model.layers[1].self_attn.q_proj.weight.untyped_storage().nbytes() > 0  # still the live model's
    del view
    assert state.offload_unused() == k.numel() * k.element_size() and k.untyped_storage().nbytes() == 0
    new_q = stand_in.q_proj.weight
    with state.original():
        assert torch.equal(q, q_before) and torch.equal(k, k_before)
        assert new_q.untyped_storage().nbytes() == 0
    assert new_q.untyped_storage().nbytes() > 0 and q.untyped_storage().nbytes() == 0  # on disk again
    state.restore()
    assert attn.q_proj.weight is q and torch.equal(q, q_before) and torch.equal(k, k_before)


def test_a_torch_that_cannot_count_a_storages_users_keeps_the_originals_in_memory_and_says_so(monkeypatch):
    from headwise.errors import HeadwiseNote
    from headwise.planning import snapshot
    from headwise.planning.edits import edited
    from plan_edits import edit

    monkeypatch.setattr(snapshot, "_use_count", None)
    model = tiny_llama_lm()
    q = model.model.layers[0].self_attn.q_proj.weight
    with pytest.warns(HeadwiseNote, match="keeps the originals an edit replaced in memory"):
        with edited(model, edit(prune={"dec-self.0": [0, 1]})) as state:
            with state.original():
                pass
            assert q.untyped_storage().nbytes() > 0 and len(state.spill) == 0
    assert model.model.layers[0].self_attn.q_proj.weight is q


def test_a_projection_tied_outside_the_attention_modules_stays_in_memory():
    """A weight another module of the model registers too is the model's: replaced in the attention module, it
    stays where the other module reads it, and the edited model's tied tensor stays during the latency base."""
    from headwise.planning.edits import edited
    from plan_edits import edit

    model = tiny_llama_lm()
    o = model.model.layers[0].self_attn.o_proj.weight
    model.tied = torch.nn.Linear(32, 32, bias=False)
    model.tied.weight = o
    with edited(model, edit(prune={"dec-self.0": [0, 1]})) as state:
        assert model.model.layers[0].self_attn.o_proj.weight.shape == (32, 16)
        assert o.untyped_storage().nbytes() > 0 and len(state.spill) == 3  # q, k and v went to disk
        model.tied.weight = model.model.layers[0].self_attn.q_proj.weight  # now an edited tensor is tied out there
        with state.original():
            assert model.tied.weight.untyped_storage().nbytes() > 0
        model.tied.weight = o
    assert model.model.layers[0].self_attn.o_proj.weight is o and model.tied.weight is o


def test_a_method_that_writes_the_models_tensors_in_place_is_stopped_before_it_does(tokenizer, text_file):
    """A plan measures on stand-ins sharing the model's tensors: a method writing into one is refused before the
    write (naming the tensor and the op), so the model stays bit-identical; the plan skips it with that reason."""
    from headwise.contract import METHODS, Method, MethodHooks, _add
    from headwise.declaration import Declaration, Levels, Planned
    from headwise.planning.edits import Edit, edited

    @dataclasses.dataclass
    class HalveConfig(headwise.contract.MethodConfig):
        """Halve every query projection in place."""

    class Halve(MethodHooks):
        def attach(self, model, config):
            with torch.no_grad():
                for site in headwise.find_sites(model):
                    site.q.module.weight.mul_(0.5)

        def example(self, model):
            return HalveConfig()

        def levels(self, model, context):
            return Levels([("halved", HalveConfig())])

        def describe(self, config):
            return "queries halved"

    _add(Method(declaration=Declaration(name="toy_halve_in_place", config=HalveConfig, planned=Planned(order=60)),
                hooks=Halve()))
    try:
        model = tiny_llama_lm()
        state, config = _state(model), model.config.to_dict()
        with pytest.raises(headwise.HeadwiseError, match=r"wrote into the model's model\.layers\.0\.self_attn\."
                                                         r"q_proj\.weight in place \(mul_"):
            with edited(model, Edit((HalveConfig(),))):
                pass
        assert _identical(model, state, config)
        task = get_task("lm", data=str(text_file), max_length=16)
        plan = headwise.plan(model, tokenizer, task, "heads=0.75", methods=("prune_heads", "toy_halve_in_place"),
                             **FAST)
        assert "wrote into the model's" in plan.skipped["toy_halve_in_place"]
        assert "toy_halve_in_place" not in {m for p in plan.points for m in p.methods}
        assert _identical(model, state, config)
    finally:
        METHODS.pop("toy_halve_in_place", None)


# ---- KV-cache budgets: per-head KV policies and latent keys/values (issue 53) ----------------------------------
def _policy_perplexity(model, tokenizer, task, policy) -> float:
    """The task's perplexity with every head's rule as a mask on eager attention, each window its own sequence
    (``test_kvcache.reference_logits``: the masked dense reference), computed by hand from the logits."""
    from test_kvcache import reference_logits

    ids = task.token_stream(tokenizer, task.split)
    total = count = 0.0
    for begin, end, first in task.windows(len(ids)):
        window = ids[begin:end][None]
        logits = reference_logits(model, policy.at(end - begin), window, torch.ones_like(window))[0, :-1]
        nll = torch.nn.functional.cross_entropy(logits.float(), window[0, 1:], reduction="none")[max(first - 1, 0):]
        total, count = total + float(nll.sum()), count + len(nll)
    return float(torch.tensor(total / count).exp())


def test_a_kv_cache_budget_plans_kv_policies_counted_and_scored_through_the_policy(llama_plan, tokenizer):
    """``plan --budget kv-cache=-50%`` on a tiny Llama lists kv_policy points. Their KV bytes are what the policy's
    cache holds after a sequence of the task's length (counted by hand from the rules), and their perplexity is
    measured through the policy: equal to the masked dense reference, not to a plain forward (which ignores it)."""
    from headwise.kvcache import KVPolicy

    model, task, plan = llama_plan
    points = [p for p in plan.points if p.methods == ["kv_policy"]]
    assert [p.name for p in points] == ["kv-policy-0.75", "kv-policy-0.5"]  # 0.25 leaves no window at 64 tokens
    length = round(plan.settings["sequence_length"])
    for p in points:
        policy = KVPolicy.from_dict(p.edit.config("kv_policy").policy)
        held = sum(min(length, length if c.full else c.sink + c.at(length).window) for layer in policy.heads
                   for c in layer)  # token slots over every (layer, KV head)
        assert p.measured["kv_bytes"] == pytest.approx(2 * 8 * 4 * held / length)  # head_dim 8, float32
        assert p.measured["kv_bytes"] <= float(p.name.rpartition("-")[2]) * plan.base.measured["kv_bytes"]
        assert p.measured["attention_params"] == plan.base.measured["attention_params"]
        fresh = tiny_llama_lm()
        assert p.measured["score"] == pytest.approx(_policy_perplexity(fresh, tokenizer, task, policy), rel=1e-5)
    # not what a plain forward gives: ten times the tolerance of the match above away from it
    assert points[-1].measured["score"] != pytest.approx(plan.base.measured["score"], rel=1e-4)
    assert points[-1].meets_budget


def test_a_kv_policy_point_applies_as_measured_and_its_folder_reloads_with_the_policy(llama_plan, tokenizer,
                                                                                     tmp_path):
    from headwise.kvcache import policy_of
    from headwise.workflows.apply_plan import apply_plan

    _, task, plan = llama_plan
    point = next(p for p in plan.points if p.methods == ["kv_policy"])
    model = tiny_llama_lm()
    summary = apply_plan(model, tokenizer, plan, point.name, task=task)
    assert summary["metric_edited"] == pytest.approx(point.measured["score"], rel=1e-6)  # through the policy
    assert summary["metric_before"] == pytest.approx(plan.base.measured["score"], rel=1e-6)
    assert policy_of(model).to_dict() == point.edit.config("kv_policy").policy
    headwise.save_pretrained(model, tmp_path / "model")
    assert policy_of(headwise.from_pretrained(tmp_path / "model")) == policy_of(model)


def test_the_plan_and_apply_verbs_with_a_kv_cache_budget_on_a_tiny_llama(tmp_path, tokenizer, text_file, capsys):
    """The acceptance of issue 53: the verb lists kv_policy points; apply performs one; the folder reloads."""
    from headwise.kvcache import policy_of

    folder = tmp_path / "llama"
    tiny_llama_lm().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out, applied = tmp_path / "plan", tmp_path / "applied"
    common = ["--model", str(folder), "--task", "lm", "--data", str(text_file), "--max-length", "64"]
    assert main(["plan", *common, "--budget", "kv-cache=-50%", "--methods", "prune_heads,kv_policy", "--repeats",
                 "1", "--importance-examples", "8", "--calibration-limit", "4", "--top-k", "1", "--out",
                 str(out)]) == 0
    data = json.loads((out / "plan.json").read_text())
    policies = [p["name"] for p in data["points"] if p["methods"] == ["kv_policy"]]
    assert policies == ["kv-policy-0.75", "kv-policy-0.5"]
    assert "KV policy: " in (out / "report.html").read_text()
    assert main(["apply", str(out / "plan.json"), "--point", "kv-policy-0.5", *common[:2], "--out", str(applied),
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    point = next(p for p in data["points"] if p["name"] == "kv-policy-0.5")
    assert summary["metric_edited"] == pytest.approx(point["measured"]["score"], rel=1e-6)
    assert summary["plain"].startswith("no plain/: ")  # generate() in plain transformers would keep every token
    assert policy_of(headwise.from_pretrained(applied / "model")).to_dict() == point["edit"][0]["config"]["policy"]


# ---- calibration shortfalls: more data, or said before any work ------------------------------------------------
def test_too_few_calibration_tokens_take_more_examples_with_a_note(tokenizer, text_file):
    from headwise.errors import HeadwiseNote
    from headwise.planning.candidates import plannable
    from headwise.planning.plan import calibration_set, settle_calibration

    model = tiny_llama_lm()  # hidden size 32: a calibrated fit needs 32 tokens per site
    task = get_task("lm", data=str(text_file), max_length=16)
    with pytest.warns(HeadwiseNote, match=r"1 calibration examples hold 16 tokens, fewer than gqa, latent need "
                                          r"\(32, the hidden size\); calibrating on 2 examples: 32 tokens"):
        settled, short = settle_calibration(model, tokenizer, task, 1, plannable(("gqa", "latent")), explicit=True)
    assert (settled.count, settled.uncapped, settled.tokens, short) == (2, False, 32, {})
    same = calibration_set(task, tokenizer, 2)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(settled.batches, same))
    capped = get_task("lm", data=str(text_file), max_length=16, max_tokens=20)  # 20 tokens of every split
    with pytest.warns(HeadwiseNote, match="of the whole text"):
        settled, short = settle_calibration(model, tokenizer, capped, 1, plannable(("gqa",)), explicit=True)
    assert settled.uncapped and settled.tokens >= 32 and short == {}
    assert sum(int(b["attention_mask"].sum()) for b in calibration_set(capped, tokenizer, settled.count, True)) == \
        settled.tokens  # what Plan.calibration rebuilds from the settings


def test_calibration_past_the_cap_reads_a_prefix_of_the_text_and_gives_the_whole_texts_examples(
        tokenizer, text_file, monkeypatch):
    from dataclasses import replace

    from headwise.planning.plan import calibration_set

    capped = get_task("lm", data=str(text_file), max_length=16, max_tokens=20)
    whole = replace(capped, max_tokens=None).calibration_inputs(tokenizer, limit=3, batch_size=3)
    read = []
    call = type(tokenizer).__call__
    monkeypatch.setattr(type(tokenizer), "__call__", lambda self, text, **k: read.append(len(text)) or call(
        self, text, **k))
    got = calibration_set(capped, tokenizer, 3, uncapped=True)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(got, whole) for k in a) and len(got) == len(whole)
    assert got[0]["input_ids"].shape == (3, 16)
    assert max(read) < len("\n".join(capped.texts("calibration")))  # never the whole split


def test_a_plan_calibrated_on_more_examples_applies_as_measured(tokenizer, text_file):
    from headwise.errors import HeadwiseNote

    task = get_task("lm", data=str(text_file), max_length=16)
    with pytest.warns(HeadwiseNote, match="calibrating on 2 examples"):
        plan = headwise.plan(tiny_llama_lm(), tokenizer, task, "kv-cache=-50%", methods=("gqa",),
                             **{**FAST, "calibration": 1})
    assert plan.settings["calibration"] == 2 and plan.settings["calibration_tokens"] == 32
    fresh = tiny_llama_lm()
    plan.execute(fresh, tokenizer, "kv-1", task)
    assert task.evaluate(fresh, tokenizer, progress=False)["perplexity"] == pytest.approx(
        plan.point("kv-1").measured["score"], rel=1e-6)


def test_a_calibration_the_data_cannot_give_is_refused_or_skipped_before_any_work(tokenizer, tmp_path, monkeypatch):
    from headwise.errors import HeadwiseNote
    from headwise.planning.candidates import plannable
    from headwise.planning.plan import settle_calibration

    short = tmp_path / "short.txt"
    short.write_text("\n".join(sentence(i, 3) for i in range(4)) + "\n")  # its train part: under 32 tokens
    task = get_task("lm", data=str(short), max_length=16)
    model = tiny_llama_lm()
    monkeypatch.setattr(type(task), "evaluate", lambda *a, **k: pytest.fail("measured before the shortfall was said"))
    with pytest.raises(headwise.HeadwiseError, match=r"gqa fits on calibration data and needs at least 32 tokens "
                                                     r"\(the model's hidden size\); the task's calibration data holds "
                                                     r"\d+ \(\d+ examples\): give more text \(--data\), or leave gqa "
                                                     "out of the methods"):
        headwise.plan(model, tokenizer, task, "kv-cache=-50%", methods=("prune_heads", "gqa"), **FAST)
    with pytest.warns(HeadwiseNote, match="not trying gqa: its fit needs 32 calibration tokens"):
        settled, skipped = settle_calibration(model, tokenizer, task, 8, plannable(), explicit=False)
    assert set(skipped) == {"gqa", "latent", "collaborative"} and settled.tokens < 32
    assert all("give more text" in why for why in skipped.values())


# ---- a method added in one module is planned, applied and saved (nothing else edited) ---------------------------
TOY_MODULE = '''
"""A plug-in method: drop the first ``count`` heads of every selected site, planned by headwise.plan."""
from dataclasses import dataclass, field

import headwise
from headwise.contract import MethodConfig, MethodHooks, register
from headwise.declaration import Declaration, Levels, Planned


@dataclass
class DropFirstConfig(MethodConfig):
    """Remove the first ``count`` heads of every selected site."""

    count: int = field(default=1, metadata={"help": "heads removed at the front of each site"})


@register(Declaration(name="toy_drop_first", config=DropFirstConfig, planned=Planned(order=15)))
class DropFirst(MethodHooks):
    def attach(self, model, config):
        return headwise.prune_heads(model, {s.name: list(range(config.count)) for s in config.sites(model)})

    def example(self, model):
        return DropFirstConfig()

    def levels(self, model, context):
        return Levels([("drop-1", DropFirstConfig(count=1))])

    def describe(self, config):
        return f"drop the first {config.count} head(s) of each layer"
'''


@pytest.fixture
def toy_plugin(tmp_path, monkeypatch):
    """The toy method's module, written to a temporary folder and imported (registered); unregistered after."""
    import importlib
    import sys

    from headwise.contract import METHODS

    (tmp_path / "toy_plugin").mkdir()
    (tmp_path / "toy_plugin" / "toy_headwise_method.py").write_text(TOY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "toy_plugin"))
    module = importlib.import_module("toy_headwise_method")
    yield module
    METHODS.pop("toy_drop_first", None)
    sys.modules.pop("toy_headwise_method", None)


def test_a_method_registered_in_a_plugin_module_is_planned_applied_and_reloaded(toy_plugin, tmp_path, bert_dir,
                                                                                 stsb_dir, tokenizer, capsys):
    model = tiny_bert()
    task = get_task("stsb", data=str(stsb_dir))
    planned = headwise.plan(model, tokenizer, task, "heads=7", methods=("toy_drop_first",), **FAST)
    toy = planned.point("drop-1")
    assert toy.methods == ["toy_drop_first"] and toy.on_front and toy.measured["heads"] == 6
    assert planned.recommended == "drop-1"
    assert planned.to_dict()["points"][1]["edit"] == [{"method": "toy_drop_first", "version": 1,
                                                      "config": {"count": 1, "selection": {"kinds": None,
                                                                                           "layers": None,
                                                                                           "names": None}}}]
    # combined with the built-in methods (removal levels × nothing to pair: the toy is "alone")
    both = headwise.plan(tiny_bert(), tokenizer, task, "heads=6", methods=("prune_heads", "toy_drop_first"), **FAST)
    assert {"drop-1", "prune-6"} <= {p.name for p in both.points}

    out, applied = tmp_path / "plan", tmp_path / "applied"
    common = ["--model", str(bert_dir), "--task", "stsb", "--data", str(stsb_dir)]
    assert main(["plan", *common, "--budget", "heads=7", "--repeats", "1", "--importance-examples", "16",
                 "--calibration-limit", "8", "--methods", "toy_drop_first", "--out", str(out)]) == 0
    data = json.loads((out / "plan.json").read_text())
    assert data["recommended"] == "drop-1" and "drop-1" in data["front"]
    assert data["points"][1]["edit"][0]["method"] == "toy_drop_first"
    assert "drop the first 1 head(s)" in (out / "report.html").read_text()
    assert main(["apply", str(out / "plan.json"), "--model", str(bert_dir), "--out", str(applied), "--no-eval"]) == 0
    capsys.readouterr()
    reference = headwise.load_model(str(bert_dir))[0]
    headwise.apply(reference, toy_plugin.DropFirstConfig(count=1))
    reloaded = headwise.from_pretrained(applied / "model")
    assert [s.num_heads for s in headwise.find_sites(reloaded)] == [3, 3]
    ids = torch.tensor([[2, 5, 7, 9, 3]])
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).last_hidden_state, reference(input_ids=ids).last_hidden_state,
                              atol=1e-6)


def test_plan_refuses_a_method_that_is_not_planned_naming_the_plannable_ones(bert_plan, tokenizer, stsb_dir):
    model, task, _ = bert_plan
    with pytest.raises(headwise.HeadwiseError, match="plan can try prune_heads, gqa, latent, collaborative, replace, "
                                                     "quantization, kv_policy"):
        headwise.plan(model, tokenizer, task, "heads=6", methods=("masks",), **FAST)


def test_a_former_method_name_plans_with_one_warning_in_python_and_one_line_in_the_cli(bert_plan, tokenizer):
    """Plan format 1's names (prune, kv_heads, dk, mechanism) are declared aliases: one function resolves them,
    with one FutureWarning (the command line prints it as one line: test_plan_and_apply_verbs_end_to_end)."""
    from headwise.planning.candidates import plannable

    with pytest.warns(FutureWarning, match="method 'prune' is now 'prune_heads'") as caught:
        assert [m.name for m in plannable(("prune", "quantization"))] == ["prune_heads", "quantization"]
    assert len(caught) == 1
    with pytest.warns(FutureWarning, match="'kv_heads' is now 'gqa'"):
        assert [m.name for m in plannable(("kv-heads",))] == ["gqa"]


def test_heads_are_ranked_only_when_the_head_removal_method_is_tried(bert_plan, tokenizer, monkeypatch):
    """``--methods quantization`` ranks no head (no gradient pass): the rank hook is asked only for a method of
    role "heads"; a ranking that method does not declare is refused before any work."""
    from headwise.contract import METHODS

    model, task, full = bert_plan
    asked = []
    hooks = METHODS["prune_heads"].hooks
    monkeypatch.setattr(hooks, "rank", lambda *a: asked.append(a) or hooks.__class__.rank(*a))
    quantized = headwise.plan(model, tokenizer, task, "params=-20%", methods=("quantization",), **FAST)
    assert asked == [] and quantized.proxies["head_scores"] == {} and quantized.settings["ranking"] is None
    assert all(layer["importance"] is None for layer in quantized.layers.values())
    assert full.proxies["head_scores"] and full.settings["ranking"] == "gradient"
    with pytest.raises(headwise.HeadwiseError, match="unknown head ranking 'ablation'; prune_heads ranks heads by "
                                                     "gradient, l0"):
        headwise.plan(model, tokenizer, task, "heads=6", ranking="ablation", **FAST)
    assert asked == []


def test_levels_that_train_are_skipped_without_recovery_and_asked_for_with_it():
    from headwise.contract import Method, MethodHooks
    from headwise.declaration import Declaration, Levels, PlanContext, Planned
    from headwise.planning.candidates import candidates
    from headwise.pruning.config import GateConfig

    asked = []

    class Trained(MethodHooks):
        def levels(self, model, context):
            asked.append(model)
            return Levels([("gated", GateConfig())])

    declaration = Declaration(name="toy_trained", config=GateConfig, planned=Planned(order=60, trains=True))
    method = Method(declaration=declaration, hooks=Trained())
    context = PlanContext([], None, 8.0, False, lambda configs: 0.0)
    skipped = candidates("model", context, [method], recover="none")
    assert skipped.singles == [] and "recover" in skipped.skipped["toy_trained"] and asked == []
    found = candidates("model", context, [method], recover="distill")
    assert [c.name for c in found.singles] == ["gated"] and asked == ["model"]
    with pytest.raises(headwise.HeadwiseError, match="planned role"):
        Planned(order=1, role="twice")


def test_the_deprecated_sweep_form_still_registers_a_planned_method_with_a_warning():
    from headwise.contract import METHODS, register_method
    from headwise.declaration import Levels
    from headwise.sweep import Sweep, SweepContext

    @dataclasses.dataclass
    class OldStyleConfig(headwise.contract.MethodConfig):
        """A plug-in config registered the old way."""

    sweep = Sweep(lambda model, context: Levels([("old", OldStyleConfig())]), lambda c: "old style", order=70)
    try:
        with pytest.warns(FutureWarning, match="sweep=Sweep"):
            method = register_method("toy_old_style", OldStyleConfig, lambda model, c: None,
                                     example=lambda model: OldStyleConfig(), sweep=sweep)
        assert method.planned.order == 70 and method.describe(OldStyleConfig()) == "old style"
        assert method.levels("model", SweepContext([], None, 8.0, False, lambda c: 0.0)).configs[0][0] == "old"
        with pytest.warns(FutureWarning, match="Method.sweep"):
            assert method.sweep.order == 70
    finally:
        METHODS.pop("toy_old_style", None)
    with pytest.raises(headwise.HeadwiseError, match="planned role"):
        Sweep(lambda m, c: Levels(), str, order=1, role="twice")


def test_a_plan_holds_no_copy_of_the_model(tokenizer, text_file):
    """The plan's tensors above the loaded model, counted allocation by allocation (no timing, no RSS): removal and
    KV merges measured in place on an 8-layer Llama (MLP 4x wide, so the attention projections are a fifth of the
    weights) stay below its task's ``evaluate`` peak + 0.75x the weights, and the model is bit-identical after. A
    copy of the model alone would take 1x. (The issue's 0.25x margin is for real models, measured on SmolLM2 by
    ``benchmarks/scaling.py``'s plan row: a tiny model's calibration forward and float64 fits, ``D × D`` per site,
    weigh far more against its weights; measured here ~0.6x.)"""
    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=64, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=256, vocab_size=VOCAB, max_position_embeddings=64)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise").eval()
    state, before = _state(model), model.config.to_dict()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    task = get_task("lm", data=str(text_file), max_length=16)
    task.evaluate(model, tokenizer, progress=False)  # lazy tables built once, outside the measurement
    evaluate = peak_tensor_bytes(lambda: task.evaluate(model, tokenizer, progress=False))
    found = {}
    plan = peak_tensor_bytes(lambda: found.setdefault("plan", headwise.plan(
        model, tokenizer, task, "heads=0.5", methods=("prune_heads", "gqa"), top_k=1, **FAST)))
    assert {"prune_heads", "gqa"} <= {m for p in found["plan"].points for m in p.methods}
    assert plan <= evaluate + 0.75 * weights, (plan / weights, evaluate / weights)
    assert _identical(model, state, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_the_probe_error_through_a_linear_head_equals_the_logits_error(dtype, bias, monkeypatch):
    """``relative_error`` through a plain linear head (quadratic forms in ``WᵀW``, no ``[n, V]`` logits) against
    the logits built in float64; the Gram matrix kept for the head is rebuilt once its weight changes in place, and
    another kind of head still goes through its logits."""
    from torch import nn

    from headwise.planning import proxies
    from headwise.planning.proxies import Outputs, relative_error

    monkeypatch.setattr(proxies, "GRAM_ROWS", 64)  # the Gram matrix (and Wᵀb) summed over five blocks of rows
    monkeypatch.setattr(proxies, "ERROR_ROWS", 4)  # the error's sums over blocks of positions that do not divide 10
    torch.manual_seed(0)
    head = nn.Linear(24, 300, bias=bias).to(dtype)
    a = [torch.randn(2, 5, 24), torch.randn(3, 4, 24)]
    b = [x + 0.05 * torch.randn_like(x) for x in a]

    @torch.no_grad()
    def dense(head):
        w, c = head.weight.double(), 0 if head.bias is None else head.bias.double()
        ya, yb = [x.double() @ w.mT + c for x in a], [x.double() @ w.mT + c for x in b]
        return (sum(float((p - q).pow(2).sum()) for p, q in zip(ya, yb))
                / sum(float(p.pow(2).sum()) for p in ya)) ** 0.5

    got = relative_error(Outputs(a, head, 300), Outputs(b, head, 300))
    assert got == pytest.approx(dense(head), rel=1e-5) and got > 0.01
    assert head in proxies._grams
    with torch.no_grad():
        head.weight.mul_(-2.0).add_(0.3)  # a changed weight: the kept Gram matrix is stale
    assert relative_error(Outputs(a, head, 300), Outputs(b, head, 300)) == pytest.approx(dense(head), rel=1e-5)
    wrapped = nn.Sequential(head)  # not a plain nn.Linear: logits rebuilt chunk by chunk, in the head's dtype
    assert relative_error(Outputs(a, wrapped, 300), Outputs(b, wrapped, 300)) == pytest.approx(
        dense(head), rel=2e-3 if dtype == torch.float32 else 3e-2)


@pytest.mark.parametrize("make", [tiny_llama_lm, tiny_bert], ids=["llama-lm", "bert"])
def test_the_probe_read_in_slices_gives_the_outputs_of_the_whole_batch(make, monkeypatch):
    """The probe's outputs (hidden states before a linear head, or a base model's last hidden states) from one
    forward per example equal one forward of the whole padded batch, to float32 rounding."""
    from tiny import tiny_inputs

    from headwise.planning.proxies import outputs
    from headwise.runtime import moments

    model = make()
    batch = tiny_inputs("llama" if make is tiny_llama_lm else "bert", batch=3)[0]
    whole = outputs(model, [batch])
    calls = []
    model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(1), with_kwargs=True)
    monkeypatch.setattr(moments, "MIN_SLICE_TOKENS", 1)
    monkeypatch.setattr(moments, "FORWARD_SHARE", 0.0)
    sliced = outputs(model, [batch])
    assert len(calls) == 3  # one forward per example
    assert (sliced.head is None) == (make is tiny_bert) and sliced.vocab == whole.vocab
    assert [v.shape for v in sliced.values] == [v.shape for v in whole.values]
    for got, want in zip(sliced.values, whole.values):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
