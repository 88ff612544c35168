"""What a KV policy gives in the running process: greedy ``generate()`` of a prompt through the full cache and through
the policy, side by side — the KV bytes the cache holds at the end, the peak memory above the start of the call,
prefill seconds and decode tokens/s.

Memory is the process's resident set on CPU (``VmHWM`` reset just before each call, Linux; freed heap returned to the
system first) and CUDA's allocated bytes on a GPU. One process, whatever else runs on the machine: read the ratios,
not the absolute figures, and repeat (``repeats``) when they matter.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from transformers import StoppingCriteria, StoppingCriteriaList

from ..allocator import trim
from ..compat import CACHE
from ..errors import HeadwiseError
from .generation import PREFILL_CHUNK, apply_kv_policy, policy_of, prefill_chunk_of, remove_kv_policy
from .policy import KVPolicy

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


class _FirstToken(StoppingCriteria):
    """Records when the first new token is ready (the end of the prefill); never stops generation."""

    def __init__(self) -> None:
        self.at: float | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if self.at is None:
            if input_ids.device.type == "cuda":
                torch.cuda.synchronize(input_ids.device)  # the prefill's kernels, not their launches
            self.at = time.perf_counter()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def _rss_kib(field: str) -> int | None:
    if not STATUS.is_file():
        return None
    for line in STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def _memory_start(cuda: bool) -> int | None:
    """Bytes in use now, after resetting the peak (None where the platform cannot say)."""
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    trim()  # freed heap back to the system, so the peak is this call's
    try:
        CLEAR_REFS.write_text("5")  # resets VmHWM to the current resident set
    except OSError:
        return None
    rss = _rss_kib("VmRSS")
    return None if rss is None else rss * 1024


def _memory_peak(cuda: bool) -> int | None:
    if cuda:
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    peak = _rss_kib("VmHWM")
    return None if peak is None else peak * 1024


def held_bytes(cache: Any) -> int:
    """Bytes of the key/value storage ``cache`` holds: its ``stored_bytes()``, or a plain cache's keys and values."""
    if hasattr(cache, "stored_bytes"):
        return cache.stored_bytes()
    return sum(t.untyped_storage().nbytes() for layer in cache.layers for t in (layer.keys, layer.values)
               if t is not None)


def generate_once(model: nn.Module, ids: torch.Tensor, new_tokens: int, pad: int | None,
                  cache: Any = None, mask: torch.Tensor | None = None, **options: Any) -> dict[str, Any]:
    """One greedy ``generate()`` of exactly ``new_tokens`` after ``ids [B, T]`` (through ``cache`` when given, else
    the cache ``generate`` builds; ``mask``: the attention mask, default all ones; ``options``: more ``generate``
    arguments, e.g. ``cache_implementation``): ``prefill_s``, ``decode_tokens_per_s`` (per row), ``kv_bytes`` held
    at the end, ``cache`` (its class name), ``tokens_held``, ``peak_memory_above_start`` (bytes, None where
    unknown)."""
    cuda = ids.device.type == "cuda"
    first = _FirstToken()
    start_bytes = _memory_start(cuda)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids) if mask is None else mask,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad,
                             return_dict_in_generate=True, stopping_criteria=StoppingCriteriaList([first]),
                             **({} if cache is None else {CACHE: cache}), **options)
    if cuda:
        torch.cuda.synchronize()
    end = time.perf_counter()
    peak = _memory_peak(cuda)
    cache = out[CACHE]
    return {"prefill_s": first.at - start, "decode_tokens_per_s": (new_tokens - 1) / max(end - first.at, 1e-9),
            "kv_bytes": held_bytes(cache), "cache": type(cache).__name__, "tokens_held": int(cache.get_seq_length()),
            "peak_memory_above_start": None if peak is None or start_bytes is None else peak - start_bytes}


def measure_policy(model: nn.Module, ids: torch.Tensor, policy: KVPolicy, new_tokens: int = 32, repeats: int = 1,
                   pad_token_id: int | None = None,
                   prefill_chunk: int | Literal["auto"] | None = PREFILL_CHUNK) -> dict[str, Any]:
    """Greedy ``generate()`` of ``new_tokens`` after ``ids [T]``, through the full cache and through ``policy``,
    interleaved ``repeats`` times (medians). Returns ``{"full": row, "policy": row, "ratio": {...}, ...}``, a row
    holding ``kv_bytes`` (held by the cache at the end), ``tokens_held``, ``peak_memory_above_start`` (bytes, None
    where unknown), ``prefill_s`` and ``decode_tokens_per_s``; ``ratio``: policy / full for each. Both arms prefill
    ``prefill_chunk`` tokens per forward (``apply_kv_policy``'s). The model's own
    policy (if any) is restored afterwards."""
    if new_tokens < 2:
        raise HeadwiseError(f"new_tokens={new_tokens}: decode speed needs at least 2 new tokens")
    if repeats < 1:
        raise HeadwiseError(f"repeats={repeats} must be at least 1")
    own, own_chunk = policy_of(model), prefill_chunk_of(model)
    ids = ids[None].to(model.device)
    runs: dict[str, list[dict[str, Any]]] = {"full": [], "policy": []}
    try:
        with torch.no_grad():  # warm-up: the first call pays for lazy initialisation
            apply_kv_policy(model, policy, prefill_chunk)
            model.generate(ids[:, :16], attention_mask=torch.ones_like(ids[:, :16]), max_new_tokens=2,
                           do_sample=False, pad_token_id=pad_token_id)
        for _ in range(repeats):
            for name, rules in (("full", KVPolicy.uniform(model)), ("policy", policy)):
                apply_kv_policy(model, rules, prefill_chunk)
                runs[name].append(generate_once(model, ids, new_tokens, pad_token_id))
    finally:
        if own is not None:
            apply_kv_policy(model, own, own_chunk)
        else:
            remove_kv_policy(model)
    rows = {}
    for name, done in runs.items():
        row = {key: statistics.median(r[key] for r in done) for key in ("prefill_s", "decode_tokens_per_s")}
        peaks = [r["peak_memory_above_start"] for r in done]
        row["peak_memory_above_start"] = None if None in peaks else int(statistics.median(peaks))
        row["kv_bytes"], row["tokens_held"] = done[-1]["kv_bytes"], done[-1]["tokens_held"]
        rows[name] = row

    def ratio(key: str) -> float | None:
        a, b = rows["policy"][key], rows["full"][key]
        return None if a is None or not b else a / b

    return {**rows, "ratio": {k: ratio(k) for k in ("kv_bytes", "peak_memory_above_start", "prefill_s",
                                                      "decode_tokens_per_s")},
            "prompt_tokens": ids.shape[1], "new_tokens": new_tokens, "prefill_chunk": prefill_chunk,
            "repeats": repeats,
            "device": str(model.device), "threads": torch.get_num_threads(),
            "memory": "CUDA allocated" if model.device.type == "cuda" else "resident set (RSS)"}
