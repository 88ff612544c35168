"""A per-KV-head cache policy inside vLLM: one vLLM attention layer per (decoder layer, KV head).

vLLM gives every attention layer one KV cache spec: full attention, or a sliding window whose blocks its hybrid KV
cache manager frees once they leave the window. A policy differs between the KV heads of one decoder layer, so each
decoder layer's attention is split into *virtual layers*, one per KV head: the query heads of that KV head's group
attend to its keys and values, full or through its window (``sliding_window``: the keys a query sees, itself
included). Every virtual layer holds one KV head, so every page has the same size and vLLM's grouping of layers by
spec applies unchanged.

vLLM 0.32 groups the layers of each spec into KV cache groups of one size (the smallest spec's count of layers),
padding the last group of each spec; a block holds one page of every layer of a group. With 38 full and 52 window
heads that pads the full heads to 52 and wastes 14 full-length caches (measured: 1.44x the full model's concurrency;
1.81x with what follows). So some full heads are given a window of at least ``max_model_len`` (``balance``): they
attend to every token as before, but form a spec of their own, and their count is chosen (vLLM's own grouping
evaluated for each choice) to minimise the bytes a request at ``max_model_len`` needs, with at most ``MAX_GROUPS``
groups.

The decoder layer's projections, rotary embedding and output projection are vLLM's own; only its ``attn`` module is
replaced (``PolicyAttention``), so the weights load by their usual names.

What vLLM cannot do exactly: a streaming head's sink tokens (the first tokens every query keeps in headwise's
policy). The exporter writes windows without sinks and records the sinks it dropped (docs/serving.md). A policy
exported with sink logits (version 2, ``sink_logit``) gives each streaming virtual layer vLLM's attention sinks
(``Attention(..., sinks=)``: one logit per query head joining the softmax as a zero-value key), which is what
headwise computes for it (``headwise.kvcache.sink_logit``).
"""

from __future__ import annotations

import importlib
import logging

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention

from . import ARCHITECTURES, FORMAT, POLICY_KEY, VERSIONS

MAX_GROUPS = 8  # KV cache groups ``balance`` may create: each is a block table per request, scheduled every step
VIRTUAL = "headwise_kv_heads"  # virtual layers are named <model prefix>.headwise_kv_heads.<index>: one integer each


def read_policy(config, num_layers: int) -> tuple[list[list[int | None]], list[list[list[float] | None]] | None]:
    """``(sliding_window[layer][kv_head], sink_logit[layer][kv_head])`` from the config (window None: full
    attention; sink logits: one per query head of a streaming KV head, None without); refuses a missing, malformed
    or newer policy, naming the key."""
    policy = getattr(config, POLICY_KEY, None)
    if not isinstance(policy, dict) or policy.get("format") != FORMAT:
        raise ValueError(f"config.json has no {POLICY_KEY!r} of format {FORMAT!r}; export the folder with "
                         "headwise.clients.vllm.export_vllm (headwise kv-policy --vllm)")
    if policy.get("version") not in VERSIONS:
        raise ValueError(f"{POLICY_KEY} version {policy.get('version')!r}: this headwise-vllm reads versions "
                         f"{VERSIONS}; install the plugin of the headwise that exported the folder")
    windows, logits = policy.get("sliding_window"), policy.get("sink_logit")
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    group = config.num_attention_heads // kv_heads
    if not isinstance(windows, list) or len(windows) != num_layers or any(
            not isinstance(layer, list) or len(layer) != kv_heads
            or any(w is not None and (not isinstance(w, int) or w < 1) for w in layer) for layer in windows):
        raise ValueError(f"{POLICY_KEY}.sliding_window must list {num_layers} layers x {kv_heads} KV heads, each "
                         "null (full) or a window ≥ 1")
    if logits is not None and (not isinstance(logits, list) or len(logits) != num_layers or any(
            not isinstance(layer, list) or len(layer) != kv_heads or any(
                (s is None) != (w is None) or (s is not None and (not isinstance(s, list) or len(s) != group))
                for s, w in zip(layer, window)) for layer, window in zip(logits, windows))):
        raise ValueError(f"{POLICY_KEY}.sink_logit must list {num_layers} layers x {kv_heads} KV heads, each null "
                         f"for a full head or {group} numbers (its query heads) for a window head")
    return windows, logits


