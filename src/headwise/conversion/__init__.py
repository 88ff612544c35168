"""Shrink the key/value cache of a trained decoder: grouped-query merging (``convert_gqa``) and low-rank latent
keys/values (``convert_latent``), calibrated to respect the rotary embedding. Math and numbers: docs/kv-cache.md.
"""

from .budget import kv_cache_bytes, kv_values_per_token
from .cache import LatentCache, latent_cache
from .calibration import input_moments
from .config import GQAConfig, LatentConfig
from .gqa import convert_gqa
from .latent import convert_latent
from .layer import LatentProjection, is_latent
from .rotary import pair_scale

from . import method  # noqa: F401,E402  (registers the package's methods with headwise.apply)
__all__ = ["convert_gqa", "convert_latent", "GQAConfig", "LatentConfig", "LatentProjection", "is_latent",
           "LatentCache", "latent_cache",
           "kv_cache_bytes", "kv_values_per_token", "input_moments", "pair_scale"]
