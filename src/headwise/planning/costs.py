"""What an edited model costs: heads, attention parameters, attention FLOPs at the task's sequence length and
key/value-cache bytes per token, counted on the model as it is (after physical removal), and forward latency
measured on this machine beside the unedited model (a causal LM's head on the last position only, as ``generate``'s
prefill runs it: no ``[B, T, vocab]`` logits, which would take more memory than the plan's own work).

FLOPs per sequence of ``T`` tokens and attention site (multiply-adds count 2):
``T · 2 · (weights of the q/k/v/o projections and whatever replaced them)`` plus
``T · 2 · H · (d_qk + d_v) · T_k`` for the scores and ``A·V``, where ``T_k`` is ``T`` (bidirectional) or
``(T + 1) / 2`` on average (causal), ``d_qk`` the query/key width per head and ``d_v`` the head dim.
KV bytes per token: ``Σ`` over decoder self-attention layers of ``(k width + v width) × element size``, or what a
method's cache holds there after a sequence of the task's length, over that length (a latent, a per-head policy).

What a site's shapes do not show comes from the registered methods' ``cost`` hooks (``AttentionCost``): a shorter
key span (a local window), another score width (collaborative heads' shared width), the bytes a cache keeps. A site
whose attention a method changed in a way the model cannot count (an efficient mechanism without a cost, or any op
in the ``mechanism`` slot that no method's hook speaks for) leaves the FLOPs unknown (None) with the reason in
``Costs.uncounted``: never costed as softmax attention.
"""

from __future__ import annotations

import statistics
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence, Union

import torch
from torch import nn

from ..compat import taken_keywords
from ..contract import METHODS
from ..declaration import AttentionCost
from ..runtime.ops import ATTR
from ..sites import AttentionSite, find_sites


# what can be timed: a model, or a callable returning a context that yields the model in the wanted state (e.g.
# ``AttentionSnapshot.original``: the same model with its unedited modules swapped in for the block)
Timed = Union[nn.Module, Callable[[], AbstractContextManager]]


@dataclass
class Costs:
    heads: int  # query heads left (summed over sites)
    kv_heads: int
    attention_params: int
    flops: float | None  # attention FLOPs per sequence at the task's length (None: not counted, see uncounted)
    kv_bytes: float  # key/value cache bytes per token at the length (0 without decoder self-attention)
    latency: float | None = None  # measured forward time / the unedited model's, same batch
    latency_ms: float | None = None  # median forward time
    uncounted: list[str] = field(default_factory=list)  # why the FLOPs are not counted (empty: they are)

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def _linears(site: AttentionSite) -> list[nn.Module]:
    """The modules holding the site's projections (q/k/v/o and replacements), without headwise ops: those whose
    ``weight`` is a 2-d parameter (a module that composes others, e.g. a latent projection's dense view, is
    counted through its parts)."""
    seen: dict[int, nn.Module] = {}
    for module in [site.module, site.o.module]:
        for name, sub in module.named_modules():
            if ATTR in name.split("."):
                continue
            weight = sub._parameters.get("weight")
            if weight is not None and weight.dim() == 2:
                seen.setdefault(id(sub), sub)
    return list(seen.values())


def site_params(site: AttentionSite) -> int:
    """Attention parameters of one site: its module's and its output projection's, headwise ops excluded."""
    seen: dict[int, torch.Tensor] = {}
    for module in [site.module, site.o.module]:
        for name, p in module.named_parameters():
            if ATTR not in name.split("."):
                seen.setdefault(id(p), p)
    return sum(p.numel() for p in seen.values())


def _width(module: nn.Module, transposed: bool) -> int:
    return module.weight.shape[1 if transposed else 0]


def _out_width(site: AttentionSite, proj) -> int:
    """Output features of a key or value projection (its slice of a fused one, e.g. GPT-2's ``c_attn``)."""
    if proj.module is site.q.module:
        return site.num_kv_heads * site.head_dim
    return _width(proj.module, proj.transposed)


def attention_cost(site: AttentionSite, length: float) -> AttentionCost:
    """What the registered methods' ``cost`` hooks say about ``site`` at ``length`` tokens, as one
    ``AttentionCost`` (the shortest key span, the score width, the cache bytes, every reason it is uncounted); an op
    in the site's ``mechanism`` slot that no hook speaks for makes it uncounted."""
    said = [c for c in (m.cost(site, length) for m in METHODS.values() if m.cost is not None) if c is not None]
    ops = getattr(site.module, ATTR, None)
    uncounted = [c.uncounted for c in said if c.uncounted]
    if ops is not None and ops.mechanism and not said:
        uncounted.append(f"{site.name} runs {', '.join(ops.mechanism)} in place of attention, which no registered "
                         "method's cost hook counts")
    spans = [c.key_span for c in said if c.key_span is not None]
    widths = [c.score_width for c in said if c.score_width is not None]
    caches = [c.kv_bytes for c in said if c.kv_bytes is not None]
    return AttentionCost(key_span=min(spans) if spans else None, score_width=widths[-1] if widths else None,
                         kv_bytes=min(caches) if caches else None, uncounted="; ".join(uncounted) or None)


