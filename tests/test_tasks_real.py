"""Real weights, a few hundred tokens each: SmolLM2-135M perplexity on WikiText-2 and the Multi30k Marian's BLEU
on a handful of test sentences, each against an independent computation with plain transformers."""

import math

import pytest
import sacrebleu
import torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

import headwise
from headwise.models import resolve_model
from headwise.tasks import LanguageModeling, Translation
from shared_data import require_shared

pytestmark = pytest.mark.slow


def test_smollm2_perplexity_on_a_few_hundred_wikitext_tokens():
    require_shared("data/wikitext-2/valid.txt")
    task = LanguageModeling(max_length=300, max_tokens=300)  # the eval split: the last 10% of valid.txt
    model, tokenizer = headwise.load_model("smollm2-135m", task=task)
    got = task.evaluate(model, tokenizer, progress=False)

    path = resolve_model("smollm2-135m")
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    plain_tokenizer = AutoTokenizer.from_pretrained(path)
    text = "\n".join(task.texts("eval"))
    ids = torch.tensor([plain_tokenizer(text, add_special_tokens=False)["input_ids"][:300]])
    with torch.no_grad():
        reference = math.exp(plain(input_ids=ids, labels=ids).loss.item())
    assert got["tokens"] == 299 and 5 < got["perplexity"] < 100
    assert got["perplexity"] == pytest.approx(reference, rel=1e-3)  # SDPA vs eager over 30 layers


def test_multi30k_bleu_of_a_handful_of_sentences():
    require_shared("data/multi30k", "models/multi30k-marian-de-en")
    task = Translation(limit=8, beam=2)
    model, tokenizer = headwise.load_model("multi30k-marian-de-en", task=task)
    got = task.evaluate(model, tokenizer, progress=False)

    path = resolve_model("multi30k-marian-de-en")
    plain = AutoModelForSeq2SeqLM.from_pretrained(path, attn_implementation="eager").eval()
    plain_tokenizer = AutoTokenizer.from_pretrained(path)
    corpus = task.corpus("eval")
    enc = plain_tokenizer(corpus.source, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = plain.generate(**enc, num_beams=2, max_new_tokens=96, do_sample=False)
    hypotheses = plain_tokenizer.batch_decode(out, skip_special_tokens=True)
    reference = sacrebleu.corpus_bleu(hypotheses, [corpus.target]).score
    assert got["sentences"] == 8 and 10 < got["bleu"] <= 100
    assert got["bleu"] == pytest.approx(reference, abs=1e-9)
