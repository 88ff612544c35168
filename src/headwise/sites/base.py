"""The attention site: a uniform, per-head view of one attention module of any supported family."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

import torch
from torch import nn

from .selection import KINDS, Kind  # noqa: F401  (defined with the selection, which needs no torch)

Positions = Literal["absolute", "rotary", "relative", "learned-2d"]


@dataclass
class HeadProjection:
    """Per-head view of one projection (``nn.Linear`` or GPT-2's transposed ``Conv1D``).

    ``axis="out"`` (q, k, v): the heads split the output features, starting at ``offset``;
    ``axis="in"`` (o): the heads split the input features.
    """

    module: nn.Module
    heads: int
    head_dim: int
    axis: Literal["out", "in"] = "out"
    offset: int = 0
    transposed: bool = False  # Conv1D stores weight as [in, out]

    @property
    def weight(self) -> torch.Tensor:
        """q/k/v: ``[heads, head_dim, in]``; o: ``[heads, out, head_dim]``. A view: writes reach the model."""
        w = self.module.weight
        w = w.t() if self.transposed else w  # now [out, in]
        span = slice(self.offset, self.offset + self.heads * self.head_dim)
        if self.axis == "out":
            return w[span].unflatten(0, (self.heads, self.head_dim))
        return w[:, span].unflatten(1, (self.heads, self.head_dim)).permute(1, 0, 2)

    @property
    def bias(self) -> torch.Tensor | None:
        """q/k/v: ``[heads, head_dim]``; o: the full ``[out]`` bias (it is not per head) or None."""
        b = self.module.bias
        if b is None or self.axis == "in":
            return b
        return b[self.offset : self.offset + self.heads * self.head_dim].unflatten(0, (self.heads, self.head_dim))


@dataclass(frozen=True)
class FamilyLayout:
    """What edits must know about a family's attention module; its adapter owns it (``register_adapter``).

    ``head_counts`` / ``head_sizes``: integer attributes that hold the number of query heads / heads × head_dim
    (surgery rewrites the ones present); ``query`` / ``key``: attribute names of the query and key projections, or
    ``fused_qkv``: one projection producing ``[q | k | v]`` (GPT-2's ``c_attn``); ``position_bias``: scores get an
    additive, content-free relative-position bias shared by the stack (T5), whose heads a pruned module reads
    through ``BIAS_HEADS``.

    What the family can do beyond sites (methods read these, never ``model_type`` lists):
    ``head_dim_in_config``: the config carries ``head_dim`` and ``num_key_value_heads``, so fewer heads of the same
    size is a standard architecture (plain export of pruned models, native GQA export); ``kv_conversion``: decoder
    self-attention with separate q/k/v projections (``convert_gqa`` / ``convert_latent``); ``cache_policy``: a
    decoder-only model whose cache is one transformers cache layer per decoder layer (per-head KV policies);
    ``attention_form``: which computation the attention module runs, named after the first family that ran it
    (``"bert"``, ``"albert"``, ``"distilbert"``, ``"vit"``, ``"gpt2"``, ``"bart"``, ``"t5"``, ``"llama"``; None:
    its own). Methods that re-implement a module's forward (collaborative heads) keep one forward per form, so a
    new family whose module computes like a known one names that form and needs no method change.
    """

    head_counts: tuple[str, ...] = ("num_attention_heads", "num_heads", "n_heads")
    head_sizes: tuple[str, ...] = ("all_head_size", "split_size")
    query: str | None = None
    key: str | None = None
    fused_qkv: str | None = None
    position_bias: bool = False
    head_dim_in_config: bool = False
    kv_conversion: bool = False
    cache_policy: bool = False
    attention_form: str | None = None


@dataclass
class AttentionSite:
    """One attention module, seen per head.

    ``module`` is the module transformers passes to the attention function; headwise ops attach to it.
    Sites are identified by module object; ``path`` (its name in the model) is the stable key used in files.
    """

    path: str
    module: nn.Module
    family: str
    kind: Kind
    layers: tuple[int, ...]  # more than one when the module is shared (ALBERT)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    positions: Positions
    causal: bool
    q: HeadProjection
    k: HeadProjection
    v: HeadProjection
    o: HeadProjection
    notes: list[str] = field(default_factory=list)

    @property
    def layer(self) -> int:
        return self.layers[0]

    @property
    def shared(self) -> bool:
        """True when one module serves several layers (its weights and ops are shared by all of them)."""
        return len(self.layers) > 1

    @property
    def name(self) -> str:
        """Short human name: ``kind.layer`` (``enc-self.3``); shared modules show their layer range."""
        if self.shared:
            return f"{self.kind}.{self.layers[0]}-{self.layers[-1]}"
        return f"{self.kind}.{self.layer}"

    @property
    def layout(self) -> FamilyLayout:
        """The family's module layout (head-count attributes, projections), from its adapter's registration."""
        from .registry import family_layout

        return family_layout(self.family)

    @property
    def shares_query_key(self) -> bool:
        """True when the heads share one query/key space (a module that sets ``shares_query_key = True``, such as
        collaborative heads): per-head edits of queries and keys (head removal) do not apply."""
        return bool(getattr(self.module, "shares_query_key", False))

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (1 without GQA)."""
        return self.num_heads // self.num_kv_heads

    def describe(self) -> dict:
        """JSON-ready summary (no tensors)."""
        return {
            "name": self.name,
            "path": self.path,
            "family": self.family,
            "kind": self.kind,
            "layers": list(self.layers),
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_size": self.hidden_size,
            "positions": self.positions,
            "causal": self.causal,
            "notes": list(self.notes),
        }


Adapter = Callable[[nn.Module], list[AttentionSite]]
