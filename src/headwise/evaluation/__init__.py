"""Evaluation: STS-B Spearman for sentence encoders, embedding fidelity between models, BLEU for translation."""

from .bleu import BleuMetric, BleuResult, corpus_bleu, evaluate_bleu, translate
from .data import StsbPairs, read_stsb, stsb_file
from .embeddings import encode, ensure_encoder, fidelity, mean_pool
from .stsb import StsbResult, evaluate_stsb, stsb_metric, stsb_scores
from .translation import (ParallelCorpus, SyntheticGrammar, build_synthetic_corpus, read_corpus, train_tokenizer,
                          write_corpus)

__all__ = [
    "StsbPairs", "read_stsb", "stsb_file", "encode", "ensure_encoder", "fidelity", "mean_pool",
    "StsbResult", "evaluate_stsb", "stsb_metric", "stsb_scores", "corpus_bleu", "BleuMetric", "BleuResult", "translate",
    "evaluate_bleu", "ParallelCorpus", "SyntheticGrammar", "build_synthetic_corpus", "read_corpus", "write_corpus",
    "train_tokenizer",
]
