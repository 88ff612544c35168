"""Training with head penalties through the HF Trainer (one recipe for pruning, compression and mixing)."""

from .stsb import CosineRegression, PairCollator, PairDataset, finetune_stsb
from .trainer import HeadwiseTrainer, Penalty, is_head_parameter

__all__ = ["HeadwiseTrainer", "Penalty", "is_head_parameter", "finetune_stsb", "CosineRegression", "PairCollator",
           "PairDataset"]
