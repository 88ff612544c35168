"""Put a ``KVPolicy`` on a model so that ``model.generate()`` uses it, save it with the model, take it off.

The policy is the state of the model's ``kv_policy`` journal entry (``headwise.contract``; replayed by
``headwise.from_pretrained``) and read from there whenever ``generate`` builds its cache: the model's
``_prepare_cache_for_generation`` is wrapped on the instance so that the default ``DynamicCache`` becomes a
``PolicyCache``, and ``cache_implementation="static"`` a preallocated, compileable one. A cache passed explicitly
(``cache=``, or ``past_key_values=`` before transformers 5.24) or another ``cache_implementation`` is left alone.
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager
from typing import Any, Iterator, Literal

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, StaticCache

from ..compat import CACHE, cache_given
from ..errors import HeadwiseError
from ..contract import entries, record, unrecord
from ..runtime import NAME, enable
from .cache import PolicyCache
from .policy import KVPolicy
from .sink_logit import checked_sink_logits, sink_logit_cache
from .declaration import KV_POLICY

KIND = KV_POLICY.name  # the method's name, and the kind of its format-1 edit records
HOOK = "_prepare_cache_for_generation"
BEFORE = "_headwise_cache_hook_before_policy"  # the instance's own hook (e.g. a latent cache's), back on removal
PREFILL_CHUNK = "auto"  # tokens per prefill forward under a policy: chosen per device by prefill_chunk_for
CPU_PREFILL_CHUNK = 512  # the lowest peak of 256/512/1024/whole on a 2-core CPU (SmolLM2, docs/kv-policy.md)
ACCELERATOR_CHUNKS = (8192, 4096, 2048, 1024)  # a GPU's choices, largest first: few launches, transients that fit


def _as_policy(policy: KVPolicy | dict | str | os.PathLike) -> KVPolicy:
    if isinstance(policy, KVPolicy):
        return policy
    if isinstance(policy, dict):
        return KVPolicy.from_dict(policy)
    if isinstance(policy, (str, os.PathLike)):
        return KVPolicy.load(policy)
    raise HeadwiseError(f"apply_kv_policy takes a KVPolicy, its dict or a policy.json path, "
                        f"not {type(policy).__name__}")


def policy_of(model: nn.Module) -> KVPolicy | None:
    """The KV policy recorded on ``model`` (None without one)."""
    found = entries(model, KIND)
    return KVPolicy.from_dict(found[-1]["state"]["policy"]) if found else None


def sink_logits_of(model: nn.Module) -> torch.Tensor | None:
    """The sink logits ``[L, Hkv, g]`` recorded with the model's KV policy (``apply_kv_policy(...,
    sink_logits=)``; None: its streaming heads keep their sink tokens only)."""
    found = entries(model, KIND)
    logits = found[-1]["state"].get("sink_logits") if found else None
    return None if logits is None else torch.tensor(logits, dtype=torch.float32)


def prefill_chunk_of(model: nn.Module) -> int | Literal["auto"] | None:
    """The prefill chunk setting recorded with the model's KV policy (None: the whole prompt, or no policy)."""
    found = entries(model, KIND)
    return found[-1]["state"].get("prefill_chunk", CPU_PREFILL_CHUNK) if found else None


def prefill_chunk_for(model: nn.Module, setting: int | Literal["auto"] | None, batch: int,
                      tokens: int) -> int | None:
    """Tokens per prefill forward for ``batch`` prompts of up to ``tokens`` tokens (None: the whole prompt).

    ``"auto"``: on a CPU ``CPU_PREFILL_CHUNK`` (the prefill's transient tensors, not its launches, bound the time and
    the peak there); on an accelerator the largest of ``ACCELERATOR_CHUNKS`` whose transient tensors (the MLP's and
    attention's activations, and a float bias over every key) take at most an eighth of the free device memory, or
    the whole prompt when it is no longer than that chunk: a GPU's prefill is bound by kernel launches per forward."""
    if setting != "auto":
        return setting
    weight = next(model.parameters())
    if weight.device.type in ("cpu", "meta"):
        return CPU_PREFILL_CHUNK
    free = torch.cuda.mem_get_info(weight.device)[0] if weight.device.type == "cuda" else None
    return accelerator_chunk(model.config, weight.element_size(), batch, tokens, free)


