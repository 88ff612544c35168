"""Tasks on tiny random models of each kind: metrics against independent computations, losses, splits, heads,
bad input."""

import csv
import gzip
import json
import math

import pytest
import sacrebleu
import torch
import torch.nn.functional as F
import transformers as tf

import headwise
from headwise.errors import HeadwiseError
from headwise.tasks import Classification, LanguageModeling, Translation, collate, get_task, train_tokenizer
from headwise.tasks.classification import classification_metrics, matthews
from headwise.training import finetune
from tiny import VOCAB, tiny_seq2seq

WORDS = "the a cat dog sat on mat ran to house big small red blue tree sun".split()


def sentence(i: int, n: int = 6) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n + i % 3))


@pytest.fixture(scope="module")
def tokenizer():
    tok = train_tokenizer([sentence(i) for i in range(200)], vocab_size=80, min_frequency=1)
    assert len(tok) <= VOCAB
    return tok


@pytest.fixture(scope="module")
def causal(tmp_path_factory):
    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=37, vocab_size=VOCAB, max_position_embeddings=64)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise").eval()
    path = tmp_path_factory.mktemp("llama")
    model.save_pretrained(path)
    return model, path


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("\n".join(sentence(i) for i in range(40)) + "\n")
    return path


def reference_perplexity(model, ids: torch.Tensor, max_length: int, stride: int) -> float:
    """transformers' guide: windows of max_length every stride tokens, labels -100 on the context already scored,
    the model's own loss (mean over the window's scored tokens) × scored tokens."""
    nll, count, prev_end = 0.0, 0, 0
    for begin in range(0, len(ids), stride):
        end = min(begin + max_length, len(ids))
        target = end - prev_end
        window = ids[begin:end][None]
        labels = window.clone()
        labels[:, :-target] = -100
        with torch.no_grad():
            loss = model(input_ids=window, labels=labels).loss
        scored = int((labels[:, 1:] != -100).sum())
        nll, count, prev_end = nll + float(loss) * scored, count + scored, end
        if end == len(ids):
            break
    return math.exp(nll / count)


@pytest.mark.parametrize("max_length,stride", [(16, 16), (16, 8), (40, 13)])
def test_perplexity_matches_the_strided_reference(causal, tokenizer, text_file, max_length, stride):
    model, _ = causal
    task = LanguageModeling(data=str(text_file), max_length=max_length, stride=stride)
    ids = task.token_stream(tokenizer, "eval")
    got = task.evaluate(model, tokenizer, progress=False)
    assert got["perplexity"] == pytest.approx(reference_perplexity(model, ids, max_length, stride), rel=1e-5)
    # every token is scored once, except those that start a window without context (disjoint windows)
    assert got["tokens"] == len(ids) - sum(first == 0 for _, _, first in task.windows(len(ids)))


def test_lm_split_policy_and_max_tokens(tokenizer, text_file):
    lines = text_file.read_text().splitlines()
    task = LanguageModeling(data=str(text_file))
    assert task.texts("train") == lines[:36] and task.texts("eval") == lines[36:]
    assert task.texts("calibration") == lines[:36]
    assert LanguageModeling(data=str(text_file), split="all").texts("eval") == lines
    assert len(LanguageModeling(data=str(text_file), max_tokens=7).token_stream(tokenizer, "eval")) == 7


