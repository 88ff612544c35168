"""KV-cache conversion as the tools that do not run it see it (``headwise.declaration``): grouped-query merging
and latent keys/values, which the planner tries (both calibrated)."""

from ..declaration import Declaration, Planned
from .config import GQAConfig, LatentConfig

GQA = Declaration(
    name="gqa", config=GQAConfig, doc="docs/kv-cache.md",
    examples=("headwise edit gqa --model smollm2-135m --kv-heads 1 --gqa-init mean --out smol-gqa1",),
    planned=Planned(order=20, role="pair", calibrated=True, label="merge KV heads",
                    former=("kv_heads",)))  # its name in plan format 1
LATENT = Declaration(
    name="latent", config=LatentConfig, doc="docs/kv-cache.md",
    examples=("headwise edit latent --model smollm2-135m --kv-budget 0.5 --latent-init svd --out smol-latent",),
    planned=Planned(order=25, role="pair", calibrated=True, label="latent keys/values"))

DECLARATIONS = (GQA, LATENT)
