"""Messy data is refused before any work, with one line naming the file, the line and the fix: labels (empty,
missing, null, nan/inf, a single class, an eval class the training split lacks), STS-B scores and sentences, and
metrics undefined on the data (fewer than two pairs, a constant column)."""

import json

import numpy as np
import pytest

from headwise.errors import HeadwiseError
from headwise.tasks import Classification, Stsb, read_stsb
from headwise.tasks.classification import classification_metrics
from headwise.tasks.metrics import correlations, finite_metrics


def csv_file(path, rows, header="text,label"):
    path.write_text(header + "\n" + "".join(f"{r}\n" for r in rows))
    return path


def split_folder(tmp_path, train, dev):
    csv_file(tmp_path / "train.csv", train)
    csv_file(tmp_path / "dev.csv", dev)
    return str(tmp_path)


def refused(match, **task):
    with pytest.raises(HeadwiseError, match=match) as err:
        Classification(**task).check()
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("cell, why", [("", "label is empty"), ("  ", "label is empty"), ("nan", "not a finite"),
                                       ("inf", "not a finite"), ("-Infinity", "not a finite")])
def test_a_bad_label_is_refused_with_its_file_and_line(tmp_path, cell, why):
    data = split_folder(tmp_path, ["a,0", "b,1", f"c,{cell}", "d,1"], ["e,0", "f,1"])
    message = refused(why, data=data)
    assert f"{tmp_path / 'train.csv'}:4:" in message  # header is line 1, the third row line 4


def test_a_short_csv_row_and_a_jsonl_row_without_its_label_name_the_row(tmp_path):
    data = split_folder(tmp_path, ["a,0", "b,1", "c"], ["e,0", "f,1"])
    refused(r"train.csv:4: no 'label' label", data=data)
    rows = [{"text": "a", "label": 0}, {"text": "b", "label": 1}, {"text": "c", "label": None}, {"text": "d"}]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "train.csv").unlink()
    refused(r"train.jsonl:3: no 'label' label", data=str(tmp_path))
    (tmp_path / "train.jsonl").write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[1]) + "\n\n[1, 2]\n")
    refused(r"train.jsonl:4: a list, not a JSON object", data=str(tmp_path))


def test_a_single_class_and_an_unseen_eval_class_are_refused(tmp_path):
    refused(r"train.csv: every label in the train split is 'pos'.*two classes",
            data=split_folder(tmp_path, ["a,pos", "b,pos"], ["c,pos", "d,neg"]))
    refused(r"dev.csv:3: label 'mid' is not among the train split's classes \(neg, pos\)",
            data=split_folder(tmp_path, ["a,pos", "b,neg"], ["c,pos", "d,mid"]))


@pytest.mark.parametrize("labels, classes", [((1, 2), ["1", "2"]), ((-1, 1), ["-1", "1"]), ((0, 1), ["0", "1"]),
                                             ((2, 10), ["2", "10"])])
def test_integer_labels_are_their_own_classes_in_numeric_order(tmp_path, labels, classes):
    low, high = labels
    task = Classification(data=split_folder(tmp_path, [f"a,{low}", f"b,{high}", f"c,{high}.0"], [f"d,{high}",
                                                                                                    f"e,{low}"]))
    task.check()
    assert task.label_names() == classes and not task.is_regression()
    # perfect predictions of the positive class score 100 (labels 1/2 used to invent a class 0: F1 66.7)
    gold = np.array([classes.index(str(high)), classes.index(str(low))])
    assert classification_metrics(gold, gold.copy(), len(classes))["f1"] == 100.0


