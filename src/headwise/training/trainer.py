"""``PenaltyTraining``, the mixin behind ``HeadwiseTrainer`` (and ``HeadwiseSeq2SeqTrainer``): adds head penalties
to the loss, gives head parameters their own learning rate, logs head statistics, and scales the loss right under
gradient accumulation.

Checkpoints of a wrapper module (a task objective holding the model) store tied weights as separate copies: the
Trainer saves such a module with plain ``safetensors.save_file``, which refuses shared storage, and resumes with
``load_state_dict``, which then finds every key.

Gradient accumulation: transformers decides from the model's ``forward`` signature whether the loss is already
normalised by the number of items in the batch, and models whose forward takes ``**kwargs`` are assumed to do
it themselves (transformers issue #47688), so their loss is not divided by the accumulation steps. Our losses
are batch means plus penalties, so this trainer always says so (``loss_is_scaled_for_ga = False``): each
micro-batch's loss is divided by the number of micro-batches, and the penalty counts once per update.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol, Sequence

import torch
from torch import nn
from transformers import PreTrainedModel, Trainer, TrainerCallback
from transformers.trainer_callback import ProgressCallback

from ..progress import progress_bar
from ..runtime.ops import ATTR
from . import backward_step


class Penalty(Protocol):
    """A term added to the training loss: ``penalty(model) -> scalar``; ``metrics()`` are logged; ``step()``
    runs after every optimizer update (e.g. to adapt a coefficient)."""

    def __call__(self, model: nn.Module) -> torch.Tensor: ...

    def metrics(self) -> dict[str, float]: ...

    def step(self) -> None: ...


def is_head_parameter(name: str) -> bool:
    """Parameters of ops attached to attention sites (gates, mixers) live under ``<attention>.headwise.``."""
    return f".{ATTR}." in f".{name}"


def unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with every tensor whose storage an earlier one uses (tied weights) replaced by a copy."""
    seen: set[int] = set()
    out = {}
    for name, tensor in state.items():
        storage = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if storage in seen else tensor
        seen.add(storage)
    return out


class _PenaltySteps(TrainerCallback):
    def __init__(self, penalties: Sequence[Penalty]) -> None:
        self.penalties = penalties

    def on_step_end(self, args, state, control, **kwargs):
        for penalty in self.penalties:
            penalty.step()


class LogProgress(TrainerCallback):
    """Training progress in a log (stderr not a terminal), in place of the Trainer's redrawn bar: periodic
    ``headwise: training: n/N step ... left`` lines (``headwise.progress``) and the Trainer's logs, one a line."""

    def on_train_begin(self, args, state, control, **kwargs):
        self.bar = progress_bar(total=state.max_steps, initial=state.global_step, desc="training", unit="step")

    def on_step_end(self, args, state, control, **kwargs):
        self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            print({k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in logs.items() if k != "total_flos"},
                  flush=True)

    def on_train_end(self, args, state, control, **kwargs):
        self.bar.close()


class PenaltyTraining:
    """Mixin for ``transformers.Trainer`` subclasses: ``penalties=[...]``, ``head_learning_rate=`` and
    ``step_in_backward=`` keyword arguments, penalties added to the loss (once per update under gradient
    accumulation, see the module docstring), their ``step()`` after every update and their ``metrics()`` in the
    logs; ``step_in_backward``: each parameter updated in the backward (``backward_step``: no gradients
    held together). Put it first in the bases."""

    loss_is_scaled_for_ga = False

    def __init__(self, *args: Any, penalties: Sequence[Penalty] = (), head_learning_rate: float | None = None,
                 step_in_backward: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.penalties = list(penalties)
        self.head_learning_rate = head_learning_rate
        self.step_in_backward, self._backward_step = step_in_backward, None
        if step_in_backward:
            backward_step.check_backward_step(self.args.gradient_accumulation_steps, self.args.max_grad_norm,
                                              self.args.world_size)
        if self.penalties:
            self.add_callback(_PenaltySteps(self.penalties))
        if not self.args.disable_tqdm and not sys.stderr.isatty():  # a log: lines, not carriage-return redraws
            self.remove_callback(ProgressCallback)
            self.add_callback(LogProgress())

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.label_smoother is not None and "labels" in inputs:
            inputs = dict(inputs)
            labels = inputs.pop("labels")
            outputs = model(**inputs)
            loss = self.label_smoother(outputs, labels)
        else:
            outputs = model(**inputs)
            loss = outputs["loss"]
        for penalty in self.penalties:
            loss = loss + penalty(self.model)
        return (loss, outputs) if return_outputs else loss

    def create_optimizer(self, model=None):
        if self.optimizer is None and self.head_learning_rate is not None:
            opt_model = self.model if model is None else model
            decay = set(self.get_decay_parameter_names(opt_model))
            groups: dict[str, dict] = {
                "head": {"params": [], "weight_decay": 0.0, "lr": self.head_learning_rate},
                "decay": {"params": [], "weight_decay": self.args.weight_decay},
                "no_decay": {"params": [], "weight_decay": 0.0},
            }
            for name, p in opt_model.named_parameters():
                if p.requires_grad:
                    key = "head" if is_head_parameter(name) else "decay" if name in decay else "no_decay"
                    groups[key]["params"].append(p)
            optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
            self.optimizer = optimizer_cls([g for g in groups.values() if g["params"]], **optimizer_kwargs)
        optimizer = super().create_optimizer(model)
        if self.step_in_backward and self._backward_step is None:
            self._backward_step = backward_step.step_in_backward(optimizer)
        return optimizer

    def train(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().train(*args, **kwargs)
        finally:  # the parameters carry no update hooks after training
            if self._backward_step is not None:
                self._backward_step.remove()
                self._backward_step = None

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        if state_dict is None and not isinstance(self.accelerator.unwrap_model(self.model), PreTrainedModel):
            state_dict = unshared(self.model.state_dict())
        super()._save(output_dir, state_dict)

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        for penalty in self.penalties:
            logs.update(penalty.metrics())
        super().log(logs, *args, **kwargs)


class HeadwiseTrainer(PenaltyTraining, Trainer):
    """``HeadwiseTrainer(model, args, ..., penalties=[...], head_learning_rate=1e-2)``.

    The model's forward must return a mapping (or ModelOutput) with a ``loss`` that is a mean over the batch
    (or, with ``label_smoothing_factor``, logits the Trainer's label smoother reads).
    """
