"""Efficient attention mechanisms: one registry, standalone modules and drop-in replacements in transformers models.

- ``build_attention(name, dim=..., num_heads=..., causal=False, **args)``: a self-attention ``nn.Module``;
- ``add_args(parser, name, prefix=...)`` + ``NestedNamespace``: the mechanism's arguments on the command line;
- ``list_mechanisms()``: names, arguments, complexity and causal support;
- ``use(model, name, **args)`` (formerly ``apply``): the mechanism at every (or selected) attention site of a transformers model;
- ``build_core(name, num_heads, head_dim, **args)``: the core on projected ``q, k, v [B, H, T, d]``.

The names load on first use (``headwise.lazy``): ``.config`` and ``.declaration`` import without torch.
"""

from typing import TYPE_CHECKING

from ..lazy import attach as _lazy

if TYPE_CHECKING:
    from . import (cosformer, eva, eva_paper, lara, linear, local, local2d, nystrom, performer, ra, rfa,
                   scatterbrain, softmax)
    from .base import MECHANISMS, Mechanism, MechanismConfig, register
    from .config import ReplaceConfig
    from .dropin import SiteMechanism, apply, mechanisms_of, remove, use
    from .factory import NestedNamespace, add_args, build_attention, build_core, list_mechanisms, mechanism_args
    from .method import Replace  # registers the method
    from .module import DecodingCache, EfficientAttention

__getattr__, __dir__ = _lazy(__name__, globals())
