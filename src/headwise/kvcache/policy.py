"""``KVPolicy``: what the KV cache keeps for every (layer, key/value head) of a decoder-only model.

A head is either ``full`` (every token) or ``streaming(sink=S, window=W)``: the cache keeps the first ``S`` tokens
(attention sinks) and the last ``W`` tokens, and a query at position ``t`` attends to key ``j ≤ t`` only when
``j < S`` or ``t - j ≤ W`` (the sinks, the ``W`` previous tokens and itself). Positions count a row's real tokens:
left padding never counts toward a sink or a window. Under GQA a key/value head is listed once and serves its
whole group of query heads.

A window may scale with the sequence: ``streaming(S, W, context=C)`` is sized for ``C`` tokens, and a cache built
for a sequence of ``L`` tokens gives the head the window ``min(W, max(1, W·L // C))`` (``HeadCache.at(L)``; a
cache built for no known length takes ``W``). ``generate()`` builds its cache for the prompt plus the new tokens
and ``policy_forward`` for each forward's input, so one policy keeps about its share of the bytes at every length
while each sequence's queries all see the window a policy sized for that length would give them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import HeadwiseError

FORMAT = "headwise-kv-policy"
VERSION = 2  # 2: a streaming head may carry "context" (a window that scales with the sequence)
SAVINGS_AT = (512, 2048, 8192)  # lengths describe() reports, beside the calibrated one
LATENT = "latent"  # the method of headwise.conversion.convert_latent


@dataclass(frozen=True)
class HeadCache:
    """The cache of one key/value head: full (``window is None``), sink + window, or sink + a window that scales
    with the sequence up to ``context`` tokens (see the module docstring)."""

    sink: int = 0
    window: int | None = None
    context: int | None = None

    def __post_init__(self) -> None:
        if self.window is None and (self.sink or self.context is not None):
            raise HeadwiseError(f"a full head keeps every token; sink={self.sink} or context={self.context} needs a "
                                "window too")
        if self.window is not None and (int(self.window) != self.window or self.window < 1):
            raise HeadwiseError(f"streaming window={self.window!r} must be an integer ≥ 1")
        if int(self.sink) != self.sink or self.sink < 0:
            raise HeadwiseError(f"streaming sink={self.sink!r} must be an integer ≥ 0")
        if self.context is not None and (isinstance(self.context, bool) or int(self.context) != self.context
                                         or self.context < (self.window or 0)):
            raise HeadwiseError(f"streaming context={self.context!r} must be an integer ≥ window={self.window} (the "
                                "length at which the scaled window reaches its cap)")

    @property
    def full(self) -> bool:
        return self.window is None

    @property
    def capacity(self) -> int | None:
        """Tokens kept once the sequence is long (None: unbounded)."""
        return None if self.window is None else self.sink + self.window

    def at(self, length: int | None) -> "HeadCache":
        """The fixed rule of this head in a cache built for ``length`` tokens (None: the window's cap)."""
        if self.context is None:
            return self
        if length is None:
            return HeadCache(self.sink, self.window)
        return HeadCache(self.sink, max(1, min(self.window, self.window * length // self.context)))

    def stored(self, seq_len: int) -> int:
        """Tokens this head holds after a sequence of ``seq_len`` tokens (in a cache built for that length)."""
        return seq_len if self.window is None else min(seq_len, self.sink + self.at(seq_len).window)

    def to_json(self) -> str | dict[str, int]:
        if self.full:
            return "full"
        return {"sink": self.sink, "window": self.window, **({} if self.context is None else {"context": self.context})}

    @classmethod
    def from_json(cls, value: Any) -> "HeadCache":
        if value == "full":
            return FULL
        if isinstance(value, dict) and {"sink", "window"} <= set(value) <= {"sink", "window", "context"} and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
            return cls(value["sink"], value["window"], value.get("context"))
        raise HeadwiseError(f"bad head entry {value!r} in a KV policy: use \"full\", {{\"sink\": S, \"window\": W}} "
                            "or {\"sink\": S, \"window\": W, \"context\": C} (integers)")

    def __str__(self) -> str:
        if self.full:
            return "full"
        if self.context is None:
            return f"streaming(sink={self.sink}, window={self.window})"
        return f"streaming(sink={self.sink}, window={self.window} at {self.context} tokens, scaled to the sequence)"


FULL = HeadCache()


def streaming(sink: int = 4, window: int = 256, context: int | None = None) -> HeadCache:
    """A sink + window head (StreamingLLM); with ``context``, the window scales with the sequence and reaches
    ``window`` at ``context`` tokens."""
    return HeadCache(sink, window, context)


def model_shape(model: nn.Module) -> list[int]:
    """Key/value heads per decoder layer, in layer order; refuses models a KV policy cannot serve."""
    from ..sites import families_with, family_layout, find_sites

    sites = find_sites(model)
    family = model.config.model_type
    if not family_layout(family).cache_policy:
        raise HeadwiseError(f"KV policies run on decoder-only {', '.join(families_with('cache_policy'))} models; "
                            f"{type(model).__name__} is {family!r}")
    layer_types = getattr(model.config, "layer_types", None) or []
    # a config without per-layer types applies its sliding window (if any) to every layer (Mistral)
    if any(t != "full_attention" for t in layer_types) or (
        not layer_types and getattr(model.config, "sliding_window", None)
    ):
        raise HeadwiseError(f"{type(model).__name__} uses sliding-window layers; KV policies need full-attention "
                            "layers (load it with sliding_window=None)")
    sites = [s for s in sites if s.kind == "dec-self"]
    if [s.layer for s in sites] != list(range(len(sites))):
        raise HeadwiseError(f"{type(model).__name__}: decoder layers {[s.layer for s in sites]} are not 0..L-1")
    return [s.num_kv_heads for s in sites]


def latent_layers(model: nn.Module) -> list[int]:
    """Decoder layers whose keys/values are decoded from one shared latent per token (the sites listed by the
    ``latent`` journal entries of ``convert_latent``): their KV heads cannot keep different tokens, so a policy
    gives all of them one rule there."""
    from ..contract import journal
    from ..sites import find_sites

    paths = {path for e in journal(model) if e["method"] == LATENT for path in e["state"].get("sites", {})}
    return [s.layer for s in find_sites(model) if s.kind == "dec-self" and s.path in paths]


@dataclass(frozen=True)
class KVPolicy:
    """``heads[layer][kv_head]``: the cache of every key/value head (see the module docstring)."""

    heads: tuple[tuple[HeadCache, ...], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "heads", tuple(tuple(layer) for layer in self.heads))
        if not self.heads or any(not layer for layer in self.heads):
            raise HeadwiseError("a KV policy needs at least one layer and one head per layer")

    # --- construction -----------------------------------------------------------------------------------------
    @classmethod
    def uniform(cls, model: nn.Module, head: HeadCache = FULL) -> "KVPolicy":
        """The same cache on every head (``FULL``, or ``streaming(...)`` for StreamingLLM)."""
        return cls(tuple((head,) * n for n in model_shape(model)))

    @classmethod
    def keep_full(cls, model: nn.Module, full: set[tuple[int, int]], sink: int, window: int,
                  context: int | None = None) -> "KVPolicy":
        """``full`` (a set of ``(layer, kv_head)``) keeps every token; every other head streams
        (``streaming(sink, window, context)``)."""
        shape = model_shape(model)
        bad = [(l, h) for l, h in full if not (0 <= l < len(shape) and 0 <= h < shape[l])]
        if bad:
            raise HeadwiseError(f"heads {sorted(bad)[:5]} are not (layer, kv_head) pairs of this model "
                                f"({len(shape)} layers x {shape[0]} KV heads)")
        other = streaming(sink, window, context)
        return cls(tuple(tuple(FULL if (l, h) in full else other for h in range(n)) for l, n in enumerate(shape)))

    def at(self, length: int | None) -> "KVPolicy":
        """Every head's fixed rule in a cache built for ``length`` tokens (``HeadCache.at``)."""
        return KVPolicy(tuple(tuple(c.at(length) for c in layer) for layer in self.heads))

    # --- facts ------------------------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.heads)

    @property
    def kv_heads(self) -> list[int]:
        return [len(layer) for layer in self.heads]

    def full_heads(self) -> list[tuple[int, int]]:
        return [(l, h) for l, layer in enumerate(self.heads) for h, c in enumerate(layer) if c.full]

    def stored_tokens(self, seq_len: int) -> int:
        """Token slots held over all (layer, KV head) after ``seq_len`` tokens (one sequence)."""
        return sum(c.stored(seq_len) for layer in self.heads for c in layer)

    def kv_fraction(self, seq_len: int) -> float:
        """KV bytes relative to a full cache after ``seq_len`` tokens (every head has the same width)."""
        return self.stored_tokens(seq_len) / (sum(self.kv_heads) * seq_len)

    def kv_bytes(self, seq_len: int, head_dim: int, itemsize: int, batch: int = 1) -> int:
        """Bytes of keys + values held after ``seq_len`` tokens: ``2·batch·head_dim·itemsize·Σ stored``."""
        return 2 * batch * head_dim * itemsize * self.stored_tokens(seq_len)

    def validate(self, model: nn.Module) -> None:
        """Raise ``HeadwiseError`` unless this policy has one entry per KV head of ``model``."""
        shape = model_shape(model)
        if shape != self.kv_heads:
            raise HeadwiseError(
                f"KV policy for {self.num_layers} layers x {self.kv_heads[0]} KV heads does not fit "
                f"{type(model).__name__} ({len(shape)} layers, KV heads per layer {_compact(shape)}); "
                "build the policy for this model (headwise.kv_policy or KVPolicy.uniform)"
            )
        mixed = [l for l in latent_layers(model) if len(set(self.heads[l])) > 1]
        if mixed:
            raise HeadwiseError(
                f"layers {mixed[:5]} of {type(model).__name__} cache one latent per token shared by their KV heads "
                "(convert_latent), so their heads cannot keep different tokens; give every KV head of a layer the "
                "same rule (headwise.kv_policy chooses per layer on such models, or KVPolicy.uniform)"
            )

    def savings(self, lengths: tuple[int, ...] = SAVINGS_AT) -> dict[int, float]:
        """``{length: share of the full cache's bytes held}`` at each length and at the length each scaled window
        was sized for (one sequence)."""
        sized = {c.context for layer in self.heads for c in layer if c.context is not None}
        return {n: self.kv_fraction(n) for n in sorted(set(lengths) | sized)}

    def describe(self, lengths: tuple[int, ...] = SAVINGS_AT) -> str:
        """One line: the full heads, the other heads' rule, and the share of the full cache held at ``lengths``."""
        full = len(self.full_heads())
        total = sum(self.kv_heads)
        kinds = sorted({str(c) for layer in self.heads for c in layer if not c.full})
        held = ", ".join(f"{share:.0%} at {_tokens(n)}" for n, share in self.savings(lengths).items())
        return f"{full}/{total} KV heads full" + (f", others {', '.join(kinds)}" if kinds else "") + (
            f"; holds {held} of the full cache" if kinds else "")

    # --- files ------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "heads": [[c.to_json() for c in layer] for layer in self.heads]}

    @classmethod
    def from_dict(cls, data: Any) -> "KVPolicy":
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("heads"), list):
            raise HeadwiseError(f"not a KV policy (need {{\"format\": \"{FORMAT}\", \"heads\": [[...], ...]}})")
        if not isinstance(data.get("version", VERSION), int) or data.get("version", VERSION) > VERSION:
            raise HeadwiseError(f"KV policy version {data['version']} is newer than this headwise; upgrade headwise")
        return cls(tuple(tuple(HeadCache.from_json(v) for v in layer) for layer in data["heads"]))

    def save(self, path: str | os.PathLike) -> Path:
        from ..io import atomic_write_text, json_text

        path = Path(path)
        atomic_write_text(path, json_text(self.to_dict(), str(path), indent=1))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "KVPolicy":
        path = Path(path)
        if path.is_dir():
            path = path / "policy.json"
        if not path.is_file():
            raise HeadwiseError(f"KV policy file {path} not found; write one with `headwise kv-policy` or "
                                "KVPolicy.save")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise HeadwiseError(f"{path} is not valid JSON ({err.msg}, line {err.lineno})") from err
        return cls.from_dict(data)


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _compact(values: list[int]) -> str:
    return str(values[0]) if len(set(values)) == 1 else str(values)
