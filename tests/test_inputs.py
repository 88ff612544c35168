"""Issue 34: every input gives the right answer or one clear line, every output is whole and claimed atomically,
every edit survives every verb that takes a model. One test per case of the issue (each failed on main @ 6b373b1)."""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import shutil
import signal
import time

import pytest
import torch
import transformers as tf
from tiny import VOCAB, tiny_model, tiny_seq2seq

import headwise
from headwise.cli import main
from headwise.errors import HeadwiseError
from headwise.io.files import atomic_dir, check_writable_dir
from headwise.models import load_tokenizer
from headwise.planning import Budget
from headwise.runtime import add_gates
from headwise.tasks import Classification, LanguageModeling, Translation, train_tokenizer

WORDS = "the a cat dog sat on mat ran to house big small red blue tree sun".split()
LATIN1 = "première ligne\ncafé crème\nça déborde\n".encode("latin-1")  # byte 0xe8 on line 1


def sentence(i: int, words: int = 6) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(words + i % 3))


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([sentence(i) for i in range(200)], vocab_size=80, min_frequency=1)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, tokenizer):
    """A tiny Llama causal LM (2 layers, 6 query / 2 key-value heads) with its tokenizer, and a text file."""
    root = tmp_path_factory.mktemp("inputs-llama")
    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                            head_dim=8, intermediate_size=37, vocab_size=VOCAB, max_position_embeddings=64)
    tf.AutoModelForCausalLM.from_config(config).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    (root / "text.txt").write_text("\n".join(sentence(i) for i in range(80)) + "\n")
    return root


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, tokenizer):
    """A tiny BERT base model (max 512 positions) with its tokenizer, and a classification CSV."""
    root = tmp_path_factory.mktemp("inputs-bert")
    tiny_model("bert").save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    rows = "".join(f"{sentence(i)},{i % 2}\n" for i in range(40))
    (root / "data.csv").write_text("text,label\n" + rows)
    (root / "texts.txt").write_text("\n".join(sentence(i) for i in range(10)) + "\n")
    return root


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory, tokenizer):
    """A tiny Marian translation model (64 positions) with its tokenizer."""
    root = tmp_path_factory.mktemp("inputs-marian")
    model = tiny_seq2seq("marian", pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         decoder_start_token_id=tokenizer.pad_token_id)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root


def one_line_error(capsys, *words: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def llama_logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([[5, 9, 12, 7, 30, 8]])).logits