def test_regression_labels_and_undefined_correlations(tmp_path):
    task = Classification(data=split_folder(tmp_path, ["a,0.5", "b,1.5"], ["c,0.25", "d,0.75"]))
    task.check()
    assert task.is_regression() and task.metric == "spearman"
    with pytest.raises(HeadwiseError, match="dev.csv: a correlation needs at least two pairs, got 1"):
        Classification(data=split_folder(tmp_path, ["a,0.5", "b,1.5"], ["c,0.25", "d,0.75"]), limit=1).check()
    with pytest.raises(HeadwiseError, match="at least two pairs, got 1"):
        correlations([0.3], [0.5], "data")
    with pytest.raises(HeadwiseError, match="every gold score is 2"):
        correlations([0.1, 0.2, 0.3], [2.0, 2.0, 2.0], "data")
    with pytest.raises(HeadwiseError, match="predicts the same value"):
        correlations([0.1, 0.1], [1.0, 2.0], "data")
    with pytest.raises(HeadwiseError, match="NaN or infinity"):
        correlations([float("nan"), 0.1], [1.0, 2.0], "data")
    got = correlations([0.1, 0.3, 0.2], [1.0, 3.0, 2.0], "data")
    assert got == pytest.approx({"pearson": 100.0, "spearman": 100.0})


def test_non_finite_metrics_are_refused():
    assert finite_metrics({"bleu": 12.5, "sentences": 3}, "t") == {"bleu": 12.5, "sentences": 3}
    with pytest.raises(HeadwiseError, match="metric spearman came out nan"):
        finite_metrics({"spearman": float("nan")}, "t")
    with pytest.raises(HeadwiseError, match="perplexity came out inf"):
        finite_metrics({"perplexity": np.float64("inf")}, "t")


def stsb_file(path, scores, second="a dog runs"):
    path.write_text("".join(f"g\tf\t2012\t{i:04d}\t{s}\ta cat sits\t{second}\n" for i, s in enumerate(scores)))
    return path


@pytest.mark.parametrize("score", ["nan", "inf", "-0.5", "5.01", "x"])
def test_stsb_scores_are_finite_and_in_range(tmp_path, score):
    path = stsb_file(tmp_path / "sts-dev.tsv", ["1.0", score])
    with pytest.raises(HeadwiseError, match=rf"sts-dev.tsv:2: score '{score}' is not a number"):
        read_stsb("dev", path)


def test_stsb_empty_sentences_and_too_few_or_equal_scores(tmp_path):
    with pytest.raises(HeadwiseError, match=r"sts-dev.tsv:1: sentence 2 \(column 7\) is empty"):
        read_stsb("dev", stsb_file(tmp_path / "sts-dev.tsv", ["1.0", "2.0"], second=" "))
    path = stsb_file(tmp_path / "sts-dev.tsv", ["1.0", "2.0", "3.0"])
    assert read_stsb("dev", path).scores == [1.0, 2.0, 3.0]
    Stsb(data=str(path)).check()
    with pytest.raises(HeadwiseError, match="at least two pairs, got 1; evaluate more"):
        Stsb(data=str(path), limit=1).check()
    with pytest.raises(HeadwiseError, match="every gold score is 4"):
        Stsb(data=str(stsb_file(tmp_path / "sts-dev.tsv", ["4", "4.0"]))).check()


def test_a_classifier_with_nan_outputs_gives_no_accuracy(tmp_path):
    import torch
    import transformers as tf
    from headwise.tasks import train_tokenizer
    from tiny import VOCAB

    data = split_folder(tmp_path, [f"a b {i},{i % 2}" for i in range(6)], ["a b,0", "b a,1"])
    tokenizer = train_tokenizer(["a b c d"] * 10, vocab_size=40, min_frequency=1)
    torch.manual_seed(0)
    model = tf.BertForSequenceClassification(tf.BertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=20, vocab_size=VOCAB,
        num_labels=2)).eval()
    task = Classification(data=data, max_length=16)
    assert 0 <= task.evaluate(model, tokenizer, progress=False)["accuracy"] <= 100
    with torch.no_grad():
        model.classifier.bias[0] = float("nan")
    with pytest.raises(HeadwiseError, match="outputs hold NaN or infinity"):
        task.evaluate(model, tokenizer, progress=False)