def key_span(site: AttentionSite, length: float, cost: AttentionCost | None = None) -> float:
    """Keys each query attends to on average at sequence length ``length`` (``cost``: the methods' word on the
    site, ``attention_cost`` by default)."""
    cost = cost or attention_cost(site, length)
    span = (length + 1) / 2 if site.causal else length
    return span if cost.key_span is None else min(span, cost.key_span)


def site_flops(site: AttentionSite, length: float) -> float | None:
    """Attention FLOPs of one site for a sequence of ``length`` tokens (see the module docstring); None when a
    method changed its attention in a way that is not counted (``attention_cost(...).uncounted``)."""
    cost = attention_cost(site, length)
    if cost.uncounted:
        return None
    proj = sum(2 * m.weight.numel() for m in _linears(site))
    dqk = site.head_dim if cost.score_width is None else cost.score_width
    return length * (proj + 2 * site.num_heads * (dqk + site.head_dim) * key_span(site, length, cost))


def kv_bytes(site: AttentionSite, length: float) -> float:
    """Key/value cache bytes per token of one site after a sequence of ``length`` tokens (0 unless decoder
    self-attention; a method's ``cost`` hook may say what its cache keeps instead)."""
    if not site.causal or site.kind == "dec-enc":
        return 0
    said = attention_cost(site, length).kv_bytes
    if said is not None:
        return said * len(site.layers)
    k, v = _out_width(site, site.k), _out_width(site, site.v)
    return (k + v) * site.k.module.weight.element_size() * len(site.layers)


def static_costs(model: nn.Module, length: float) -> Costs:
    """Heads, attention parameters, FLOPs at ``length`` tokens and KV bytes per token of ``model`` as it is (FLOPs
    None, with the reasons in ``uncounted``, when a site's attention is not counted)."""
    sites = find_sites(model)
    flops = [(s, site_flops(s, length)) for s in sites]
    uncounted = [attention_cost(s, length).uncounted for s, f in flops if f is None]
    return Costs(heads=sum(s.num_heads * len(s.layers) for s in sites),
                 kv_heads=sum(s.num_kv_heads * len(s.layers) for s in sites),
                 attention_params=sum(site_params(s) for s in sites),
                 flops=None if uncounted else float(sum(f * len(s.layers) for s, f in flops)),
                 kv_bytes=sum(kv_bytes(s, length) for s in sites), uncounted=uncounted)


@torch.inference_mode()
def _time(timed: Timed, batch: dict[str, torch.Tensor]) -> float:
    with nullcontext(timed) if isinstance(timed, nn.Module) else timed() as model:
        device = next(model.parameters()).device
        extra = taken_keywords(model, logits_to_keep=1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        model(**batch, **extra)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start


def measure_latency(model: Timed, base: Timed, batch: dict[str, torch.Tensor], repeats: int = 7,
                    warmup: int = 2) -> tuple[float, float]:
    """``(median ratio, median ms of model)`` of one edited model beside ``base`` (``measure_latencies``)."""
    return measure_latencies({"model": model}, base, batch, repeats, warmup)[0]["model"]


def measure_latencies(models: dict[str, Timed], base: Timed, batch: dict[str, torch.Tensor],
                      repeats: int = 15, warmup: int = 2) -> tuple[dict[str, tuple[float, float]], float]:
    """``({name: (median ratio, median ms)}, median ms of base)`` for edited models timed side by side: each
    round runs ``base``, every model (in an order rotated each round) and ``base`` again; a model's ratio in a
    round is its time over the mean of that round's two base forwards, so slow drifts of the machine cancel and
    no model always runs right after another. A model or base may be given as a callable returning a context
    that yields it (only the forward inside is timed)."""
    names = list(models)
    for _ in range(warmup):
        _time(base, batch)
        for name in names:
            _time(models[name], batch)
    times: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    base_times = []
    for r in range(repeats):
        start = _time(base, batch)
        order = names[r % len(names):] + names[:r % len(names)] if names else []
        round_times = {name: _time(models[name], batch) for name in order}
        base_times += [start, _time(base, batch)]
        reference = (base_times[-2] + base_times[-1]) / 2
        for name, t in round_times.items():
            times[name].append(t)
            ratios[name].append(t / reference)
    per_model = {name: (statistics.median(ratios[name]), 1000 * statistics.median(times[name])) for name in names}
    return per_model, 1000 * statistics.median(base_times)


def sequence_length(batches: Sequence[dict[str, torch.Tensor]]) -> float:
    """Mean number of real tokens per sequence in ``batches`` (the length FLOPs are counted at)."""
    tokens = seqs = 0
    for b in batches:
        mask = b.get("attention_mask")
        ids = b["input_ids"]
        tokens += int(ids.numel() if mask is None else mask.sum())
        seqs += ids.shape[0]
    return tokens / max(seqs, 1)