# ---- case 1: silently wrong tokenizers --------------------------------------------------------------------------
def test_a_folder_saved_without_tokenizer_uses_the_tokenizer_of_its_source(minilm, tmp_path, capsys):
    model, tokenizer = minilm
    headwise.save_pretrained(model, tmp_path / "bare")  # no tokenizer files
    assert not (tmp_path / "bare" / "tokenizer.json").exists()
    loaded = load_tokenizer(str(tmp_path / "bare"))
    assert len(loaded) == len(tokenizer) == 30522
    text = "A man is playing a guitar."
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert "holds no tokenizer" in capsys.readouterr().err
    # and the CLI's STS-B score is the packaged model's, not the [UNK]-only tokenizer's
    stsb = tmp_path / "sts-dev.tsv"
    stsb.write_text("".join(f"g\tf\ty\t{i}\t{i % 6}.0\t{sentence(i)}\t{sentence(i + i % 3)}\n" for i in range(30)))
    assert main(["eval", "stsb", "--data", str(stsb), "--json"]) == 0
    reference = json.loads(capsys.readouterr().out)
    assert main(["eval", "stsb", "--model", str(tmp_path / "bare"), "--data", str(stsb), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["spearman"] == pytest.approx(reference["spearman"], abs=1e-6)


def test_a_folder_without_tokenizer_or_source_is_refused(tmp_path):
    tiny_model("bert").save_pretrained(tmp_path / "m")
    with pytest.raises(HeadwiseError, match="holds no tokenizer files"):
        headwise.load_model(str(tmp_path / "m"))


def test_a_tokenizer_of_another_model_is_refused(llama_dir, minilm, tmp_path):
    shutil.copytree(llama_dir / "model", tmp_path / "m")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (tmp_path / "m" / name).unlink(missing_ok=True)
    minilm[1].save_pretrained(tmp_path / "m")  # 30,522 tokens for a model of 97 embeddings
    with pytest.raises(HeadwiseError, match="not this model's tokenizer"):
        headwise.load_model(str(tmp_path / "m"), task="lm")


# ---- case 2: edits dropped by convert -----------------------------------------------------------------------
def test_convert_reads_a_headwise_checkpoint_with_its_edits(llama_dir, tmp_path):
    from headwise.pruning import apply_masks, prune_masked

    model, tok = headwise.load_model(str(llama_dir / "model"), task="lm")
    apply_masks(model, {"dec-self": [[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]]})
    prune_masked(model)
    headwise.save_pretrained(model, tmp_path / "pruned", tokenizer=tok)
    assert main(["convert", "latent", "--model", str(tmp_path / "pruned"), "--rank", "8", "--latent-init", "svd",
                 "--eval-tokens", "0", "--out", str(tmp_path / "c")]) == 0
    reference = headwise.from_pretrained(tmp_path / "pruned")
    headwise.convert_latent(reference, rank=8, init="svd")
    assert torch.equal(llama_logits(headwise.from_pretrained(tmp_path / "c" / "model")), llama_logits(reference))


def test_convert_refuses_a_checkpoint_whose_ops_it_cannot_keep(llama_dir, tmp_path, capsys):
    model, tok = headwise.load_model(str(llama_dir / "model"), task="lm")
    for gate in add_gates(model).values():
        gate.weight.data.uniform_(0, 1)
    headwise.save_pretrained(model, tmp_path / "gated", tokenizer=tok)
    out = tmp_path / "c"
    assert main(["convert", "gqa", "--model", str(tmp_path / "gated"), "--kv-heads", "1", "--gqa-init", "mean",
                 "--eval-tokens", "0", "--out", str(out)]) == 2
    one_line_error(capsys, "carries headwise ops")
    assert not out.exists()


# ---- case 3: the task's model class with or without evaluation ----------------------------------------------
def test_prune_with_a_task_and_no_eval_saves_the_task_model(llama_dir, tmp_path, capsys):
    mask = tmp_path / "m.json"
    mask.write_text(json.dumps({"dec-self": [[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]]}))
    out = tmp_path / "p"
    assert main(["prune", "--model", str(llama_dir / "model"), "--task", "lm", "--strategy", "mask", "--mask",
                 str(mask), "--no-eval", "--out", str(out)]) == 0
    model = headwise.from_pretrained(out / "model")
    assert type(model).__name__ == "LlamaForCausalLM"
    capsys.readouterr()
    assert main(["eval", "lm", "--model", str(out / "model"), "--data", str(llama_dir / "text.txt"),
                 "--max-length", "32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["perplexity"] > 1


def test_a_classifier_built_from_a_base_checkpoint_reloads_with_its_head(bert_dir, tmp_path, capsys):
    model, tok = headwise.load_model(str(bert_dir / "model"), task="classification", new_head=True, num_labels=2)
    for gate in add_gates(model).values():
        gate.weight.data.uniform_(0, 1)
    headwise.save_pretrained(model, tmp_path / "c", tokenizer=tok)
    again, _ = headwise.load_model(str(tmp_path / "c"), task="classification")
    ids = torch.tensor([[3, 7, 9, 11, 4]])
    saved, reloaded = model.state_dict(), again.state_dict()
    assert saved.keys() == reloaded.keys() and all(torch.equal(saved[k], reloaded[k]) for k in saved)
    with torch.no_grad():  # same weights bit for bit; the CPU's matmul kernels may round differently by alignment
        torch.testing.assert_close(again(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=1e-6)
    assert main(["eval", "classification", "--model", str(tmp_path / "c"), "--data", str(bert_dir / "data.csv"),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["examples"] == 4


def test_sites_lists_an_encoder_decoder_saved_with_its_head(marian_dir, capsys):
    assert main(["sites", "--model", str(marian_dir / "model"), "--json"]) == 0
    sites = json.loads(capsys.readouterr().out)
    assert [s["kind"] for s in sites].count("dec-enc") == 2 and len(sites) == 6


# ---- model paths ----------------------------------------------------------------------------------------------
def test_a_model_path_that_does_not_exist_is_refused_without_the_hub(tmp_path, monkeypatch):
    import huggingface_hub

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_hub)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # online, a bare name (gpt2, my-model) is a hub candidate
    (tmp_path / "runs").mkdir()
    for missing in ("my-model", "runs/model", "./x", str(tmp_path / "nope")):
        with pytest.raises(HeadwiseError, match="does not exist"):
            headwise.load_model(missing)
    (tmp_path / "weights.bin").write_bytes(b"0")
    with pytest.raises(HeadwiseError, match="is a file, not a model folder"):
        headwise.load_model("weights.bin")


def test_damaged_weights_are_refused_in_one_line(tmp_path, capsys):
    plain, ours = tmp_path / "plain", tmp_path / "ours"
    tiny_model("bert").save_pretrained(plain)
    model = tiny_model("bert")
    add_gates(model)
    headwise.save_pretrained(model, ours)
    for folder in (plain, ours):
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        assert main(["sites", "--model", str(folder)]) == 2
        one_line_error(capsys, "damaged or truncated")


# ---- data files ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("verb", ["eval lm", "eval classification", "eval stsb", "eval translation", "analyze",
                                  "prune mask", "convert", "compress"])
def test_a_data_file_that_is_not_utf8_is_named_with_its_line(verb, tmp_path, capsys):
    bad = {"eval classification": "bad.csv", "eval stsb": "bad.tsv", "prune mask": "bad.json"}.get(verb, "bad.txt")
    path = tmp_path / bad
    path.write_bytes(b"text,label\n" + LATIN1 if verb == "eval classification" else LATIN1)
    out = tmp_path / "never"
    argv = {"eval lm": ["eval", "lm", "--data", str(path)],
            "eval classification": ["eval", "classification", "--data", str(path)],
            "eval stsb": ["eval", "stsb", "--data", str(path)],
            "eval translation": ["eval", "translation", "--src-file", str(path), "--tgt-file", str(path)],
            "analyze": ["analyze", "--data", str(path), "--out", str(out)],
            "prune mask": ["prune", "--strategy", "mask", "--mask", str(path), "--no-eval", "--out", str(out)],
            "convert": ["convert", "gqa", "--kv-heads", "1", "--data", str(path), "--out", str(out)],
            "compress": ["compress", "--dk", "8", "--calibration", str(path), "--out", str(out)]}[verb]
    assert main(argv) == 2
    line = 2 if verb == "eval classification" else 1
    one_line_error(capsys, f"{path}:{line}: not UTF-8")
    assert not out.exists()


def test_gzip_parallel_files_that_are_not_utf8_are_named(tmp_path):
    (tmp_path / "test.de.gz").write_bytes(gzip.compress(b"gut\n" + LATIN1))
    (tmp_path / "test.en.gz").write_bytes(gzip.compress(b"good\nfirst\nsecond\nthird\n"))
    with pytest.raises(HeadwiseError, match=r"test.de.gz:2: not UTF-8"):
        Translation(data_dir=str(tmp_path), split="test").check()


# ---- numbers, devices, masks ------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["eval", "classification", "--limit", "-1"], ["--limit", "-1"]),
    (["eval", "classification", "--limit", "0"], ["--limit", "0"]),
    (["eval", "classification", "--max-length", "0"], ["--max-length"]),
    (["eval", "stsb", "--batch-size", "0"], ["--batch-size"]),
    (["eval", "lm", "--device", "cuda:99"], ["--device", "cuda"]),
    (["analyze", "--limit", "1e3"], ["--limit", "not an integer"]),
    (["prune", "--epochs", "inf"], ["--epochs", "finite"]),
])
def test_bad_numbers_and_devices_are_refused_while_parsing(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    one_line_error(capsys, *words)
    assert list(tmp_path.iterdir()) == []


def test_task_sizes_are_checked_from_python(bert_dir):
    for bad in ({"limit": 0}, {"limit": -1}, {"batch_size": 0}, {"max_length": 0}):
        with pytest.raises(HeadwiseError, match="must be a positive integer"):
            Classification(data=str(bert_dir / "data.csv"), **bad)
    with pytest.raises(HeadwiseError, match="must be a positive integer"):
        Translation(src_file="a", tgt_file="b", limit=0)


def test_an_empty_mask_is_refused(tmp_path, capsys):
    mask = tmp_path / "m.json"
    mask.write_text("{}")
    assert main(["prune", "--strategy", "mask", "--mask", str(mask), "--no-eval", "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "is empty")


# ---- budgets -----------------------------------------------------------------------------------------------
def test_budget_percentages_mean_what_they_say():
    assert Budget.parse("heads=100%").head_count(72) == 72
    assert Budget.parse("heads=1").head_count(72) == 1
    assert Budget.parse(str(Budget.parse("heads=100%"))).head_count(72) == 72
    assert Budget.parse(Budget.parse("heads=100%").to_dict()).head_count(72) == 72
    assert Budget.parse("latency=+20%").latency == pytest.approx(1.2)
    for text, words in (("params=+20%", "is a cut"), ("heads=inf", "positive head count"),
                        ("heads=nan", "positive head count"), ("heads=150%", "more than every head")):
        with pytest.raises(HeadwiseError, match=words):
            Budget.parse(text)


# ---- long inputs ---------------------------------------------------------------------------------------------
def test_translation_sources_longer_than_the_model_are_cut_and_counted(marian_dir, tmp_path, capsys):
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text(" ".join(sentence(i) for i in range(40)) + "\n" + sentence(1) + "\n")  # > 64 positions
    tgt.write_text(sentence(2) + "\n" + sentence(3) + "\n")
    assert main(["eval", "translation", "--model", str(marian_dir / "model"), "--src-file", str(src),
                 "--tgt-file", str(tgt), "--max-length", "64", "--max-new-tokens", "8", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["truncated"] == 1
    assert "1 of 2 source sentences are longer than --max-length 64" in captured.err


@pytest.mark.parametrize("verb", ["eval classification", "analyze"])
def test_max_length_beyond_the_model_is_refused_in_one_line(verb, bert_dir, tmp_path, capsys):
    out = tmp_path / "never"
    argv = {"eval classification": ["eval", "classification", "--model", str(bert_dir / "model"), "--new-head",
                                    "--data", str(bert_dir / "data.csv"), "--max-length", "4096"],
            "analyze": ["analyze", "--model", str(bert_dir / "model"), "--max-length", "4096", "--out", str(out),
                        "--data", str(bert_dir / "texts.txt"), "--importance", "none", "--limit", "4"]}[verb]
    assert main(argv) == 2
    one_line_error(capsys, "--max-length 4096 is longer than the model's context of 512 tokens")
    assert not out.exists()


# ---- outputs -----------------------------------------------------------------------------------------------
def _writer(out: str, barrier, results) -> None:
    barrier.wait()
    try:
        with atomic_dir(out) as tmp:
            (tmp / "who").write_text(str(os.getpid()))
            time.sleep(0.05)
        results.put(("won", os.getpid()))
    except HeadwiseError as err:
        results.put(("refused", str(err)))


def test_of_two_concurrent_writers_exactly_one_wins_20_of_20(tmp_path):
    ctx = multiprocessing.get_context("fork")
    for trial in range(20):
        out = tmp_path / f"out{trial}"
        barrier, results = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_writer, args=(str(out), barrier, results)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        outcomes = [results.get(timeout=5) for _ in procs]
        winners = [pid for kind, pid in outcomes if kind == "won"]
        assert len(winners) == 1, (trial, outcomes)
        assert (out / "who").read_text() == str(winners[0])
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(f".out{trial}.")) == []


def _killed_writer(out: str) -> None:
    with atomic_dir(out) as tmp:
        (tmp / "half").write_bytes(b"0" * 1000)
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_writer_leaves_nothing_the_next_run_keeps(tmp_path):
    out = tmp_path / "out"
    p = multiprocessing.get_context("fork").Process(target=_killed_writer, args=(str(out),))
    p.start()
    p.join(30)
    assert p.exitcode == -signal.SIGKILL
    assert [x.name for x in tmp_path.iterdir() if x.name.startswith(".out.")]  # its temporary is left
    (tmp_path / ".out.k3j4h5g6").mkdir()  # a temporary of headwise 0.1
    with atomic_dir(out) as tmp:
        (tmp / "a").write_text("1")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out"]


def test_out_dot_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for path in (".", "..", str(tmp_path)):
        with pytest.raises(HeadwiseError, match="working directory"):
            check_writable_dir(path, overwrite=True)
    (tmp_path / "mine.txt").write_text("keep")
    mask = tmp_path / "m.json"
    mask.write_text(json.dumps({"enc-self": [[1] * 12] * 6}))
    started = time.monotonic()
    assert main(["prune", "--model", "/no/such/model", "--strategy", "mask", "--mask", str(mask), "--no-eval",
                 "--out", ".", "--force"]) == 2
    one_line_error(capsys, "working directory")
    assert (tmp_path / "mine.txt").read_text() == "keep" and time.monotonic() - started < 30


# ---- convert: --task, default calibration, checkpoints -----------------------------------------------------
def test_convert_takes_a_task_and_calibrates_on_its_default_data(llama_dir, tmp_path, monkeypatch, capsys):
    data = tmp_path / "data" / "wikitext-2"
    data.mkdir(parents=True)
    shutil.copy(llama_dir / "text.txt", data / "valid.txt")
    monkeypatch.setenv("HEADWISE_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "c"
    assert main(["convert", "gqa", "--task", "lm", "--model", str(llama_dir / "model"), "--kv-heads", "1",
                 "--max-length", "16", "--calib-tokens", "64", "--eval-tokens", "16", "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    assert f"calibrating on {data / 'valid.txt'}" in captured.err
    summary = json.loads(captured.out)
    assert summary["task"] == "lm" and summary["options"]["init"] == "calibrated"
    assert main(["convert", "gqa", "--task", "classification", "--kv-heads", "1", "--out", str(tmp_path / "x")]) == 2
    one_line_error(capsys, "--task lm", "--task translation")


def test_convert_keeps_the_last_complete_checkpoint_and_resumes_from_it(llama_dir, tmp_path, capsys):
    out = tmp_path / "c"
    checkpoints = tmp_path / "c.checkpoints"
    common = ["convert", "gqa", "--model", str(llama_dir / "model"), "--kv-heads", "1", "--gqa-init", "mean",
              "--data", str(llama_dir / "text.txt"), "--max-length", "16", "--eval-tokens", "0",
              "--uptrain-tokens", "128", "--out", str(out)]
    assert main(common) == 0
    assert not checkpoints.exists()  # removed at the end
    assert main(common + ["--force", "--keep-checkpoints"]) == 0
    kept = sorted(p.name for p in checkpoints.iterdir())
    assert kept == ["checkpoint-8", "options.json"]  # save_steps 2: only the last complete one stays
    (checkpoints / "checkpoint-9").mkdir()  # a save killed half-way: no trainer_state.json
    (checkpoints / "checkpoint-9" / "model.safetensors").write_bytes(b"\0" * 10)
    capsys.readouterr()
    assert main(common + ["--force", "--resume"]) == 0
    assert "checkpoint-9 is incomplete" in capsys.readouterr().err
    assert not checkpoints.exists()


# ---- a marker plain transformers reports ---------------------------------------------------------------------
def test_plain_transformers_refuses_a_checkpoint_with_ops_naming_headwise(tmp_path):
    import headwise.mechanisms

    model = tiny_model("bert")
    headwise.mechanisms.use(model, "linear")  # an op without weights of its own
    headwise.save_pretrained(model, tmp_path / "m")
    with pytest.raises(ValueError, match=f"{tmp_path / 'm'} contains custom code"):  # load_with_headwise.py
        tf.AutoModel.from_pretrained(tmp_path / "m", trust_remote_code=False)
    assert type(headwise.from_pretrained(tmp_path / "m")).__name__ == "BertModel"  # headwise reads it as before
