"""Shrink the key/value cache of a trained decoder: grouped-query merging (``convert_gqa``) and low-rank latent
keys/values (``convert_latent``), calibrated to respect the rotary embedding. Math and numbers: docs/kv-cache.md.

The names load on first use (``headwise.lazy``): ``.config`` and ``.declaration`` import without torch.
"""

from typing import TYPE_CHECKING

from ..lazy import attach as _lazy

if TYPE_CHECKING:
    from .budget import kv_cache_bytes, kv_values_per_token
    from .cache import LatentCache, latent_cache
    from .calibration import input_moments
    from .config import GQAConfig, LatentConfig
    from .gqa import convert_gqa
    from .latent import convert_latent
    from .layer import LatentProjection, is_latent
    from .method import GroupedQuery, Latent  # registers the package's methods
    from .rotary import pair_scale

__getattr__, __dir__ = _lazy(__name__, globals())
