"""Every verb with --task on tiny saved models: eval, analyze, prune (GQA units, plain export), quantize,
compress; bad input writes nothing."""

import json

import pytest
import torch
import transformers as tf

import headwise
from headwise.cli import main
from headwise.sites import find_sites
from headwise.tasks import LanguageModeling, train_tokenizer
from tiny import VOCAB

WORDS = "the a cat dog sat on mat ran to house big small red blue tree sun".split()


def sentence(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(6 + i % 3))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A tiny Llama causal LM (3 layers, 6 query / 2 key-value heads) saved with its tokenizer, and a text."""
    root = tmp_path_factory.mktemp("cli-llama")
    tokenizer = train_tokenizer([sentence(i) for i in range(200)], vocab_size=80, min_frequency=1)
    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=48, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                            head_dim=8, intermediate_size=37, vocab_size=VOCAB, max_position_embeddings=64)
    model = tf.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    (root / "text.txt").write_text("\n".join(sentence(i) for i in range(60)) + "\n")
    return root


def test_eval_lm_json_matches_the_library(llama_dir, capsys):
    argv = ["eval", "lm", "--model", str(llama_dir / "model"), "--data", str(llama_dir / "text.txt"),
            "--max-length", "32", "--stride", "16", "--json"]
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    model, tokenizer = headwise.load_model(str(llama_dir / "model"), task="lm")
    expected = LanguageModeling(data=str(llama_dir / "text.txt"), max_length=32, stride=16).evaluate(
        model, tokenizer, progress=False)
    assert got["perplexity"] == pytest.approx(expected["perplexity"], rel=1e-6) and got["tokens"] == expected["tokens"]


@pytest.mark.parametrize("activations", ["auto", "recompute"])
def test_analyze_with_the_lm_task_ranks_heads_by_the_next_token_loss(llama_dir, tmp_path, activations):
    out = tmp_path / "a"
    assert main(["analyze", "--task", "lm", "--model", str(llama_dir / "model"), "--data", str(llama_dir / "text.txt"),
                 "--importance", "gradient,ablation", "--ablation-texts", "8", "--activations", activations,
                 "--limit", "20", "--max-length", "32", "--out", str(out)]) == 0
    stats = json.loads((out / "stats.json").read_text())
    # a tiny model's activations fit: auto keeps them; recomputed blocks are named in the cost
    assert ("gradient (blocks recomputed)" in stats["seconds"]) == (activations == "recompute")
    assert stats["sentences"] == 20 and "lm task" in stats["data"] and "analysed texts" in stats["importance_data"]
    gradient = torch.tensor(stats["heads"]["importance_gradient"])
    assert gradient.shape == (3, 6) and (gradient > 0).all()
    assert torch.isfinite(torch.tensor(stats["heads"]["importance_ablation"])).all()
    # the same ranking as Michel's importance of the analysed texts' next-token loss computed directly
    from headwise.analysis.importance import gradient_importance
    from headwise.tasks import LanguageModeling

    model, tokenizer = headwise.load_model(str(llama_dir / "model"), task="lm")
    task = LanguageModeling(data=str(llama_dir / "text.txt"), max_length=32)
    texts = [t for t in task.texts("calibration") if t.strip()][:20]
    direct = gradient_importance(model, tokenizer, texts, loss_fn=task.loss, batch_size=4, max_length=32)
    assert torch.allclose(gradient.double(), direct, atol=1e-6)
    refused = main(["analyze", "--task", "lm", "--model", str(llama_dir / "model"), "--data",
                        str(llama_dir / "text.txt"), "--importance-examples", "4", "--out", str(tmp_path / "b")])
    assert refused == 2 and not (tmp_path / "b").exists()  # a flag that would do nothing is refused


@pytest.mark.parametrize("unit,keep,plain", [("kv-group", 9, True), ("query", 12, False)])
def test_prune_lm_by_query_heads_or_kv_groups(llama_dir, tmp_path, capsys, unit, keep, plain):
    out = tmp_path / unit
    argv = ["prune", "--task", "lm", "--model", str(llama_dir / "model"), "--data", str(llama_dir / "text.txt"),
            "--strategy", "importance", "--unit", unit, "--keep", str(keep), "--step", "3", "--max-length", "32",
            "--importance-examples", "4", "--out", str(out), "--json"] + (["--plain"] if plain else [])
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["heads_after"] == keep and result["task"] == "lm"
    survivors = result["survivors"]
    if unit == "kv-group":  # whole groups of 3 query heads go, the KV cache shrinks
        for mask in survivors.values():
            assert all(len(set(mask[g * 3:(g + 1) * 3])) == 1 for g in range(2))
        assert result["kv_heads_after"] == keep // 3 and not result["masked_only"]
    model = headwise.from_pretrained(out / "model")
    ids = torch.tensor([[5, 9, 12, 7, 30, 8]])
    with torch.no_grad():
        ours = model(input_ids=ids).logits
    if plain:  # --plain succeeded, so every layer kept the same heads; plain transformers computes the same
        assert len({(s.num_heads, s.num_kv_heads) for s in find_sites(model)}) == 1
        reference = tf.AutoModelForCausalLM.from_pretrained(out / "plain", attn_implementation="eager").eval()
        with torch.no_grad():
            assert torch.allclose(reference(input_ids=ids).logits, ours, atol=1e-5)
    else:  # partial groups stay masked, saved with their masks
        assert result["masked_only"] and result["costs"]["after"]["parameters"] == result["costs"]["before"]["parameters"]


def test_prune_plain_refuses_partial_groups_and_writes_nothing(llama_dir, tmp_path, capsys):
    out = tmp_path / "never"
    argv = ["prune", "--task", "lm", "--model", str(llama_dir / "model"), "--data", str(llama_dir / "text.txt"),
            "--strategy", "importance", "--keep", "13", "--max-length", "32", "--importance-examples", "2", "--no-eval",
            "--plain", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--plain" in err and "nothing was written" in err and not out.exists()
    assert "use --strategy importance --unit kv-group" in err  # refused before ranking, not after the work


def test_prune_plain_with_uneven_groups_writes_zero_padded_heads(llama_dir, tmp_path, capsys):
    """18 heads in 3 layers of 2 groups of 3: --keep 15 removes one group in one layer; plain/ holds every layer at
    the config's counts, the removed group zero, and computes what the pruned model computes."""
    out = tmp_path / "uneven"
    argv = ["prune", "--task", "lm", "--model", str(llama_dir / "model"), "--data", str(llama_dir / "text.txt"),
            "--strategy", "importance", "--unit", "kv-group", "--keep", "15", "--max-length", "32", "--plain",
            "--importance-examples", "2", "--no-eval", "--out", str(out), "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["heads_after"] == 15
    model = headwise.from_pretrained(out / "model")
    reference = tf.AutoModelForCausalLM.from_pretrained(out / "plain", attn_implementation="eager").eval()
    assert reference.config.num_attention_heads == 6 and reference.config.num_key_value_heads == 2
    ids = torch.tensor([[5, 9, 12, 7, 30, 8]])
    with torch.no_grad():
        torch.testing.assert_close(reference(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("argv,message", [
    (["eval", "lm", "--data", "/no/such.txt"], "not found: /no/such.txt"),
    (["prune", "--task", "lm", "--strategy", "importance", "--keep", "3", "--data", "/no/such.txt"], "not found"),
    (["quantize", "--task", "translation", "--src-file", "/no/a.de", "--tgt-file", "/no/a.en"], "not found"),
    (["prune", "--strategy", "l0", "--keep", "3", "--unit", "kv-group"], "--unit kv-group applies to --strategy importance"),
])
def test_bad_input_fails_before_loading_and_writes_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "never"
    full = argv + (["--out", str(out)] if argv[0] != "eval" else [])
    assert main(full) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_quantize_with_the_lm_task_scores_negative_perplexity(llama_dir, tmp_path, capsys):
    out = tmp_path / "q"
    assert main(["quantize", "--task", "lm", "--model", str(llama_dir / "model"), "--data",
                 str(llama_dir / "text.txt"), "--max-length", "32", "--quantizers", "linear_slog",
                 "--bit-widths", "2,8", "--thresholds", "none", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    model, tokenizer = headwise.load_model(str(llama_dir / "model"), task="lm")
    ppl = LanguageModeling(data=str(llama_dir / "text.txt"), max_length=32).evaluate(model, tokenizer)["perplexity"]
    assert result["baseline"] == pytest.approx(-ppl, rel=1e-5) and result["task"] == "lm"
    by = {row["label"]: row for row in result["rows"]}
    assert abs(by["linear_slog 8b"]["metric"] - result["baseline"]) < abs(by["linear_slog 2b"]["metric"]
                                                                          - result["baseline"]) + 1e-9


def test_prune_l0_with_the_lm_loss_and_recovery_finetuning(llama_dir, tmp_path, capsys):
    out = tmp_path / "l0"
    assert main(["prune", "--task", "lm", "--model", str(llama_dir / "model"), "--data", str(llama_dir / "text.txt"),
                 "--strategy", "l0", "--keep", "12", "--max-steps", "2", "--recover", "distill", "--recover-steps", "2",
                 "--train-memory", "bounded", "--max-length", "32", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # the Trainer logs before it
    assert result["heads_after"] == 12 and result["masked_only"] == (result["kv_heads_after"] == 6) and result["metric_before"] is not None and result["metric_recovered"] is not None
    assert result["recovery"] == {"mode": "distill", "epochs": 1.0, "steps": 2, "train_memory": "bounded",
                                  "teacher": "the outputs of the model before the edit (cached)",
                                  "alpha": 0.5, "temperature": 2.0, "distance": "mse"}
    assert result["metric_edited"] is not None and result["metric_edited"] != result["metric_recovered"]


@pytest.mark.parametrize("verb", ["mix", "replace"])
def test_mix_and_replace_report_the_task_metric(llama_dir, tmp_path, capsys, verb):
    extra = ["--mix-epochs", "0.5"] if verb == "mix" else ["local", "--arg", "window=4", "--recover", "finetune",
                                                          "--recover-steps", "4"]
    out = tmp_path / verb
    assert main([verb, *extra, "--task", "lm", "--model", str(llama_dir / "model"), "--data",
                 str(llama_dir / "text.txt"), "--max-length", "32", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    model, tokenizer = headwise.load_model(str(llama_dir / "model"), task="lm")
    ppl = LanguageModeling(data=str(llama_dir / "text.txt"), max_length=32).evaluate(model, tokenizer)["perplexity"]
    assert result["metric_name"] == "lm perplexity" and result["metric_before"] == pytest.approx(ppl, abs=0.006)
    assert result["metric_edited"] != result["metric_before"]  # mixers trained on the lm loss / a 4-token window
    if verb == "replace":
        assert result["recovery"] == {"mode": "finetune", "epochs": 1.0, "steps": 4, "train_memory": "keep"}
        assert result["metric_recovered"] != result["metric_edited"]


def test_replace_distils_from_the_model_with_its_mechanism_switched_off(llama_dir, tmp_path, capsys):
    out = tmp_path / "r"
    common = ["replace", "local", "--arg", "window=4", "--task", "lm", "--model", str(llama_dir / "model"), "--data",
              str(llama_dir / "text.txt"), "--max-length", "32", "--recover", "distill", "--recover-steps", "2"]
    assert main([*common, "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["recovery"]["teacher"] == "the model with its headwise ops switched off"
    assert result["metric_recovered"] != result["metric_edited"]
    assert main(["prune", "--task", "lm", "--model", str(llama_dir / "model"), "--data", str(llama_dir / "text.txt"),
                 "--strategy", "l0", "--keep", "12", "--max-steps", "1", "--recover", "distill", "--teacher", "off",
                 "--max-length", "32", "--out", str(tmp_path / "p")]) == 2
    assert "--teacher off needs a reversible edit" in capsys.readouterr().err


@pytest.mark.parametrize("dk", [48, 12])
def test_compress_a_rotary_gqa_lm_with_task_calibration(llama_dir, tmp_path, capsys, dk):
    """Collaborative heads on a grouped-query Llama: dk = H·d (48) is exact; the saved model reloads with the
    perplexity the command reported."""
    out = tmp_path / "c"
    assert main(["compress", "--task", "lm", "--model", str(llama_dir / "model"), "--data", str(llama_dir / "text.txt"),
                 "--max-length", "32", "--dk", str(dk), "--calibration", "task", "--curve", "none", "--json",
                 "--out", str(out)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["objective"] == "scores" and result["task"] == "lm"
    if dk == 48:
        assert result["metric_edited"] == pytest.approx(result["metric_before"], abs=0.01)
    model = headwise.from_pretrained(out / "model")
    tokenizer = tf.AutoTokenizer.from_pretrained(out / "model")
    ppl = LanguageModeling(data=str(llama_dir / "text.txt"), max_length=32).evaluate(model, tokenizer, progress=False)
    assert round(ppl["perplexity"], 2) == pytest.approx(result["metric_edited"], abs=0.01)
    assert all(s.module.mixing.shape == (6, dk) for s in find_sites(model))


def test_metric_label_names_the_split_evaluated():
    from headwise.cli.task_options import metric_label
    from headwise.tasks import get_task

    assert metric_label(get_task("stsb", split="test")) == "STS-B test Spearman ×100"
    assert metric_label(get_task("stsb", split="dev")) == "STS-B dev Spearman ×100"
    assert metric_label(get_task("lm")) == "lm perplexity" and metric_label(None) is None
