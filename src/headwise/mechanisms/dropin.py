"""Drop-in use inside transformers models: a mechanism core attached to attention sites.

The runtime hands the site op the model's own projected (and rotated) ``q, k, v``; the op expands GQA key/value
heads, turns the runtime's ``keep [B|1, 1, Tq, Tk]`` mask into a key padding vector (refusing masks that carry
more structure, e.g. sliding windows) and runs the core. Parameters and buffers of the core live on the site,
so they train, save and reload with the model (``headwise.save_pretrained`` / ``from_pretrained``).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers.integrations.sdpa_attention import repeat_kv

from ..errors import HeadwiseError, renamed
from ..runtime import enable
from ..runtime.ops import HeadOp, attach, attached, detach
from ..sites import AttentionSite, Selection, selection_of
from .base import Mechanism, get_mechanism
from .factory import build_core

SLOT_NAME = "mechanism"


def key_keep(keep: torch.Tensor | None, batch: int, q_len: int, causal: bool) -> torch.Tensor | None:
    """The ``[B, Tk]`` key mask that, with causality, reproduces ``keep`` on every real query row."""
    if keep is None:
        return None
    full = keep[:, 0]  # [B|1, Tq, Tk]
    vec = (full[:, -1] if causal else full.any(1)).expand(batch, -1)
    k_len = vec.shape[1]
    expected = vec[:, None, :].expand(batch, q_len, k_len)
    if causal:
        rows = torch.arange(q_len, device=keep.device)[:, None] + k_len - q_len
        expected = expected & (torch.arange(k_len, device=keep.device)[None] <= rows)
    agree = (expected == full) | ~vec[:, k_len - q_len:, None]  # rows of padded queries do not matter
    if not bool(agree.all()) or (keep.shape[1] > 1 and not bool((keep == keep[:, :1]).all())):
        raise HeadwiseError(
            "this attention mask is more than key padding" + (" and causality" if causal else "")
            + " (e.g. a sliding window or a custom 4D mask); efficient mechanisms cannot express it"
        )
    return vec


class SiteMechanism(HeadOp):
    """The op the runtime calls at a site: ``(module, q, k, v, keep, scaling, dropout, causal) -> [B, Tq, H, d]``.

    Attention dropout is not applied (mechanisms have no probability matrix to drop from).
    """

    op_type = "mechanism"

    def __init__(self, mechanism: str, num_heads: int, head_dim: int, args: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.core: Mechanism = build_core(mechanism, num_heads, head_dim, **(args or {}))

    def spec(self) -> dict[str, Any]:
        return {"mechanism": self.core.name, "num_heads": self.core.num_heads, "head_dim": self.core.head_dim,
                "args": asdict(self.core.config)}

    def forward(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                keep: torch.Tensor | None, scaling: float, dropout: float, causal: bool) -> torch.Tensor:
        groups = q.shape[1] // k.shape[1]
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        self.core.check_causal(causal)
        q_len, k_len = q.shape[2], k.shape[2]
        if keep is None and causal and 1 < q_len < k_len:  # an empty static cache: only the first q_len keys exist
            k, v, k_len = k[:, :, :q_len], v[:, :, :q_len], q_len  # (as SDPA; one query without a mask sees all)
        vec = key_keep(keep, q.shape[0], q_len, causal)
        if q_len != k_len:
            if not causal:
                raise HeadwiseError(f"mechanism {self.core.name!r} supports self-attention only "
                                    f"({q_len} queries, {k_len} keys)")
            if self.core.uses_past_queries():
                raise HeadwiseError(
                    f"mechanism {self.core.name!r} with {self.core.spec()} summarises past queries, which cached "
                    f"generation does not keep; use a key-based option (eva: proposal='key' or 'uniform') or "
                    f"generate with use_cache=False")
            # cached generation: earlier queries are gone; they are stand-ins whose outputs are dropped
            q = F.pad(q, (0, 0, k_len - q_len, 0))
        out = self.core.run(q, k, v, vec, causal, scaling)[:, :, k_len - q_len:]
        return out.transpose(1, 2)


def use(model: nn.Module, name: str, sites: Iterable[AttentionSite | str] | None = None, replace: bool = False,
        kinds: Sequence[str] | None = None, *, selection: Selection | None = None,
          **args: Any) -> dict[str, SiteMechanism]:
    """Run mechanism ``name`` (with ``args``) at every site of ``selection`` (all by default), reusing the
    pretrained q/k/v/o weights (``headwise.replace_attention``). Selects the ``headwise`` implementation. Returns
    ``{site.path: op}``; ``op.core`` is the mechanism. ``sites`` / ``kinds``: the former spellings of the selection
    (deprecated).
    """
    cls = get_mechanism(name)
    chosen = selection_of("replace_attention", selection, sites=sites, kinds=kinds).sites(model)
    for site in chosen:
        if site.kind == "dec-enc":
            raise HeadwiseError(f"{site.name} is cross-attention (queries from the decoder, keys from the encoder); "
                                f"mechanism {name!r} runs in self-attention sites only: select the sites without it")
        if site.positions == "relative":
            raise HeadwiseError(f"{site.name}: {site.family} adds a relative position bias to its attention scores, "
                                f"which mechanism {name!r} cannot add; mechanisms need absolute or rotary positions")
        if site.causal and not cls.can_be_causal:
            cls(site.num_heads, site.head_dim, **args).check_causal(True)
    ops = {s.path: attach(s, "mechanism", SLOT_NAME, SiteMechanism(name, s.num_heads, s.head_dim, args), replace)
           for s in chosen}
    enable(model)
    return ops


apply = renamed(use, "headwise.mechanisms.apply")


def remove(model: nn.Module, sites: Iterable[AttentionSite | str] | None = None, missing_ok: bool = False, *,
           selection: Selection | None = None) -> None:
    """Detach the mechanism from every site of ``selection`` (all by default): softmax attention again
    (``headwise.restore_attention``). Raises when none of them runs a mechanism, unless ``missing_ok``. ``sites``:
    the former spelling of the selection (deprecated)."""
    chosen = selection_of("restore_attention", selection, sites=sites).sites(model)
    if not missing_ok and not any(s.path in mechanisms_of(model) for s in chosen):
        raise HeadwiseError(f"no mechanism is attached to {', '.join(s.name for s in chosen)}; nothing to remove "
                            "(missing_ok=True to allow)")
    for site in chosen:
        detach(site, SLOT_NAME)


def mechanisms_of(model: nn.Module) -> dict[str, SiteMechanism]:
    """The attached mechanism ops, keyed by site path."""
    return attached(model, "mechanism", SLOT_NAME)
