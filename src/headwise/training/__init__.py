"""Training, in one package above the tasks: the Trainer with head penalties and head learning rates (``trainer``:
``HeadwiseTrainer``; ``memory``: keep / bounded / auto; ``backward_step``: updates in the backward), a task's
training (``finetune``, ``train_objective``), recovery after an edit (``recover``, ``Recovery``), the pruning
recipes (``l0_prune``, ``importance_prune``), STS-B fine-tuning, the Seq2SeqTrainer for translation, a translation
model trained from scratch, and KV gates. The names load on first use (``headwise.lazy``)."""

from typing import TYPE_CHECKING

from ..lazy import attach as _lazy

if TYPE_CHECKING:
    from .trainer import HeadwiseTrainer, Penalty, PenaltyTraining, is_head_parameter
    from .finetune import finetune, train_objective
    from .recovery import CachedTeacher, DistillationObjective, Recovery, recover
    from .recipes import importance_prune, l0_prune
    from .stsb import finetune_stsb
    from .seq2seq import HeadwiseSeq2SeqTrainer, TranslationDataset, train_translation
    from .kv_gates import train_kv_gates
    from .token_batches import token_batches
    from .translation_model import TranslationRecipe, train_translation_model

__getattr__, __dir__ = _lazy(__name__, globals())
