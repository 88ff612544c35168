"""Learned KV gates (DuoAttention-style) trained through the shared Trainer, so the run is data-parallel under
``torchrun`` / Accelerate like every other training here.

The model is frozen and in eval mode, every KV head's gate ``α`` mixes full and ``streaming(sink, window)``
attention, the loss is the MSE of the gated last hidden states against the ungated ones on the prompt's region
(``tasks.embedding_distillation``) plus ``l1 · mean(α)``, and ``α`` is clipped to ``[0, 1]`` after every update. One prompt per device per step; with ``N`` processes each
update sees ``N`` prompts (DDP averages their gradients) and every rank ends with the same ``α``.

    torchrun --nproc_per_node 2 my_script.py    # my_script calls train_kv_gates(model, tokenizer, config)
"""

from __future__ import annotations

import itertools
import tempfile
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import TrainingArguments

from ..errors import HeadwiseError
from ..kvcache import KVGateConfig, LearnedGates, add_kv_gates, remove_kv_gates
from ..kvcache.policy import model_shape
from ..kvcache.learn import bypassed, frozen, gate_prompts, last_hidden
from ..tasks.distillation import embedding_distillation
from .trainer import HeadwiseTrainer


class GatePrompts(Dataset):
    """The first ``count`` prompts of ``gate_prompts`` (seeded, the same on every rank): ``input_ids [T]`` and the
    loss region ``[start, stop)``."""

    def __init__(self, tokenizer: Any, config: KVGateConfig, count: int, texts: list[str] | None = None) -> None:
        self.items = [{"input_ids": ids, "region": torch.tensor([r.start, r.stop])}
                      for ids, r in itertools.islice(gate_prompts(tokenizer, config, texts), count)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


def one_prompt(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Collate a batch of one prompt (prompts differ in length; the objective takes one at a time)."""
    if len(batch) != 1:
        raise ValueError(f"KV gate training takes one prompt per device and step, got {len(batch)}")
    return {"input_ids": batch[0]["input_ids"][None], "region": batch[0]["region"]}


class GateDistillation(nn.Module):
    """The training objective around the frozen ``model`` and its ``gates``: ``forward`` returns ``{"loss"}``, the
    distillation MSE on the prompt's region. The model stays in eval mode whatever the Trainer sets."""

    def __init__(self, model: nn.Module, gates: list[nn.Module]) -> None:
        super().__init__()
        self.model = model
        self.gates = gates  # submodules of the model already: a plain list, not registered twice

    def train(self, mode: bool = True) -> "GateDistillation":
        super().train(mode)
        self.model.eval()
        return self

    def forward(self, input_ids: torch.Tensor, region: torch.Tensor) -> dict[str, torch.Tensor]:
        region = slice(*region.tolist())
        with torch.no_grad(), bypassed(self.gates):
            target = last_hidden(self.model, input_ids)[:, region]
        return {"loss": embedding_distillation(last_hidden(self.model, input_ids)[:, region], target).mean()}


class GateL1:
    """The ``l1 · mean(α)`` term as a Trainer penalty; after every update ``α`` is clipped to ``[0, 1]``."""

    def __init__(self, gates: list[nn.Module], l1: float) -> None:
        self.gates, self.l1 = gates, l1

    def alpha(self) -> torch.Tensor:
        return torch.cat([g.alpha for g in self.gates])

    def __call__(self, model: nn.Module) -> torch.Tensor:
        return self.l1 * self.alpha().float().mean()

    def step(self) -> None:
        with torch.no_grad():
            for g in self.gates:
                g.alpha.clamp_(0.0, 1.0)

    def metrics(self) -> dict[str, float]:
        return {"mean_alpha": self.alpha().detach().float().mean().item()}


# TrainingArguments the config sets (TrainingArguments name → KVGateConfig field): not overridable by keyword
CONFIG_ARGS = {"max_steps": "steps", "learning_rate": "lr", "seed": "seed"}


def train_kv_gates(model: nn.Module, tokenizer: Any, config: KVGateConfig | None = None,
                   texts: list[str] | None = None, progress: bool = True, **training_args: Any) -> LearnedGates:
    """Train one gate per KV head of a decoder-only ``model`` with ``HeadwiseTrainer`` (``config.steps`` updates
    at ``config.lr``, Adam without weight decay, constant rate, no clipping; ``training_args``: other
    ``TrainingArguments``, one the config sets raises) and return ``α [layers, KV heads]``. The gates come off
    afterwards; the model is left as it was. Under ``torchrun`` every rank returns the same ``α``."""
    config = config or KVGateConfig()
    config.check()
    owned = [f"{arg}= (KVGateConfig.{field})" for arg, field in CONFIG_ARGS.items() if arg in training_args]
    if owned:
        raise HeadwiseError(f"train_kv_gates: {', '.join(owned)} is set by the config; give it there, not as a "
                            "training argument")
    model_shape(model)
    with frozen(model), tempfile.TemporaryDirectory(prefix="headwise-kv-gates-") as tmp:
        gates = add_kv_gates(model, config.sink, config.window, config.init)
        try:
            args = TrainingArguments(**{
                "output_dir": tmp, "max_steps": config.steps, "per_device_train_batch_size": 1,
                "learning_rate": config.lr, "weight_decay": 0.0, "lr_scheduler_type": "constant",
                "max_grad_norm": 0.0, "logging_steps": 1, "save_strategy": "no", "report_to": [],
                "remove_unused_columns": False, "disable_tqdm": not progress, "seed": config.seed,
                "dataloader_pin_memory": torch.cuda.is_available(),
                **training_args})
            penalty = GateL1(gates, config.l1)
            data = GatePrompts(tokenizer, config, config.steps * args.world_size, texts)
            trainer = HeadwiseTrainer(model=GateDistillation(model, gates), args=args, train_dataset=data,
                                      data_collator=one_prompt, penalties=[penalty])
            trainer.train()
            history = [{"step": row["step"], "loss": row["loss"], "mean_alpha": row["mean_alpha"]}
                       for row in trainer.state.log_history if "loss" in row and "mean_alpha" in row]
            alpha = torch.stack([g.alpha.detach().float().cpu() for g in gates])
        finally:
            remove_kv_gates(model)
    return LearnedGates(alpha, config, history)
