"""Weights whose gradient a loss adds into ``.grad`` itself instead of handing it to autograd: a causal LM's output
head tied to a sparse token lookup, under bounded training memory (``training.memory.bounded`` marks the weight;
``tasks.lm``'s chunked head loss reads the mark)."""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Iterator

import torch

_MARKED: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()  # by id: tensors


def head_gradient_into_grad(weight: torch.Tensor) -> bool:
    """Whether an output head's loss should add its weight gradient into ``weight.grad`` itself rather than hand it
    to autograd (a tied embedding's lookup then adds its sparse rows to it in place)."""
    return _MARKED.get(id(weight)) is weight


@contextmanager
def gradient_into_grad(weight: torch.Tensor) -> Iterator[None]:
    """``head_gradient_into_grad(weight)`` holds for the block."""
    _MARKED[id(weight)] = weight
    try:
        yield
    finally:
        _MARKED.pop(id(weight), None)
