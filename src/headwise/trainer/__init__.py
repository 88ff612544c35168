"""The Trainer with head penalties (``HeadwiseTrainer``), which tasks and recipes train through: head penalties and
head learning rates (``trainer``), how much memory a run may take (``memory``: keep / bounded / auto) and updates
in the backward (``backward_step``)."""

from .trainer import HeadwiseTrainer, Penalty, PenaltyTraining, is_head_parameter

__all__ = ["HeadwiseTrainer", "Penalty", "PenaltyTraining", "is_head_parameter"]
