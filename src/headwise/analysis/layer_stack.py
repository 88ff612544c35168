"""The model's stack of layers: finding it, giving its blocks other forwards for a while, and running them over
chunks of positions.

``block_stack`` finds the ``ModuleList`` whose blocks hold the rows' sites, one each. ``chunked_mlps`` runs each
block's position-wise MLP over chunks of positions (checkpointed when gradients are on). ``chunked_layers`` runs
each causal decoder layer of a forward without gradients over chunks of query positions, layer after layer: chunk
``c0:c1`` attends to the layer's keys ``:c1`` (held in ``LayerKeys``, the layer's only cache), so the layer's
attention, its observers' probabilities and its MLP only ever see one chunk of queries, and its output rows
overwrite its input rows in place. What a layer holds at long context is then the hidden states once, its keys and
values, and one chunk's temporaries, instead of several ``[B, T, D]`` and ``[B, H, T, d]`` tensors.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..compat import CACHE
from .rows import Row


def block_stack(model: nn.Module, rows: list[Row]) -> tuple[nn.ModuleList, list[int]] | None:
    """``(the layer stack, block index of each row)`` when every row's site sits in its own element of one
    ``ModuleList`` of ``model`` (a stack of blocks run in order); ``None`` otherwise (shared modules, several
    stacks)."""
    if any(r.site.shared for r in rows):
        return None
    for stack in model.modules():
        if not isinstance(stack, nn.ModuleList):
            continue
        where = {id(sub): i for i, block in enumerate(stack) for sub in block.modules()}
        blocks = [where.get(id(r.site.module)) for r in rows]
        if all(b is not None for b in blocks) and len(set(blocks)) == len(rows):
            return stack, blocks
    return None


@contextmanager
def replaced_forwards(modules: Sequence[nn.Module], forwards: Sequence[Callable]) -> Iterator[None]:
    """Each of ``modules`` runs ``forwards[i]`` for the block (set on the instance), and afterwards what it ran
    before: its class's forward, or the instance's own (a wrapper such as Accelerate's hooks), also on error."""
    saved = [module.__dict__.get("forward") for module in modules]
    for module, forward in zip(modules, forwards):
        module.forward = forward
    try:
        yield
    finally:
        for module, forward in zip(modules, saved):
            if forward is None:
                del module.__dict__["forward"]
            else:
                module.forward = forward


def _chunked_mlp(mlp: nn.Module, tokens: int) -> Callable:
    """``mlp``'s forward over chunks of ``tokens`` positions (it is position-wise), each chunk under ``checkpoint``
    when gradients are on: its activations are those of one chunk, recomputed in the backward."""
    def inner(part: torch.Tensor, forward: Callable = mlp.forward) -> torch.Tensor:
        return forward(part.contiguous())  # a view's copy, made inside: the checkpoint keeps only the view

    def run(x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2] <= tokens:
            return inner(x)
        parts = [x[..., t0 : t0 + tokens, :] for t0 in range(0, x.shape[-2], tokens)]
        if torch.is_grad_enabled():
            return torch.cat([checkpoint(inner, part, use_reentrant=False) for part in parts], dim=-2)
        return torch.cat([inner(part) for part in parts], dim=-2)
    return run


def mlps_of(stack: nn.ModuleList) -> list[nn.Module]:
    """The position-wise MLP of each block of ``stack`` that has one (a child ``mlp`` whose class is an ``...MLP``:
    Llama, Qwen2, Mistral, GPT-2, ...; not a mixture of experts)."""
    return [block.mlp for block in stack
            if isinstance(getattr(block, "mlp", None), nn.Module) and type(block.mlp).__name__.endswith("MLP")]


@contextmanager
def chunked_mlps(model: nn.Module, rows: list[Row], tokens: int | None) -> Iterator[None]:
    """Each position-wise MLP of the model's layer stack (``mlps_of``) over chunks of ``tokens`` positions for the
    block (checkpointed when gradients are on): the same outputs, with one chunk's activations alive at a time.
    ``tokens=None``, or a model without one stack: unchanged."""
    found = block_stack(model, rows) if tokens else None
    mlps = mlps_of(found[0]) if found is not None else []
    with replaced_forwards(mlps, [_chunked_mlp(mlp, tokens) for mlp in mlps]):
        yield


class LayerKeys:
    """One layer's keys and values ``[B, Hkv, T, d]`` over one forward, filled chunk by chunk as its attention
    computes them: ``update(key, value, ...)`` (the ``Cache.update`` call of transformers' attention modules)
    stores the chunk's ``[B, Hkv, n, d]`` after the rows so far and returns every key and value up to them."""

    def __init__(self, length: int) -> None:
        self.length, self.seen = length, 0
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def update(self, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is None or self.values is None:
            self.keys = key.new_empty(*key.shape[:2], self.length, key.shape[-1])
            self.values = value.new_empty(*value.shape[:2], self.length, value.shape[-1])
        end = self.seen + key.shape[-2]
        self.keys[:, :, self.seen : end] = key
        self.values[:, :, self.seen : end] = value
        self.seen = end
        return self.keys[:, :, :end], self.values[:, :, :end]


def _chunk_mask(mask: Any, length: int, c0: int, c1: int, device: torch.device) -> torch.Tensor | None:
    """The layer's mask for query rows ``c0:c1`` against keys ``:c1``: the model's ``[B|1, 1|H, T|1, T]`` mask cut
    to them, or (no mask: a plain causal layer) the causal ``[1, 1, c1 − c0, c1]`` boolean one; None when the mask
    has another form (the layer then runs whole)."""
    if mask is None:
        return (torch.arange(c0, c1, device=device)[:, None] >= torch.arange(c1, device=device))[None, None]
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4 or mask.shape[-1] != length:
        return None
    if mask.shape[-2] == 1:
        return mask[..., :c1]
    return mask[..., c0:c1, :c1] if mask.shape[-2] == length else None


def chunk_cuts(T: int, device: torch.device, kwargs: dict[str, Any]) -> dict[str, Callable[[int, int], Any]] | None:
    """How to cut a decoder layer's keyword arguments (all but the hidden states ``[B, T, D]`` on ``device``) to
    query rows ``c0:c1`` against keys ``:c1``: ``{name: cut(c0, c1)}`` for the mask (the causal one when there is
    none), the rotary ``position_embeddings``, ``position_ids`` and ``cache_position``; the others pass as they are.
    None when an argument cannot be cut (a mask of another form, another tensor along the positions)."""
    cut: dict[str, Callable[[int, int], Any]] = {
        "attention_mask": lambda c0, c1: _chunk_mask(None, T, c0, c1, device)}
    for name, value in kwargs.items():
        if name == "attention_mask" and value is not None:
            if _chunk_mask(value, T, 0, 1, device) is None:
                return None
            cut[name] = lambda c0, c1, mask=value: _chunk_mask(mask, T, c0, c1, device)
        elif name == "position_embeddings" and isinstance(value, tuple):
            cut[name] = lambda c0, c1, pair=value: tuple(t[..., c0:c1, :] for t in pair)
        elif name in ("position_ids", "cache_position") and isinstance(value, torch.Tensor):
            cut[name] = lambda c0, c1, ids=value: ids[..., c0:c1]
        elif isinstance(value, torch.Tensor) and T in value.shape:  # something else along the positions
            return None
    return cut


def chunked_forward(forward: Callable, tokens: int) -> Callable:
    """A decoder layer's ``forward`` without gradients over chunks of ``tokens`` query positions
    (``chunked_layers``); with gradients, a cache, arguments it cannot cut or ``T ≤ tokens``, ``forward`` itself."""

    def run(*args: Any, **kwargs: Any) -> Any:
        hidden = args[0] if args else kwargs.get("hidden_states")
        if (torch.is_grad_enabled() or len(args) > 1 or not isinstance(hidden, torch.Tensor) or hidden.dim() != 3
                or hidden.shape[1] <= tokens or kwargs.get(CACHE) is not None):
            return forward(*args, **kwargs)
        T = hidden.shape[1]
        rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        cut = chunk_cuts(T, hidden.device, rest)
        if cut is None:
            return forward(*args, **kwargs)
        keys = LayerKeys(T)
        for c0 in range(0, T, tokens):
            c1 = min(T, c0 + tokens)
            out = forward(hidden[:, c0:c1], **{**rest, **{k: f(c0, c1) for k, f in cut.items()}, CACHE: keys})
            hidden[:, c0:c1] = out[0] if isinstance(out, tuple) else out  # its input rows are no longer needed
        return hidden
    return run


def layer_chunks_fit(stack: nn.ModuleList, rows: list[Row], blocks: list[int]) -> bool:
    """Whether every block of ``stack`` holds one row's site, a causal self-attention that takes rotary
    ``position_embeddings``, and its forward takes a cache (Llama, Mistral, Qwen, Gemma, Phi-3...): the block is
    position-wise but for that attention, so it can run by chunks of queries."""
    if sorted(blocks) != list(range(len(stack))):
        return False
    return all(getattr(row.site.module, "is_causal", False)
               and "position_embeddings" in inspect.signature(row.site.module.forward).parameters
               and CACHE in inspect.signature(stack[block].forward).parameters for row, block in zip(rows, blocks))


@contextmanager
def chunked_layers(model: nn.Module, rows: list[Row], tokens: int | None) -> Iterator[None]:
    """For the block, each causal decoder layer of the model's stack runs a forward without gradients over chunks of
    ``tokens`` query positions, one layer after another (see the module docstring): the same outputs and the same
    attention calls, cut by rows. The hidden states passed to the layers are overwritten in place: only for forwards
    whose outputs and hidden states are not read but by the attention's observers (``analyze``'s statistics pass).
    Models whose layers are not such decoder layers get their MLPs chunked instead (``chunked_mlps``);
    ``tokens=None``: unchanged."""
    found = block_stack(model, rows) if tokens else None
    if found is None or not layer_chunks_fit(found[0], rows, found[1]):
        with chunked_mlps(model, rows, tokens):
            yield
        return
    stack = found[0]
    with replaced_forwards(stack, [chunked_forward(block.forward, tokens) for block in stack]):
        yield
