"""How the gradient pass holds its activations: all kept, or recomputed within a memory margin.

Keeping them is one forward and one backward per batch; recomputing adds a forward but holds only the blocks'
inputs (``importance.checkpointed``). ``margin_bytes`` is what the pass may hold beside the weights:
``MARGIN`` of the weights' bytes (at least ``MIN_MARGIN``), at most ``AVAILABLE_SHARE`` of the memory still free
on the model's device — the same at any length. ``keep_activations`` keeps them when their estimate fits the
margin; otherwise ``recompute_plan`` picks the least recomputation whose estimate fits: each block alone, then
the stack in segments of ``⌈√L⌉`` blocks (``⌈L/s⌉ + s`` hidden states held instead of ``L``: one forward more),
and the MLP in chunks of positions when one block's MLP activations alone would take more than a quarter of it.

The estimate counts what autograd saves per token and layer when every weight is frozen (measured with
``torch.autograd.graph.saved_tensors_hooks`` on SmolLM2: the linear layers save nothing, as their weights need no
gradient): the two norms' inputs and the per-head outputs the gates read (``3·D``), the MLP's gate, up and activation
(``3·I``; a plain MLP keeps one), and what SDPA keeps for its backward: queries, keys, values and its output
(``4·H·d``) and one log-sum-exp per row and head (``H``). The statistics observers read the probabilities by query
rows (``runtime.probs.ProbRows``), so no ``[H, T, T]`` map is kept. An upper estimate for models with a plain MLP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .layerwise import layerwise_fits
from .metrics import block_bytes
from .rows import Row

AVAILABLE_SHARE = 0.25  # the most of the free memory the gradient pass may hold
MARGIN = 0.2  # what the gradient pass may hold beside the weights, as a share of their bytes
MIN_MARGIN = 64 << 20  # bytes: small models keep their activations, as recomputing saves nothing that matters
MIN_CHUNK_TOKENS = 128  # the shortest chunk of positions (an MLP's, a layer's queries)


@dataclass(frozen=True)
class Recompute:
    """How the backward recomputes: ``segment`` blocks per outer checkpoint (1: each block alone) and
    ``mlp_tokens`` positions per MLP chunk (None: the MLP over every position at once); or, with
    ``layer_tokens``, one decoder layer at a time by chunks of that many queries (``layerwise``)."""

    segment: int = 1
    mlp_tokens: int | None = None
    layer_tokens: int | None = None


def activation_bytes(model: nn.Module, rows: list[Row], tokens: int) -> int:
    """Estimated bytes autograd keeps for the backward of a forward over ``tokens`` tokens (batch × length) with
    every weight frozen (linear in the tokens: no attention map is kept)."""
    inner = getattr(getattr(model, "config", None), "intermediate_size", None)
    element = next(model.parameters()).element_size()
    total = 0
    for row in rows:
        site = row.site
        total += (3 * site.hidden_size + 3 * (inner or 4 * site.hidden_size) + 4 * site.num_heads * site.head_dim
                  + site.num_heads)
    return total * tokens * element


def available_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` (host RAM for the CPU, ``mem_get_info`` for CUDA); None when unknown."""
    if device.type == "cpu":
        import psutil  # an Accelerate dependency

        return psutil.virtual_memory().available
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return None


