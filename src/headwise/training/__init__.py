"""Training with head penalties through the HF Trainer and Seq2SeqTrainer (one recipe for pruning, compression and
mixing; translation for encoder-decoder models), a translation model trained from scratch, and KV gates."""

from .stsb import finetune_stsb
from .seq2seq import HeadwiseSeq2SeqTrainer, TranslationDataset, train_translation
from .kv_gates import train_kv_gates
from .token_batches import token_batches
from ..trainer import HeadwiseTrainer, Penalty, PenaltyTraining, is_head_parameter
from .translation_model import TranslationRecipe, train_translation_model

__all__ = ["HeadwiseTrainer", "HeadwiseSeq2SeqTrainer", "Penalty", "PenaltyTraining", "is_head_parameter",
           "finetune_stsb", "TranslationDataset",
           "train_translation", "TranslationRecipe", "train_translation_model", "token_batches", "train_kv_gates"]
