"""The optimizer's update inside the backward: each parameter is updated as soon as its gradient is complete and
the gradient is freed right after, so the gradients of all trained parameters never exist together.

Peak memory of a training step: weights + optimizer state + activations + the largest single gradient, instead of
+ every gradient (1x the trained weights: 4x → 3x the weights for AdamW on every weight). The update of each
parameter is the optimizer's own ``step`` run over that parameter alone, with its group's current settings (a
learning-rate schedule applies as usual). What cannot hold when gradients never coexist: gradient accumulation over
micro-batches and clipping by the global gradient norm; ``check_backward_step`` refuses both.

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    handle = step_in_backward(optimizer)
    loss.backward()        # every parameter updated, no .grad left
    optimizer.step()       # a no-op now (the Trainer may still call it)
    handle.remove()        # back to a plain optimizer
"""

from __future__ import annotations

import types
from typing import Any

import torch

from ..errors import HeadwiseError


class BackwardStep:
    """The hooks ``step_in_backward`` put on the parameters; ``remove()`` takes them off and restores ``step``."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        # group indices, not the groups: loading a state dict (Accelerate's prepare does) puts new group dicts in place
        self.group_of = {p: i for i, group in enumerate(optimizer.param_groups) for p in group["params"]}
        self.handles = [p.register_post_accumulate_grad_hook(self._update) for p in self.group_of]
        self.had_step = "step" in optimizer.__dict__
        self.step = optimizer.__dict__.get("step")
        optimizer.step = types.MethodType(_done_in_backward, optimizer)  # bound, as LR schedulers expect

    def _update(self, param: torch.Tensor) -> None:
        """One parameter's update: the optimizer's step over a group holding only ``param`` (the same settings)."""
        optimizer, groups = self.optimizer, self.optimizer.param_groups
        if param.grad.is_sparse:  # a sparse lookup's gradient with no dense part added (memory.bounded)
            param.grad = param.grad.to_dense()
        optimizer.param_groups = [{**groups[self.group_of[param]], "params": [param]}]
        try:
            type(optimizer).step(optimizer)
        finally:
            optimizer.param_groups = groups
        param.grad = None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        if self.had_step:
            self.optimizer.step = self.step
        else:
            del self.optimizer.__dict__["step"]


def _done_in_backward(self: torch.optim.Optimizer, closure: Any = None) -> None:
    """``optimizer.step()`` after ``step_in_backward``: every update already ran in the backward."""
    return None


def step_in_backward(optimizer: torch.optim.Optimizer) -> BackwardStep:
    """Run ``optimizer``'s update of each parameter in the backward, as its gradient is complete (see the module
    docstring); returns the handle whose ``remove()`` undoes it."""
    return BackwardStep(optimizer)


def check_backward_step(accumulation_steps: int, max_grad_norm: float, world_size: int) -> None:
    """Raise ``HeadwiseError`` for a setting that needs every gradient at once (see the module docstring)."""
    if accumulation_steps > 1:
        raise HeadwiseError(f"gradient accumulation ({accumulation_steps} steps) needs every gradient kept until the "
                            "update; with memory='bounded' each gradient is spent at once: use a larger batch_size "
                            "or memory='keep'")
    if max_grad_norm and max_grad_norm > 0:
        raise HeadwiseError(f"clipping by the global gradient norm (max_grad_norm={max_grad_norm:g}) needs every "
                            "gradient at once; with memory='bounded' pass max_grad_norm=0 or use memory='keep'")
    if world_size > 1:
        raise HeadwiseError(f"memory='bounded' updates each parameter in the backward, before its gradient is "
                            f"averaged over the {world_size} processes: train with memory='keep' under torchrun")