@pytest.mark.parametrize("which", ["bpe", "minilm-wordpiece"])
def test_a_cut_stream_tokenises_a_prefix_and_keeps_the_whole_texts_tokens(tokenizer, text_file, monkeypatch, which):
    """``--max-tokens`` reads a prefix of the text, doubled until it holds the margin past the cut; the tokens
    kept are the first ones of the whole text's tokenisation (the reference: the whole text tokenised)."""
    from transformers import AutoTokenizer

    from headwise.models import packaged_minilm
    from headwise.tasks import lm

    if which != "bpe":
        tokenizer = AutoTokenizer.from_pretrained(packaged_minilm())
    monkeypatch.setattr(lm, "STREAM_CHARS_PER_TOKEN", 1)  # the first prefix is too short: it is doubled
    monkeypatch.setattr(lm, "STREAM_MARGIN", 5)
    seen = []

    def counting(text, **kwargs):
        seen.append(len(text))
        return type(tokenizer).__call__(tokenizer, text, **kwargs)

    whole = "\n".join(LanguageModeling(data=str(text_file)).texts("train"))
    reference = tokenizer(whole, add_special_tokens=False)["input_ids"]
    for n in (2, 7, 33, len(reference) - 3, len(reference) + 50):
        seen.clear()
        task = LanguageModeling(data=str(text_file), max_tokens=n)
        got = task.token_stream(counting, "train").tolist()  # the tokenizer, counting the characters it reads
        assert got == reference[:n]
        assert len(seen) >= 2 and seen == sorted(seen) and seen[-1] <= len(whole)
        if n <= 33:  # a short cut never reads the whole text
            assert seen[-1] < len(whole)


def test_lm_loss_is_the_mean_next_token_loss_of_each_window(causal, tokenizer, text_file):
    model, _ = causal
    task = LanguageModeling(data=str(text_file), max_length=12)
    batch = collate(task.examples(tokenizer, "train").items[:3], 0)
    losses = task.loss(model, batch)
    for b in range(3):
        ids = batch["input_ids"][b : b + 1]
        with torch.no_grad():
            expected = model(input_ids=ids, labels=ids).loss
        assert losses[b].item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 3e-2), (torch.bfloat16, 6e-2)])
def test_next_token_nll_in_half_precision(causal, tokenizer, text_file, dtype, tol):
    model, path = causal
    task = LanguageModeling(data=str(text_file), max_length=16)
    batch = collate(task.examples(tokenizer, "train").items[:2], 0)
    reference = task.loss(model, batch)
    half = tf.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="headwise").eval()
    got = task.loss(half, batch)
    assert got.dtype == torch.float32 and torch.allclose(got, reference, rtol=tol)


