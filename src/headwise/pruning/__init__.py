"""Head pruning. So far: physical removal (``prune_heads``) that reloads through ``headwise.from_pretrained``."""

from .surgery import prune_heads

__all__ = ["prune_heads"]
