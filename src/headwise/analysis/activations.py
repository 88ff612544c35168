"""Whether the one-pass analysis keeps every block's activations for its backward or recomputes them block by block.

Keeping them is one forward and one backward per batch; recomputing adds a forward but holds only the blocks'
inputs (``importance.checkpointed``). ``keep_activations`` keeps them when their estimate fits in
``AVAILABLE_SHARE`` of the memory still free on the model's device.

The estimate counts what autograd saves per token and layer when every weight is frozen (measured with
``torch.autograd.graph.saved_tensors_hooks`` on SmolLM2: the linear layers save nothing, as their weights need no
gradient): the two norms' inputs and the per-head outputs the gates read (``3·D``), the MLP's gate, up and activation
(``3·I``; a plain MLP keeps one), and what SDPA keeps for its backward: queries, keys, values and its output
(``4·H·d``) and one log-sum-exp per row and head (``H``). The statistics observers read the probabilities by query
rows (``runtime.probs.ProbRows``), so no ``[H, T, T]`` map is kept. An upper estimate for models with a plain MLP.
"""

from __future__ import annotations

import torch
from torch import nn

from .rows import Row

AVAILABLE_SHARE = 0.25  # the share of free memory the kept activations may take


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


def keep_activations(model: nn.Module, rows: list[Row], tokens: int) -> bool:
    """True when the activations of the largest batch (``tokens``) fit in ``AVAILABLE_SHARE`` of the free
    memory of the model's device (False when that is unknown)."""
    free = available_bytes(next(model.parameters()).device)
    return free is not None and activation_bytes(model, rows, tokens) <= AVAILABLE_SHARE * free