def plain_lm_loss(model, batch):
    """The reference: cross-entropy of the model's full logits, mean over each window's scored tokens."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
    target = batch["labels"][:, 1:]
    nll = F.cross_entropy(logits.transpose(1, 2), target.clamp(min=0), reduction="none")
    return (nll * (target != -100)).sum(1) / (target != -100).sum(1)


@pytest.mark.parametrize("frozen_head", [False, True], ids=["trained-head", "frozen-head"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_chunked_lm_loss_and_gradient_equal_the_full_logits_ones(causal, tokenizer, text_file, monkeypatch,
                                                                  dtype, tol, frozen_head):
    from headwise.tasks import lm

    model, path = causal
    model = tf.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="headwise").eval()
    if frozen_head:  # the fused frozen-head loss (analysis, distillation to a frozen head): its input gradient
        model.get_output_embeddings().requires_grad_(False)
        model.get_input_embeddings().requires_grad_(False)
        used = []
        monkeypatch.setattr(lm._FrozenHeadNLL, "apply", lambda *a, _f=lm._FrozenHeadNLL.apply: used.append(1) or _f(*a))
    task = LanguageModeling(data=str(text_file), max_length=16)
    batch = collate(task.examples(tokenizer, "train").items[:3], 0)
    batch["labels"][0, :5] = -100  # unscored positions, as in strided windows
    monkeypatch.setattr(lm, "LOSS_CHUNK_BYTES", 1)
    monkeypatch.setattr(lm, "LOSS_CHUNK_MIN_ROWS", 7)  # chunks of 7 positions: several per batch
    results = []
    for loss_fn in (task.loss, plain_lm_loss):
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.sum().backward()
        results.append((loss.detach(), {n: p.grad.float() for n, p in model.named_parameters() if p.requires_grad}))
    (got, got_grads), (want, want_grads) = results
    assert not frozen_head or used, "the frozen head's fused loss was not used"
    assert got.dtype == torch.float32 and torch.allclose(got, want, rtol=tol, atol=tol)
    for name, grad in want_grads.items():
        assert torch.allclose(got_grads[name], grad, rtol=tol, atol=tol * grad.abs().max()), name


def test_the_frozen_heads_loss_gradient_is_taken_once_and_a_second_time_is_refused(causal, tokenizer, text_file):
    """The fused frozen-head loss scales its one ``[N, D]`` buffer in place in the backward: the gradient equals
    the full logits' (above), and a second backward of the same forward (``retain_graph``) is refused in one line
    instead of scaling the buffer twice."""
    from headwise.errors import HeadwiseError
    from headwise.tasks.lm import head_nll

    import copy

    head = copy.deepcopy(causal[0].get_output_embeddings()).requires_grad_(False)
    hidden = torch.randn(2, 5, head.in_features, requires_grad=True)
    target = torch.randint(0, head.out_features, (2, 5))
    loss = head_nll(head, hidden, target, head.out_features).sum()
    (first,) = torch.autograd.grad(loss, hidden, retain_graph=True)
    want = (torch.softmax(head(hidden).float(), -1) - F.one_hot(target, head.out_features)) @ head.weight
    torch.testing.assert_close(first, want.detach(), rtol=1e-5, atol=1e-6)
    with pytest.raises(HeadwiseError, match="taken twice"):
        torch.autograd.grad(loss, hidden)


def test_lm_loss_of_a_model_that_post_processes_its_logits(causal, tokenizer, text_file):
    model, _ = causal
    task = LanguageModeling(data=str(text_file), max_length=16)
    batch = collate(task.examples(tokenizer, "train").items[:2], 0)
    plain = task.loss(model, batch)

    def scale(module, args, kwargs, output):  # a logit scale, as Cohere's or Granite's
        output.logits = 30.0 * output.logits
        return output

    handle = model.register_forward_hook(scale, with_kwargs=True)
    try:
        with torch.no_grad():
            got, want = task.loss(model, batch), plain_lm_loss(model, batch)
    finally:
        handle.remove()
    assert torch.allclose(got, want, rtol=1e-5) and not torch.allclose(got, plain, rtol=1e-3)


def test_lm_loss_on_the_meta_device(causal, tokenizer, text_file):
    model, _ = causal
    task = LanguageModeling(data=str(text_file), max_length=16)
    # no attention mask: transformers' mask builder reads it with .item(), which meta tensors refuse
    batch = {k: v.to("meta") for k, v in collate(task.examples(tokenizer, "train").items[:2], 0).items()
             if k != "attention_mask"}
    with torch.device("meta"):
        meta = tf.AutoModelForCausalLM.from_config(model.config, attn_implementation="headwise")
    assert task.loss(meta, batch).shape == (2,)


def test_lm_bad_input(causal, tokenizer, tmp_path, text_file):
    model, _ = causal
    with pytest.raises(HeadwiseError, match="not found: .*nope.txt"):
        LanguageModeling(data=str(tmp_path / "nope.txt")).check()
    (tmp_path / "empty.txt").write_text("\n  \n")
    with pytest.raises(HeadwiseError, match="holds no text"):
        LanguageModeling(data=str(tmp_path / "empty.txt")).check()
    with pytest.raises(HeadwiseError, match="longer than the model's context of 64"):
        LanguageModeling(data=str(text_file), max_length=65).evaluate(model, tokenizer)
    with pytest.raises(HeadwiseError, match="--stride 9 must be between 1 and --max-length 8"):
        LanguageModeling(max_length=8, stride=9)
    with pytest.raises(HeadwiseError, match="unknown task 'nope'"):
        get_task("nope")
    with pytest.raises(HeadwiseError, match="takes no option 'beam'"):
        get_task("lm", beam=4)


# ---- heads ------------------------------------------------------------------------------------------------

def test_the_task_picks_the_head_and_a_missing_head_is_refused(causal, tmp_path):
    _, path = causal
    model, _ = headwise.load_model(str(path), task="lm", with_tokenizer=False)
    assert type(model).__name__ == "LlamaForCausalLM"
    base, _ = headwise.load_model(str(path), with_tokenizer=False)
    assert type(base).__name__ == "LlamaModel"
    base.save_pretrained(tmp_path / "base")
    with pytest.raises(HeadwiseError, match="no weights for the causal-lm head .*lm_head.weight"):
        headwise.load_model(str(tmp_path / "base"), task="lm", with_tokenizer=False)
    with pytest.raises(HeadwiseError, match="not an encoder-decoder; the task needs an encoder-decoder"):
        headwise.load_model(str(path), task="translation", with_tokenizer=False)
    with pytest.raises(HeadwiseError, match="no weights for the classification head .*--new-head"):
        headwise.load_model(str(tmp_path / "base"), task="classification", with_tokenizer=False)
    fresh, _ = headwise.load_model(str(tmp_path / "base"), task="classification", new_head=True, num_labels=3,
                                   with_tokenizer=False)
    assert type(fresh).__name__ == "LlamaForSequenceClassification" and fresh.config.num_labels == 3
    with pytest.raises(HeadwiseError, match="needs a language-modelling head, but the model is a LlamaModel"):
        LanguageModeling().check_model(base, None)


def test_task_tables_of_the_lower_layers_match_the_tasks():
    from dataclasses import fields

    from headwise.cli.task_options import OPTIONS, TASK_NAMES, USED_BY
    from headwise.models import TASK_HEADS
    from headwise.tasks import TASKS

    assert TASK_HEADS == {name: cls.head for name, cls in TASKS.items()} and set(TASK_NAMES) == set(TASKS)
    for option in OPTIONS.values():
        assert set(USED_BY[option]) == {n for n, cls in TASKS.items() if option in {f.name for f in fields(cls)}}


# ---- translation --------------------------------------------------------------------------------------------

@pytest.fixture
def parallel(tmp_path):
    for split, n in (("train", 12), ("val", 4), ("test", 5)):
        for lang, shift in (("de", 1), ("en", 2)):
            lines = "".join(sentence(i + shift) + "\n" for i in range(n)).encode()
            (tmp_path / f"{split}.{lang}.gz").write_bytes(gzip.compress(lines))
    return tmp_path


def test_bleu_matches_plain_generate_and_sacrebleu(parallel, tokenizer):
    model = tiny_seq2seq("marian", pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         decoder_start_token_id=tokenizer.pad_token_id)
    task = Translation(data_dir=str(parallel), split="test", max_new_tokens=10, max_length=32)
    for beam in (1, 3):
        task.beam = beam
        got = task.evaluate(model, tokenizer, progress=False)
        corpus = task.corpus("eval")
        enc = tokenizer(corpus.source, padding=True, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=10, num_beams=beam, do_sample=False)
        hyps = tokenizer.batch_decode(out, skip_special_tokens=True)
        assert got["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [corpus.target]).score)
        assert got["sentences"] == 5


def test_translation_loss_is_the_label_loss(parallel, tokenizer):
    model = tiny_seq2seq("marian", pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         decoder_start_token_id=tokenizer.pad_token_id)
    task = Translation(data_dir=str(parallel), split="test", max_length=32)
    batch = collate(task.examples(tokenizer, "train").items[:3], tokenizer.pad_token_id)
    losses = task.loss(model, batch)
    for b in range(3):
        real = batch["labels"][b] != -100
        with torch.no_grad():
            expected = model(input_ids=batch["input_ids"][b : b + 1][:, batch["attention_mask"][b].bool()],
                             labels=batch["labels"][b : b + 1][:, real]).loss
        assert losses[b].item() == pytest.approx(expected.item(), rel=1e-5)
    calib = task.calibration_inputs(tokenizer, limit=4, batch_size=2)
    assert len(calib) == 2 and set(calib[0]) == {"input_ids", "attention_mask", "decoder_input_ids",
                                                  "decoder_attention_mask"}
    assert torch.equal(calib[0]["decoder_input_ids"][:, 0], torch.full((2,), tokenizer.pad_token_id))


def test_translation_bad_input(parallel, tmp_path):
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    (tmp_path / "a.en").write_text("one\n")
    with pytest.raises(HeadwiseError, match="has 2 lines but .*a.en has 1"):
        Translation(src_file=str(tmp_path / "a.de"), tgt_file=str(tmp_path / "a.en")).check()
    (tmp_path / "b.en").write_text("one\n\n")
    with pytest.raises(HeadwiseError, match="b.en:2 is empty"):
        Translation(src_file=str(tmp_path / "a.de"), tgt_file=str(tmp_path / "b.en")).check()
    with pytest.raises(HeadwiseError, match="not found: .*nope.de"):
        Translation(src_file=str(tmp_path / "nope.de"), tgt_file=str(tmp_path / "a.en")).check()
    with pytest.raises(HeadwiseError, match="no test_2016_flickr.de"):
        Translation(data_dir=str(parallel)).check()
    with pytest.raises(HeadwiseError, match="give both --src-file and --tgt-file"):
        Translation(src_file="x")


# ---- classification -----------------------------------------------------------------------------------------

def test_classification_metrics_against_a_hand_computed_table():
    gold = torch.tensor([1, 1, 1, 0, 0, 0, 0, 1]).numpy()
    pred = torch.tensor([1, 1, 0, 0, 0, 1, 0, 1]).numpy()
    # tp 3, fp 1, fn 1, tn 3: accuracy 6/8, F1 6/8, MCC (9 - 1) / sqrt(4·4·4·4) = 0.5
    got = classification_metrics(gold, pred, 2)
    assert got == pytest.approx({"accuracy": 75.0, "f1": 75.0, "matthews": 50.0})
    # three classes, Gorodkin's R_K: c = [[2,0,0],[1,1,0],[0,0,2]] → cov = 5·6 − (2·3+2·1+2·2) = 18
    three_gold, three_pred = [0, 0, 1, 1, 2, 2], [0, 0, 0, 1, 2, 2]
    import numpy as np
    expected = 18 / math.sqrt((36 - (9 + 1 + 4)) * (36 - (4 + 4 + 4)))
    assert matthews(np.array(three_gold), np.array(three_pred)) == pytest.approx(expected)


def write_table(path, rows):
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t" if path.suffix == ".tsv" else ",")
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_classification_evaluates_like_a_manual_argmax(tmp_path, tokenizer, suffix):
    rows = [{"text": sentence(i), "pair": sentence(i + 5), "label": ["neg", "pos", "mid"][i % 3]}
            for i in range(30)]
    path = write_table(tmp_path / f"data{suffix}", rows)
    task = Classification(data=str(path), max_length=32)
    task.check()
    assert task.label_names() == ["mid", "neg", "pos"] and task.pair_column == "pair"
    torch.manual_seed(0)
    model = tf.BertForSequenceClassification(tf.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, vocab_size=VOCAB,
        num_labels=3, attn_implementation="headwise")).eval()
    got = task.evaluate(model, tokenizer, progress=False)
    eval_rows = rows[27:]  # the last 10% evaluate
    enc = tokenizer([r["text"] for r in eval_rows], [r["pair"] for r in eval_rows], padding=True,
                    return_tensors="pt")
    with torch.no_grad():
        pred = model(**enc).logits.argmax(-1)
    gold = torch.tensor([["mid", "neg", "pos"].index(r["label"]) for r in eval_rows])
    assert got["accuracy"] == pytest.approx(100 * (pred == gold).float().mean().item())
    batch = collate(task.examples(tokenizer, "train").items[:4], tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    expected = F.cross_entropy(logits, batch["label"], reduction="none")
    assert torch.allclose(task.loss(model, batch), expected, atol=1e-6)


def test_classification_regression_and_bad_input(tmp_path, tokenizer):
    rows = [{"sentence": sentence(i), "score": str(0.5 + i / 7)} for i in range(20)]
    path = write_table(tmp_path / "reg.csv", rows)
    task = Classification(data=str(path), text_column="sentence", label_column="score")
    task.check()
    assert task.is_regression() and task.metric == "spearman" and task.pair_column is None
    with pytest.raises(HeadwiseError, match="no column 'label' .*pass --label-column NAME"):
        Classification(data=str(path), text_column="sentence").check()
    with pytest.raises(HeadwiseError, match="no column 'other'.*--pair-column"):
        Classification(data=str(path), text_column="sentence", label_column="score", pair_column="other").check()
    with pytest.raises(HeadwiseError, match="needs --data"):
        Classification()
    with pytest.raises(HeadwiseError, match="unknown GLUE task 'nope'"):
        Classification(data="glue:nope")


def test_finetuning_with_the_translation_loss_lowers_it(parallel, tokenizer):
    model = tiny_seq2seq("marian", pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         decoder_start_token_id=tokenizer.pad_token_id)
    task = Translation(data_dir=str(parallel), split="test", max_length=32)
    batch = collate(task.examples(tokenizer, "train").items, tokenizer.pad_token_id)
    with torch.no_grad():
        before = task.loss(model, batch).mean().item()
    finetune(model, tokenizer, task, max_steps=20, learning_rate=3e-3, batch_size=4, progress=False)
    with torch.no_grad():
        after = task.loss(model, batch).mean().item()
    assert after < before - 0.1 and not model.training


def test_classification_split_is_the_split_evaluated(tmp_path, tokenizer):
    """``--split``: train scores the training rows (a single file's first 90%), dev is eval, test needs a folder."""
    rows = [{"text": sentence(i), "label": ["neg", "pos"][i % 2]} for i in range(40)]
    path = write_table(tmp_path / "data.csv", rows)
    model = tf.BertForSequenceClassification(tf.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, vocab_size=VOCAB,
        num_labels=2, attn_implementation="headwise")).eval()
    train = Classification(data=str(path), split="train", max_length=32)
    assert [r["text"] for r in train.rows("eval")] == [r["text"] for r in rows[:36]]
    assert train.evaluate(model, tokenizer, progress=False)["examples"] == 36
    assert Classification(data=str(path), split="dev", max_length=32, limit=3).evaluate(
        model, tokenizer, progress=False)["examples"] == 3  # dev is eval: the last 10%, first 3 of them
    with pytest.raises(HeadwiseError, match="one file: .* for --split test pass a folder with a test file"):
        Classification(data=str(path), split="test").check()
    with pytest.raises(HeadwiseError, match="--split 'holdout': use train, eval"):
        Classification(data=str(path), split="holdout")
    folder = tmp_path / "splits"
    folder.mkdir()
    write_table(folder / "train.csv", rows[:30])
    write_table(folder / "test.csv", rows[30:])
    test = Classification(data=str(folder), split="test", max_length=32)
    assert [r["text"] for r in test.rows("eval")] == [r["text"] for r in rows[30:]]
    assert test.evaluate(model, tokenizer, progress=False)["examples"] == 10


def test_a_classifier_fine_tuned_from_a_csv_keeps_its_label_names(tmp_path, tokenizer):
    from headwise.cli import main
    from tiny import tiny_model

    tiny_model("bert").save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    names = ["food", "sports", "weather"]
    write_table(tmp_path / "genre.csv", [{"text": sentence(i), "label": names[i % 3]} for i in range(30)])
    assert main(["mix", "--task", "classification", "--data", str(tmp_path / "genre.csv"), "--new-head",
                 "--no-mixers", "--mix-epochs", "1", "--max-length", "32", "--model", str(tmp_path / "base"),
                 "--out", str(tmp_path / "tuned")]) == 0
    saved = headwise.from_pretrained(tmp_path / "tuned" / "model")
    assert saved.config.id2label == dict(enumerate(names)) and saved.config.label2id == {n: i for i, n in
                                                                                         enumerate(names)}