class PolicyAttention(nn.Module):
    """Stands in for a decoder layer's vLLM ``Attention``: ``q [T, H·d]``, ``k, v [T, K·d]`` (this rank's heads)
    → ``[T, H·d]``, one virtual layer per local KV head (its ``H/K`` query heads, one KV head, its window or full
    attention)."""

    def __init__(self, base: Attention, windows: list[int | None], names: list[str], vllm_config: VllmConfig,
                 sinks: list[list[float] | None] | None = None):
        super().__init__()
        self.group = base.num_heads // base.num_kv_heads
        self.head_size = base.head_size
        sinks = sinks or [None] * len(windows)
        for i, logits in enumerate(sinks):  # buffers (not weights: the checkpoint has none), built on the device
            self.register_buffer(f"sinks_{i}", None if logits is None else torch.tensor(logits, dtype=torch.float32),
                                 persistent=False)
        self.heads = nn.ModuleList(
            Attention(self.group, base.head_size, base.impl.scale, num_kv_heads=1,
                      cache_config=vllm_config.cache_config, quant_config=vllm_config.quant_config,
                      per_layer_sliding_window=window, prefix=name, sinks=getattr(self, f"sinks_{i}"))
            for i, (window, name) in enumerate(zip(windows, names)))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        width, d = self.group * self.head_size, self.head_size
        return torch.cat([head(q[:, i * width:(i + 1) * width].contiguous(), k[:, i * d:(i + 1) * d].contiguous(),
                               v[:, i * d:(i + 1) * d].contiguous()) for i, head in enumerate(self.heads)], dim=-1)


def request_cost(windows: list[int | None], vllm_config: VllmConfig, head_size: int) -> tuple[int, int]:
    """``(bytes a request of max_model_len tokens needs, KV cache groups)`` when the virtual layers have
    ``windows``, as vLLM 0.32 groups layers of one page size (its ``_get_kv_cache_groups_uniform_page_size``) and
    sizes them (a block holds one page of every layer of the largest group)."""
    from vllm.utils.math_utils import cdiv
    from vllm.v1.core.kv_cache_utils import _get_kv_cache_groups_uniform_page_size
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    block = vllm_config.cache_config.block_size
    if not block:
        raise ValueError("headwise_vllm: vLLM's block size is not known when the model is built; pass block_size")
    dtype = vllm_config.model_config.dtype
    specs = {f"layers.{i}": FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=head_size, dtype=dtype)
             if w is None else SlidingWindowSpec(block_size=block, num_kv_heads=1, head_size=head_size, dtype=dtype,
                                                 sliding_window=w) for i, w in enumerate(windows)}
    groups = _get_kv_cache_groups_uniform_page_size(specs)
    page = next(iter(specs.values())).page_size_bytes
    blocks = sum(cdiv(g.kv_cache_spec.max_memory_usage_bytes(vllm_config), page) for g in groups)
    return blocks * page * max(len(g.layer_names) for g in groups), len(groups)


