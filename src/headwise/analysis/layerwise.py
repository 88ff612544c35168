"""The gradient pass one decoder layer at a time, for contexts whose activations do not fit even with every block
recomputed (``activations.recompute_plan`` picks it for causal decoders whose layers run by chunks of queries).

The forward runs without gradients: each layer writes its input hidden states ``[B, T, D]`` to a temporary file
(``io.spill.TensorFile``) and runs over chunks of query positions (``layer_stack.chunked_layers``' way, so the
statistics observers see the same calls as ``analyze``'s statistics pass). Only the last layer's output is a leaf
with gradients: the loss's backward stops there. Then, from the last layer to the first, the layer's input is read
back and the gradient of its output ``dY`` carried to its input:

1. the layer's keys and values ``[B, Hkv, T, d]`` for every position, without gradients, chunk by chunk;
2. each chunk of queries ``c0:c1`` again with gradients, its cache returning those keys and values up to ``c1``
   as leaves: one backward of ``dY[c0:c1]`` gives the chunk's rows of the input's gradient (the residual, norm and
   query paths), the gates' gradient, and adds into the keys' and values' gradients;
3. each chunk's keys and values again with gradients, their gradients carried back to the chunk's input rows.

At once this holds the gradient ``[B, T, D]`` (the input's written over the output's), the keys and values and
their gradients, and one chunk's rows and activations, at any depth: the layers' inputs wait on disk and are read
back a chunk of rows at a time. One forward more than keeping every activation, as with every block recomputed
(``importance.checkpointed``), and the same sums in another order.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ..compat import CACHE
from ..errors import HeadwiseError
from ..io.spill import TensorFile
from .layer_stack import block_stack, chunk_cuts, chunked_forward, layer_chunks_fit, replaced_forwards
from .rows import Row


def layerwise_fits(model: nn.Module, rows: list[Row]) -> bool:
    """Whether the model's layers form one stack of causal decoder layers that run by chunks of queries
    (``layer_stack.layer_chunks_fit``): the layer-by-layer backward needs exactly that."""
    found = block_stack(model, rows)
    return found is not None and layer_chunks_fit(found[0], rows, found[1])


class _Stop(Exception):
    """Raised by ``_Capture`` once it has the chunk's keys and values: the rest of the layer is not needed."""


