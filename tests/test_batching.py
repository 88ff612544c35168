"""The one batching path (``headwise.batching``): ``collate`` against hand-written tables, ``text_batches`` against
the tokenizer's own right padding, and ``batches`` order and devices."""

from __future__ import annotations

import pytest
import torch

from headwise.batching import (LABEL_PAD, Examples, batches, check_context, collate, mean_pool, text_batches,
                               tokenize)
from headwise.errors import HeadwiseError
from headwise.models import load_tokenizer


class WordTokenizer:
    """Words → ids 10, 11, … in order of first sight, wrapped in [CLS]=1 … [SEP]=2; pad id 0."""

    pad_token_id = 0

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def __call__(self, text, truncation=False, max_length=None, return_special_tokens_mask=False, **_):
        ids, special = [], []
        for line in text:
            words = [self.vocab.setdefault(w, 10 + len(self.vocab)) for w in line.split()]
            if truncation and max_length is not None:
                words = words[: max_length - 2]
            row = [1, *words, 2] if line.split() else []
            ids.append(row)
            special.append([1] + [0] * len(words) + [1] if row else [])
        out = {"input_ids": ids}
        if return_special_tokens_mask:
            out["special_tokens_mask"] = special
        return out


def test_collate_hand_computed():
    got = collate([{"input_ids": [5, 6, 7], "labels": [1, 2], "score": 0.5, "label": 3},
                   {"input_ids": [8], "labels": [4, 5, 6], "score": 1.0, "label": 0}], pad_id=9)
    assert got["input_ids"].tolist() == [[5, 6, 7], [8, 9, 9]]
    assert got["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert got["labels"].tolist() == [[1, 2, LABEL_PAD], [4, 5, 6]]
    assert got["score"].dtype == torch.float32 and got["score"].tolist() == [0.5, 1.0]
    assert got["label"].dtype == torch.long and got["label"].tolist() == [3, 0]
    with pytest.raises(HeadwiseError, match="zero examples"):
        collate([], pad_id=0)


def test_collate_pads_every_mask_with_zero():
    got = collate([{"input_ids_b": [3, 4], "special_tokens_mask": [1, 1]},
                   {"input_ids_b": [5], "special_tokens_mask": [1]}], pad_id=7)
    assert got["input_ids_b"].tolist() == [[3, 4], [5, 7]]
    assert got["attention_mask_b"].tolist() == [[1, 1], [1, 0]]
    assert got["special_tokens_mask"].tolist() == [[1, 1], [1, 0]]


def test_text_batches_hand_computed():
    tok = WordTokenizer()
    texts = ["a b", "", "c d e f", "g"]
    got = list(text_batches(tok, texts, batch_size=2, max_length=5, index=[10, 11, 12, 13]))
    first, second = got  # the empty text is skipped; longest first; "c d e f" cut to 3 words
    assert first.index == [12, 10] and second.index == [13]
    assert first.input_ids.tolist() == [[1, 12, 13, 14, 2], [1, 10, 11, 2, 0]]
    assert first.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert first.attention_mask.dtype == torch.long and first.real.dtype == torch.bool
    assert first.real.tolist() == [[True] * 5, [True] * 4 + [False]]
    assert first.special.tolist() == [[True, False, False, False, True], [True, False, False, True, False]]
    assert second.input_ids.tolist() == [[1, 16, 2]]
    unsorted = list(text_batches(tok, texts, batch_size=8, max_length=5, sort=False))
    assert unsorted[0].index == [0, 2, 3]
    assert list(text_batches(tok, [], 2, 5)) == []


def test_text_batches_match_the_tokenizers_own_padding():
    tokenizer = load_tokenizer()
    texts = ["A man is playing a guitar.", "Hi", "Two dogs run across a snowy field near the trees."]
    (batch,) = text_batches(tokenizer, texts, batch_size=3, max_length=64, sort=False)
    ref = tokenizer(texts, padding=True, truncation=True, max_length=64, return_special_tokens_mask=True,
                    return_tensors="pt")
    assert torch.equal(batch.input_ids, ref["input_ids"])
    assert torch.equal(batch.attention_mask, ref["attention_mask"])
    assert torch.equal(batch.special, ref["special_tokens_mask"].bool() & ref["attention_mask"].bool())


def test_batches_sorts_and_moves_to_device():
    examples = Examples([{"input_ids": [1]}, {"input_ids": [1, 2, 3]}, {"input_ids": [1, 2]}])
    sizes = [b["input_ids"].shape[1] for b in batches(examples, WordTokenizer(), 2, sort=True)]
    assert sizes == [3, 1]
    (meta,) = batches(examples, WordTokenizer(), 3, device="meta")
    assert meta["input_ids"].device.type == "meta" and meta["input_ids"].shape == (3, 3)


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-6), (torch.float16, 1e-3), (torch.bfloat16, 1e-2)])
def test_mean_pool_over_real_tokens(dtype, atol):
    hidden = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    ref = torch.stack([hidden[0, :2].mean(0), hidden[1].mean(0)])
    got = mean_pool(hidden.to(dtype), mask)
    assert got.dtype == dtype and torch.allclose(got.float(), ref, atol=atol)
    assert mean_pool(hidden.to("meta"), mask.to("meta")).shape == (2, 3)


def test_tokenize_counts_cuts_and_refuses_empty_text():
    tok = WordTokenizer()
    ids, cut = tokenize(tok, ["a b c d", "e"], max_length=4)
    assert cut == 1 and [len(x) for x in ids] == [4, 3]
    with pytest.raises(HeadwiseError, match="text 2 is empty"):
        tokenize(tok, ["a", "  "], max_length=4)


def test_check_context_refuses_a_length_beyond_the_model():
    model = torch.nn.Module()
    model.config = type("C", (), {"max_position_embeddings": 16})()
    assert check_context(model, None, 16) == 16
    with pytest.raises(HeadwiseError, match="--max-length 17 is longer than the model's context of 16"):
        check_context(model, None, 17)
