"""Evaluation: STS-B Spearman for sentence encoders and embedding fidelity between models."""

from .data import StsbPairs, read_stsb, stsb_file
from .embeddings import encode, ensure_encoder, fidelity, mean_pool
from .stsb import StsbResult, evaluate_stsb, stsb_scores

__all__ = [
    "StsbPairs", "read_stsb", "stsb_file", "encode", "ensure_encoder", "fidelity", "mean_pool",
    "StsbResult", "evaluate_stsb", "stsb_scores",
]
