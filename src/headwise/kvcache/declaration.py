"""Per-head KV cache policies as the tools that do not run them see them (``headwise.declaration``)."""

from ..declaration import Declaration, Planned
from .config import KVPolicyConfig

KV_POLICY = Declaration(
    name="kv_policy", config=KVPolicyConfig, doc="docs/kv-policy.md",
    examples=("headwise edit kv_policy --model smollm2-135m --policy '\"smol-kv/policy.json\"' --out smol-kv-model"
              "   # the policy.json of headwise kv-policy",),
    planned=Planned(order=70, label="per-head KV policy"))  # alone: a policy fits one KV-head layout

DECLARATIONS = (KV_POLICY,)
