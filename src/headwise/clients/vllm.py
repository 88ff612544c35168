"""A folder vLLM serves for a model carrying a KV policy (docs/serving.md).

vLLM keeps, per attention layer, either every token or a sliding window whose blocks its hybrid KV cache manager
frees. So:

- a **whole-layer** policy of a Llama or Mistral model (every KV head of a layer full, or every one the same
  window, one window for the model) is served **natively**: the folder is the plain model with
  ``layer_types`` (``full_attention`` / ``sliding_attention``) and ``sliding_window`` in its config, which vLLM's
  Llama and Mistral classes read; no plugin;
- any other policy (heads of one layer differing, Qwen2) is served by **the plugin** (``plugins/vllm``, package
  ``headwise-vllm`` installed into vLLM's environment): the config names the plugin's architecture
  (``Headwise`` + the model's, e.g. ``HeadwiseLlamaForCausalLM``) and carries the windows under
  ``headwise_kv_policy``; the plugin gives each KV head its own vLLM attention layer.

The weights are the model's plain export (``io.plain.export_plain``: a KV policy changes no weight, so pruned and
GQA-converted models export too). vLLM's ``sliding_window`` counts the keys a query sees, itself included: a
headwise window ``W`` (the ``W`` previous tokens and the query) is ``W + 1`` there. What vLLM cannot keep is a
streaming head's **sink** tokens: the folder has windows without sinks, and ``VLLMExport.dropped_sink`` says how
many sink tokens each streaming head lost (the cost is measured in docs/serving.md). A policy applied with sink
logits (``apply_kv_policy(..., sink_logits=)``, ``kvcache.sink_logit``) exports them (``sink_logit``, always
through the plugin), which hands them to vLLM's attention as its ``sinks``: the same attention as headwise's. A
window that scales with the sequence is written at its cap (the window it has at its ``context``): vLLM has one
window for every length.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import HeadwiseError

POLICY_KEY = "headwise_kv_policy"  # read by the plugin (plugins/vllm/headwise_vllm), with FORMAT
FORMAT = "headwise-kv-policy-vllm"
VERSION = 2  # 2: "sink_logit" per streaming KV head (the plugin reads 1 and 2)
NATIVE_FAMILIES = ("llama", "mistral")  # vLLM classes that read layer_types + sliding_window
PLUGIN_FAMILIES = {"llama": "HeadwiseLlamaForCausalLM", "mistral": "HeadwiseMistralForCausalLM",
                   "qwen2": "HeadwiseQwen2ForCausalLM"}


@dataclass(frozen=True)
class VLLMExport:
    """What ``export_vllm`` wrote: ``path``, ``served`` (``"native"`` or ``"plugin"``), the vLLM windows per
    (layer, KV head) (None: full) and the sink tokens each streaming head lost (0: exact)."""

    path: Path
    served: str
    sliding_window: list[list[int | None]]
    dropped_sink: int
    sink_logit: bool = False  # the streaming heads' sink logits were written (headwise computes the same)

    def describe(self) -> str:
        how = ("vLLM serves it natively (layer_types + sliding_window)" if self.served == "native" else
               "vLLM serves it with the headwise-vllm plugin (pip install plugins/vllm into vLLM's environment)")
        lost = (f"; streaming heads keep their window but not their {self.dropped_sink} sink tokens (vLLM has no "
                "per-request sinks)" if self.dropped_sink else "")
        logit = "; streaming heads add their sink logits (vLLM's attention sinks)" if self.sink_logit else ""
        return f"{how}{lost}{logit}"


def vllm_windows(policy: Any) -> tuple[list[list[int | None]], int]:
    """``(sliding_window[layer][kv_head], dropped sink)`` of a ``KVPolicy`` in vLLM's terms: None for a full head,
    ``W + 1`` for a window of ``W`` (at its cap when it scales), and the largest sink a streaming head loses."""
    fixed = policy.at(None)
    windows = [[None if rule.full else rule.window + 1 for rule in layer] for layer in fixed.heads]
    sinks = [rule.sink for layer in fixed.heads for rule in layer if not rule.full]
    return windows, max(sinks, default=0)


def vllm_sink_logits(windows: list[list[int | None]], logits: Any) -> list[list[list[float] | None]] | None:
    """``sink_logit[layer][kv_head]``: the sink logits of the query heads of each streaming KV head (None for a
    full head), from ``logits [L, Hkv, g]`` (``kvcache.sink_logit``); None without them."""
    if logits is None:
        return None
    return [[None if w is None else logits[i][h].tolist() for h, w in enumerate(layer)]
            for i, layer in enumerate(windows)]


def native_layers(family: str, windows: list[list[int | None]]) -> tuple[list[str], int | None] | None:
    """``(layer_types, sliding_window)`` when vLLM serves these windows natively (a family of
    ``NATIVE_FAMILIES``, one rule per layer, one window in the model), else None."""
    per_layer = [set(layer) for layer in windows]
    used = {w for rules in per_layer for w in rules if w is not None}
    if family not in NATIVE_FAMILIES or any(len(rules) > 1 for rules in per_layer) or len(used) > 1:
        return None
    types = ["full_attention" if rules == {None} else "sliding_attention" for rules in per_layer]
    return types, (used.pop() if used else None)


def export_vllm(model: nn.Module, path: str | os.PathLike, tokenizer: Any = None,
                overwrite: bool = False) -> VLLMExport:
    """Write ``model`` (carrying a KV policy: ``headwise.apply_kv_policy``) to ``path`` as a folder vLLM serves
    with the policy (see the module docstring); the model keeps its policy. Refuses a model without a policy, a
    family vLLM cannot serve with one, and what a plain export refuses (``io.plain.plain_problem``)."""
    from ..io import export_plain, plain_problem
    from ..io.manifest import write_manifest
    from ..kvcache import apply_kv_policy, policy_of, remove_kv_policy
    from ..kvcache.generation import prefill_chunk_of, sink_logits_of

    policy = policy_of(model)
    if policy is None:
        raise HeadwiseError("export_vllm: the model has no KV policy; apply one (headwise.apply_kv_policy) or serve "
                            "its plain export (io.export_plain, `headwise convert`/`prune --plain`) as it is")
    family = model.config.model_type
    if family not in PLUGIN_FAMILIES:
        raise HeadwiseError(f"export_vllm: vLLM serves KV policies of {', '.join(PLUGIN_FAMILIES)} models, not "
                            f"{family!r}")
    windows, dropped = vllm_windows(policy)
    chunk, logits = prefill_chunk_of(model), sink_logits_of(model)
    remove_kv_policy(model)
    try:
        problem = plain_problem(model)
        if problem:
            raise HeadwiseError(f"export_vllm: the weights cannot be written as plain transformers: {problem}")
        export_plain(model, path, tokenizer=tokenizer, overwrite=overwrite)
    finally:
        apply_kv_policy(model, policy, prefill_chunk=chunk, sink_logits=logits)
    config_path = Path(path) / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    native = native_layers(family, windows) if logits is None else None  # vLLM's own classes take no sinks
    if native is not None:
        config["layer_types"], config["sliding_window"] = native
    else:
        config["architectures"] = [PLUGIN_FAMILIES[family]]
        config[POLICY_KEY] = {"format": FORMAT, "version": VERSION, "sliding_window": windows,
                              "sink_logit": vllm_sink_logits(windows, logits), "dropped_sink": dropped}
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    write_manifest(path)
    return VLLMExport(Path(path), "native" if native is not None else "plugin", windows, dropped, logits is not None)
