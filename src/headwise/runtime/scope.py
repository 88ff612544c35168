"""Context managers that put a model in the state a method's measurement needs, and restore it afterwards."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn

from .attention import NAME, enable


@contextmanager
def using_headwise(model: nn.Module) -> Iterator[None]:
    """Select the ``headwise`` attention implementation for the block (the previous one is restored after)."""
    previous = model.config._attn_implementation
    if previous == NAME:
        yield
        return
    enable(model)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """``model.eval()`` for the block; the previous training flag is restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