class _Capture:
    """A cache that records the keys and values a layer's attention computes for a chunk ``[B, Hkv, n, d]``, then
    stops the layer's forward."""

    def __init__(self) -> None:
        self.key: torch.Tensor | None = None
        self.value: torch.Tensor | None = None

    def update(self, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self.key, self.value = key, value
        raise _Stop


class _Given:
    """A cache that answers a chunk of queries with the layer's keys and values up to the chunk's end, held as
    leaves (the chunk's own, computed again, are equal and unused)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values

    def update(self, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys, self.values


class LayerwiseBackward:
    """The layers' calls of one forward (their inputs on disk, their other arguments) and the backward over them."""

    def __init__(self, stack: nn.ModuleList, tokens: int) -> None:
        self.stack, self.tokens = stack, tokens
        self.forwards = [block.forward for block in stack]
        self.inputs = TensorFile("the layers' hidden states (the gradient pass)")
        self.calls: list[tuple[int, dict[str, Any]]] = []  # (index in the file, keyword arguments) per layer
        self.output: torch.Tensor | None = None

    def forward_of(self, index: int) -> Callable:
        chunked = chunked_forward(self.forwards[index], self.tokens)

        def run(*args: Any, **kwargs: Any) -> Any:
            hidden = args[0] if args else kwargs.get("hidden_states")
            rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
            if len(args) > 1 or not isinstance(hidden, torch.Tensor) or hidden.dim() != 3:
                raise HeadwiseError(f"{type(self.stack[index]).__name__} got arguments the layer-by-layer gradient "
                                    "pass cannot replay; run with recompute=False or a shorter max_length")
            if len(self.calls) != index:
                raise HeadwiseError("the loss ran the model's layers more than once per batch: the layer-by-layer "
                                    "gradient pass takes one forward per batch; run with recompute=False or a "
                                    "shorter max_length")
            self.calls.append((self.inputs.put(hidden), rest))
            with torch.no_grad():
                out = chunked(hidden, **rest)
            out = out[0] if isinstance(out, tuple) else out
            if index == len(self.stack) - 1:
                self.output = out.detach().requires_grad_()
                return self.output
            return out
        return run

    def _chunks(self, length: int) -> list[tuple[int, int]]:
        return [(c0, min(length, c0 + self.tokens)) for c0 in range(0, length, self.tokens)]

    def _keys_values(self, index: int, hidden: torch.Tensor, cut: Callable[[int, int], dict[str, Any]],
                     c0: int, c1: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values ``[B, Hkv, c1 − c0, d]`` layer ``index`` computes for rows ``c0:c1`` of
        ``hidden`` (with gradients when they are on)."""
        capture = _Capture()
        try:
            self.forwards[index](hidden, **{**cut(c0, c1), CACHE: capture})
        except _Stop:
            pass
        if capture.key is None or capture.value is None:
            raise HeadwiseError(f"{type(self.stack[index]).__name__} ran without storing keys in its cache: the "
                                "layer-by-layer gradient pass cannot run it; use recompute=False")
        return capture.key, capture.value

    def _layer(self, index: int, gates: torch.Tensor, grad_output: torch.Tensor, gate_grad: torch.Tensor
               ) -> torch.Tensor:
        """The gradient of layer ``index``'s input from that of its output (``[B, T, D]`` each, the first written
        over the second); adds the layer's part of the gates' gradient into ``gate_grad``. The layer's input is
        read from disk one chunk of rows at a time."""
        slot, rest = self.calls[index]
        T = grad_output.shape[1]
        cuts = chunk_cuts(T, grad_output.device, rest)
        if cuts is None:
            raise HeadwiseError(f"{type(self.stack[index]).__name__} got arguments that cannot be cut by query "
                                "rows; run with recompute=False or a shorter max_length")

        def cut(c0: int, c1: int) -> dict[str, Any]:
            return {**rest, **{k: f(c0, c1) for k, f in cuts.items()}}

        def read_rows(c0: int, c1: int) -> torch.Tensor:
            return self.inputs.get(slot, c0, c1).requires_grad_(torch.is_grad_enabled())

        chunks = self._chunks(T)
        keys = values = None
        with torch.no_grad():
            for c0, c1 in chunks:
                key, value = self._keys_values(index, read_rows(c0, c1), cut, c0, c1)
                if keys is None or values is None:
                    keys = key.new_empty(*key.shape[:-2], T, key.shape[-1])
                    values = value.new_empty(*value.shape[:-2], T, value.shape[-1])
                keys[..., c0:c1, :], values[..., c0:c1, :] = key, value
                del key, value
        grad_keys, grad_values = torch.zeros_like(keys), torch.zeros_like(values)
        grad_input = grad_output  # chunk c's input rows overwrite its output rows, read only by chunk c
        for c0, c1 in chunks:
            seen_keys = keys[..., :c1, :].detach().requires_grad_()
            seen_values = values[..., :c1, :].detach().requires_grad_()
            with torch.enable_grad():
                chunk = read_rows(c0, c1)
                out = self.forwards[index](chunk, **{**cut(c0, c1), CACHE: _Given(seen_keys, seen_values)})
                out = out[0] if isinstance(out, tuple) else out
                g_rows, g_keys, g_values, g_gates = torch.autograd.grad(
                    out, (chunk, seen_keys, seen_values, gates), grad_output[:, c0:c1], allow_unused=True)
            grad_input[:, c0:c1] = g_rows
            if g_keys is not None:
                grad_keys[..., :c1, :] += g_keys
            if g_values is not None:
                grad_values[..., :c1, :] += g_values
            if g_gates is not None:
                gate_grad += g_gates
            del out, chunk, g_rows, g_keys, g_values, g_gates
        del keys, values
        for c0, c1 in chunks:
            with torch.enable_grad():
                chunk = read_rows(c0, c1)
                key, value = self._keys_values(index, chunk, cut, c0, c1)
                (g_rows,) = torch.autograd.grad((key, value), chunk, (grad_keys[..., c0:c1, :],
                                                                      grad_values[..., c0:c1, :]))
            grad_input[:, c0:c1] += g_rows
        return grad_input

    def backward(self, loss: list[torch.Tensor], gates: torch.Tensor) -> torch.Tensor:
        """The gradient of the loss (a scalar of this forward, passed as ``[loss]``: the list is emptied once the
        gradient at the last layer's output is known, so the loss's graph goes before the layers' backwards) with
        respect to ``gates`` (the gate leaf the layers' heads are scaled by). The stored inputs are dropped after."""
        try:
            if self.output is None or len(self.calls) != len(self.stack):
                raise HeadwiseError("the loss did not run every layer of the model once: the layer-by-layer "
                                    "gradient pass cannot carry its gradient back; use recompute=False")
            (grad,) = torch.autograd.grad(loss.pop(), self.output)
            self.output = None
            gate_grad = torch.zeros_like(gates)
            for index in reversed(range(len(self.stack))):
                grad = self._layer(index, gates, grad, gate_grad)
            return gate_grad
        finally:
            self.inputs.close()
            self.calls, self.output = [], None


@contextmanager
def layerwise(model: nn.Module, rows: list[Row], tokens: int) -> Iterator[LayerwiseBackward]:
    """For the block, the model's layers record each forward's calls for ``LayerwiseBackward.backward`` and run
    without gradients by chunks of ``tokens`` queries (see the module docstring)."""
    found = block_stack(model, rows)
    if found is None or not layer_chunks_fit(found[0], rows, found[1]):
        raise HeadwiseError(f"{type(model).__name__}'s layers are not one stack of causal decoder layers: the "
                            "layer-by-layer gradient pass cannot run it; recompute it by blocks (Recompute(segment=...))")
    stack = found[0]
    pass_ = LayerwiseBackward(stack, tokens)
    config = getattr(model, "config", None)
    use_cache = getattr(config, "use_cache", None)
    if use_cache:
        config.use_cache = False
    try:
        with replaced_forwards(stack, [pass_.forward_of(i) for i in range(len(stack))]):
            yield pass_
    finally:
        pass_.inputs.close()
        if use_cache:
            config.use_cache = use_cache