def accelerator_chunk(config: Any, itemsize: int, batch: int, tokens: int, free: int | None) -> int | None:
    """``prefill_chunk_for``'s choice on an accelerator with ``free`` bytes (None: unknown, take the largest)."""
    hidden = config.hidden_size
    per_token = batch * itemsize * (3 * getattr(config, "intermediate_size", 4 * hidden) + 4 * hidden + tokens)
    fits = [c for c in ACCELERATOR_CHUNKS if free is None or c * per_token <= free / 8] or [ACCELERATOR_CHUNKS[-1]]
    return None if tokens <= fits[0] else fits[0]


def policy_cache(model: nn.Module, policy: KVPolicy | None = None, max_cache_len: int | None = None,
                 length: int | None = None) -> PolicyCache:
    """A fresh ``PolicyCache`` for ``model`` (its recorded policy by default), for plain forward calls:
    ``model(ids, cache=policy_cache(model, length=T), use_cache=True)`` (``past_key_values=`` before transformers
    5.24). ``length``: the tokens the sequence will reach, which fixes windows that scale with the sequence (None:
    their caps); ``max_cache_len``: preallocated and compileable (``generate(cache_implementation="static")``).
    The model's own policy brings its sink logits (``sink_logits_of``; ``kvcache.sink_logit``)."""
    own = policy_of(model)
    policy = policy or own
    if policy is None:
        raise HeadwiseError("this model has no KV policy; pass one or call headwise.apply_kv_policy(model, policy)")
    policy.validate(model)
    if model.config._attn_implementation != NAME:
        raise HeadwiseError(f"a per-head KV cache needs the headwise attention implementation, not "
                            f"{model.config._attn_implementation!r}: call headwise.enable(model)")
    logits = sink_logits_of(model) if policy == own else None
    if logits is None:
        return PolicyCache(policy, max_cache_len, length)
    if max_cache_len is not None:
        raise HeadwiseError("sink logits run in the growing cache only: generate without "
                            "cache_implementation=\"static\", or apply the policy without sink_logits")
    return sink_logit_cache(policy, logits, length)


@contextmanager
def policy_forward(model: nn.Module, policy: KVPolicy | None = None) -> Iterator[nn.Module]:
    """Inside the block, every forward call of ``model`` that passes no cache runs through a fresh
    ``PolicyCache`` (``policy``, or the model's recorded one): each head's rule applies to every query of the
    prefill, as in decoding, so a task's metric (e.g. ``lm`` perplexity) measures what the policy keeps.

    ``with policy_forward(model): task.evaluate(model, tokenizer)``. Validated before anything changes."""
    policy = policy or policy_of(model)
    policy_cache(model, policy)  # refuses a missing or mismatched policy, or the wrong attention implementation

    def through_cache(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if not cache_given(kwargs):
            inputs = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs_embeds"))
            length = None if inputs is None else inputs.shape[1]
            kwargs = {**kwargs, CACHE: policy_cache(model, policy, length=length), "use_cache": True}
        return args, kwargs

    handle = model.register_forward_pre_hook(through_cache, with_kwargs=True)
    try:
        yield model
    finally:
        handle.remove()


def _prepare_cache_with_policy(self, generation_config, model_kwargs: dict, *args, **kwargs) -> Any:
    """``generate``'s cache preparation, then the default ``DynamicCache`` (or the ``StaticCache`` of
    ``cache_implementation="static"``, which then compiles the decoding step as transformers does) swapped for a
    ``PolicyCache`` built for the prompt and the new tokens, and the prompt chunked (``generation_config`` is
    ``generate``'s own copy: the model's stays unchanged)."""
    user_cache = cache_given(model_kwargs)
    result = type(self)._prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs)
    policy, cache = policy_of(self), model_kwargs.get(CACHE)
    if policy is not None and not user_cache and type(cache) in (DynamicCache, StaticCache):
        batch, tokens = _generation_shape(args, kwargs)  # tokens: the prompt and the new tokens
        static = cache.layers[0].max_cache_len if isinstance(cache, StaticCache) else None
        model_kwargs[CACHE] = policy_cache(self, policy, static, length=tokens)
        if generation_config.prefill_chunk_size is None:
            generation_config.prefill_chunk_size = prefill_chunk_for(self, prefill_chunk_of(self), batch, tokens)
        shape = self._get_static_cache_init_shape() if static is not None else None
        if shape is not None:  # allocated here, not inside a compiled prefill chunk: fixed addresses from the start
            model_kwargs[CACHE].early_initialization(batch, [len(layer) for layer in policy.heads], shape[1],
                                                     self.dtype, self.device)
    return result