def balance(windows: list[int | None], vllm_config: VllmConfig, head_size: int) -> list[int | None]:
    """``windows`` with the first ``n`` full heads given the window ``max_model_len`` (every token: the same
    attention), ``n`` chosen for the least bytes per request with at most ``MAX_GROUPS`` groups (see the module
    docstring); unchanged when no choice does better."""
    full = [i for i, w in enumerate(windows) if w is None]
    if not full or len(full) == len(windows):
        return windows
    whole = vllm_config.model_config.max_model_len

    def split(n: int) -> list[int | None]:
        moved = set(full[:n])
        return [whole if i in moved else w for i, w in enumerate(windows)]

    quiet = logging.getLogger("vllm.v1.core.kv_cache_utils")  # its padding warning, once per candidate
    level, quiet.level = quiet.level, logging.ERROR
    try:
        costs = {n: request_cost(split(n), vllm_config, head_size) for n in range(len(full))}
    finally:
        quiet.setLevel(level)
    best = min((n for n, (_, groups) in costs.items() if groups <= MAX_GROUPS or n == 0),
               key=lambda n: (costs[n][0], costs[n][1]))
    return split(best)


def rank_kv_heads(total_kv: int, tp_size: int, tp_rank: int) -> list[int]:
    """The global indices of the KV heads tensor-parallel rank ``tp_rank`` of ``tp_size`` holds, as vLLM's
    ``QKVParallelLinear`` shards them: ``total_kv / tp_size`` consecutive heads, or, with more ranks than heads,
    one head replicated on ``tp_size / total_kv`` consecutive ranks."""
    if tp_size >= total_kv:
        return [tp_rank // (tp_size // total_kv)]
    share = total_kv // tp_size
    return list(range(tp_rank * share, (tp_rank + 1) * share))


def install_policy(model: nn.Module, vllm_config: VllmConfig) -> None:
    """Replace the ``attn`` of every decoder layer this rank holds by a ``PolicyAttention`` over the policy's
    windows (balanced over the whole model: ``balance``, the same on every rank) for the KV heads of this
    tensor-parallel rank (``rank_kv_heads``). Virtual layers are named by global KV head, so ranks hold different
    layers of one model-wide set, as pipeline stages do (vLLM merges the workers' layers into one grouping);
    ranks that replicate a KV head hold the same layer."""
    config = vllm_config.model_config.hf_config
    windows, logits = read_policy(config, config.num_hidden_layers)
    context = vllm_config.compilation_config.static_forward_context
    total_kv = len(windows[0])
    local = rank_kv_heads(total_kv, get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank())
    layers = [(i, layer.self_attn) for i, layer in enumerate(model.model.layers)
              if hasattr(layer, "self_attn")]  # pipeline parallelism: other ranks' layers are placeholders
    bases = {i: attention.attn for i, attention in layers}
    for base in bases.values():  # the per-layer caches vLLM would have allocated: replaced by the virtual layers
        del context[base.layer_name]
    root = next(iter(bases.values())).layer_name.split("layers.")[0]
    flat = balance([w for layer in windows for w in layer], vllm_config, bases[layers[0][0]].head_size)
    windows = [flat[i * total_kv:(i + 1) * total_kv] for i in range(len(windows))]
    for i, attention in layers:
        if bases[i].num_kv_heads != len(local):
            raise ValueError(f"headwise_vllm: layer {i} holds {bases[i].num_kv_heads} KV heads on this rank, the "
                             f"policy's sharding {len(local)}; the policy's {total_kv} KV heads per layer must be "
                             "the model's")
        names = [f"{root}{VIRTUAL}.{i * total_kv + h}" for h in local]
        attention.attn = PolicyAttention(bases[i], [windows[i][h] for h in local], names, vllm_config,
                                         None if logits is None else [logits[i][h] for h in local])


def _policy_class(name: str, module: str, base: str) -> type:
    parent = getattr(importlib.import_module(module), base)

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        parent.__init__(self, vllm_config=vllm_config, prefix=prefix)
        install_policy(self, vllm_config)

    return type(name, (parent,), {"__init__": __init__, "__module__": __name__,
                                  "__doc__": f"vLLM's {base} with headwise's per-KV-head cache policy."})


for _name, (_module, _base) in ARCHITECTURES.items():
    globals()[_name] = _policy_class(_name, _module, _base)