def margin_bytes(model: nn.Module) -> int:
    """What the gradient pass may hold beside the weights: ``MARGIN`` of their bytes (at least ``MIN_MARGIN``),
    at most ``AVAILABLE_SHARE`` of the free memory of their device (when known)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    margin = max(MIN_MARGIN, int(MARGIN * weights))
    free = available_bytes(next(model.parameters()).device)
    return margin if free is None else min(margin, int(AVAILABLE_SHARE * free))


def keep_activations(model: nn.Module, rows: list[Row], tokens: int) -> bool:
    """True when the activations of the largest batch (``tokens``) fit in ``margin_bytes``."""
    return activation_bytes(model, rows, tokens) <= margin_bytes(model)


def forward_chunk_tokens(model: nn.Module, batch: int, length: int) -> int | None:
    """Positions per chunk of a forward without gradients (the statistics pass: decoder layers by chunks of
    queries, other models' MLPs by chunks of positions), so that a chunk's transient tensors stay within the block
    of query rows' budget (``metrics.block_bytes``: fixed on a CPU, from the free memory on an accelerator): per
    token, the larger of the MLP's ``4·I`` elements (gate, up, activation, product) and the attention's ``8·D``
    (normed input, queries, keys, values, their rotary copies, output, projection), plus the chunk's mask over the
    ``length`` keys (a boolean, and the float copy SDPA makes of it); None when all ``length`` positions fit at
    once."""
    config, weight = getattr(model, "config", None), next(model.parameters())
    hidden = getattr(config, "hidden_size", 0) or 0
    inner = getattr(config, "intermediate_size", None) or 4 * hidden
    element = weight.element_size()
    per_token = batch * (max(4 * inner, 8 * hidden) * element + length * (1 + element))
    budget = block_bytes(weight.device)
    if not hidden or length * per_token <= budget:
        return None
    return max(MIN_CHUNK_TOKENS, budget // per_token)


def backward_chunk_tokens(model: nn.Module, rows: list[Row], batch: int, length: int) -> int:
    """Query positions per chunk of the layer-by-layer backward (``layerwise``): one chunk's activations and their
    gradients (twice ``activation_bytes`` of one layer per token) and its mask over the ``length`` keys (a boolean
    and a float copy) within ``metrics.block_bytes``; at least ``MIN_CHUNK_TOKENS``, at most ``length``."""
    element = next(model.parameters()).element_size()
    per_token = batch * (2 * activation_bytes(model, rows[:1], 1) + length * (1 + element))
    return min(length, max(MIN_CHUNK_TOKENS, block_bytes(next(model.parameters()).device) // per_token))


def recompute_plan(model: nn.Module, rows: list[Row], batch: int, length: int, one_forward: bool = True
                   ) -> Recompute:
    """The least recomputation whose estimate fits ``margin_bytes`` for batches of ``batch × length`` tokens (or
    the one that holds least). Estimates, in elements of the weights' dtype per token: each held hidden state
    ``D``; one block recomputed with its backward ``8·D + 4·Hkv·d`` plus ``6·I`` per token of an MLP chunk (the
    MLP's three activations and their gradients). When every block's input and one block do not fit, a stack of
    causal decoder layers goes one layer at a time (``layerwise``: the gradient, the keys and values and theirs,
    and one chunk held, the layers' inputs on disk; one forward more, like recomputing each block) when the loss
    runs the layers once per batch (``one_forward``: not an objective over pairs of texts); other models go in
    segments, which need blocks that all get the same masks (one kind of layer in ``config.layer_types``)."""
    margin, site, config = margin_bytes(model), rows[0].site, getattr(model, "config", None)
    element, tokens = next(model.parameters()).element_size(), batch * length
    inner = getattr(config, "intermediate_size", None) or 4 * site.hidden_size
    mlp_tokens = None
    if 6 * tokens * inner * element > margin // 4:
        mlp_tokens = max(MIN_CHUNK_TOKENS, margin // 4 // (6 * batch * inner * element))
    block = element * (tokens * (8 * site.hidden_size + 4 * site.num_kv_heads * site.head_dim)
                       + 6 * batch * min(length, mlp_tokens or length) * inner)
    held = len(rows) * tokens * site.hidden_size * element  # every block's input
    if held + block > margin and one_forward and layerwise_fits(model, rows):
        return Recompute(layer_tokens=backward_chunk_tokens(model, rows, batch, length))
    one_kind = len(set(getattr(config, "layer_types", None) or ())) <= 1
    segment = math.ceil(math.sqrt(len(rows))) if one_kind and held + block > margin else 1
    return Recompute(segment, mlp_tokens)