def _generation_shape(args: tuple, kwargs: dict) -> tuple[int, int]:
    """``(batch_size, max_cache_length)`` of ``_prepare_cache_for_generation(config, model_kwargs, mode, batch,
    max_cache_length)``'s remaining arguments."""
    named = dict(zip(("generation_mode", "batch_size", "max_cache_length"), args)) | kwargs
    return named["batch_size"], named["max_cache_length"]


def apply_kv_policy(model: nn.Module, policy: KVPolicy | dict | str | os.PathLike,
                    prefill_chunk: int | Literal["auto"] | None = PREFILL_CHUNK,
                    sink_logits: torch.Tensor | None = None) -> nn.Module:
    """Give ``model`` a per-KV-head cache: afterwards ``model.generate()`` keeps only what ``policy`` says.

    ``policy``: a ``KVPolicy``, its dict, or the path of a ``policy.json`` (or of the folder holding it). A policy
    that does not fit the model raises ``HeadwiseError`` before anything changes. ``prefill_chunk``: tokens per
    prefill forward in ``generate`` (streaming heads never hold more than their slots plus one chunk; None: the
    whole prompt at once; ``"auto"``: by device and free memory, ``prefill_chunk_for``). Replaces an earlier
    policy; selects the ``headwise`` attention implementation; saved by
    ``headwise.save_pretrained``. ``sink_logits [L, Hkv, g]`` (``kvcache.sink_logit.sink_logits``): every streaming
    query head adds its logit to its softmax, a zero-value virtual key (vLLM's attention sinks). Returns the model.
    """
    policy = _as_policy(policy)
    if prefill_chunk not in (None, "auto") and (isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int)
                                                or prefill_chunk < 1):
        raise HeadwiseError(f"prefill_chunk={prefill_chunk!r} must be a positive number of tokens, \"auto\" (by "
                            "device) or None (the whole prompt at once)")
    policy.validate(model)
    state = {"policy": policy.to_dict(), "prefill_chunk": prefill_chunk}
    if sink_logits is not None:
        state["sink_logits"] = checked_sink_logits(policy, model, sink_logits).tolist()
    _install(model)
    # the policy is the entry's state (no config beside it: a KVPolicyConfig holds nothing else)
    record(model, KIND, None, state, replace=True)
    return model


def remove_kv_policy(model: nn.Module) -> nn.Module:
    """Back to the default cache (every token of every head); returns the model."""
    if policy_of(model) is None:
        raise HeadwiseError("this model has no KV policy to remove")
    unrecord(model, KIND)
    if isinstance(model.__dict__.get(HOOK), types.MethodType):
        del model.__dict__[HOOK]
    before = model.__dict__.pop(BEFORE, None)
    if before is not None:
        setattr(model, HOOK, before)
    return model


def _install(model: nn.Module) -> None:
    enable(model)
    if hasattr(type(model), HOOK):  # models that generate; base models take policy_cache(model) explicitly
        current = model.__dict__.get(HOOK)
        if current is not None and getattr(current, "__func__", None) is not _prepare_cache_with_policy:
            setattr(model, BEFORE, current)  # a policy takes precedence; remove_kv_policy puts it back
        setattr(model, HOOK, types.MethodType(_prepare_cache_with_policy, model))


def replay_kv_policy(model: nn.Module, entry: dict) -> None:
    """Put the policy of a journal entry back on a freshly built model."""
    KVPolicy.from_dict(entry["state"]["policy"]).validate(model)
    _install(model)
